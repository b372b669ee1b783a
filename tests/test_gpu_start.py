"""The first GPU start, on the CPU (issue 25).

* The engine runs every attention variant once before a replica reports ready (`Engine.warm_up` from
  `EngineReplica.__init__`), counted through a stand-in backend by what flash-attn 4 compiles separately: the
  call (causal, prefix), more than 256 blocks (its scheduler's batch-lookup aid), a block past every query tile.
* A flash-attn kernel that fails at its first call falls back to the Triton kernels under attention="auto";
  the engine's health probe may take longer than a compile holds the GIL.
* bench/gpu_check.py's new batches (more than 256 blocks, `mlp` mode) pass through the Triton interpreter at a
  small size, and its CPU float64 reference takes every engine batch; the script imports this checkout without
  an install; bench/gpu_run.sh's logic runs (--stash, --dry-run, and a real run without a GPU).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from deployments.config import AppArgs
from radix_core.attention import AttentionBackend, TorchAttention, TritonAttention
from radix_core.engine import WARM_UP_LONG, Engine
from radix_core.engine_config import EngineConfig
from radix_core.tiny_models import make_tiny_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

CALLS = ("causal", "prefix")
VARIANTS = {(call, many, long) for call in CALLS for many in (False, True) for long in (False, True)}


class CountingBackend(TorchAttention):
    """The torch backend (under any name), recording each call's variant: (call, > 256 blocks, a long block)."""

    def __init__(self, name: str = "torch"):
        self.name = name
        self.variants: list[tuple[str, bool, bool]] = []

    def attend(self, q, k, v, meta, scale):
        blocks = meta.causal
        self.variants.append(("causal", blocks.cu_seqlens.shape[0] - 1 > 256, blocks.max_seqlen >= WARM_UP_LONG))
        if meta.prefix is not None:
            self._count_prefix(meta.prefix)
        return super().attend(q, k, v, meta, scale)

    def prefix_blocks(self, q, k, v, blocks, scale):
        self._count_prefix(blocks)
        return super().prefix_blocks(q, k, v, blocks, scale)

    def _count_prefix(self, blocks):
        self.variants.append(("prefix", blocks.key_start.shape[0] > 256, blocks.max_seqlen_q >= WARM_UP_LONG))


class FailingFlash(AttentionBackend):
    """flash-attn 4 whose kernels do not compile here."""

    name = "flash"

    def causal_blocks(self, q, k, v, blocks, scale):
        raise RuntimeError("cute.compile: ptxas fatal: unsupported GPU architecture")


@pytest.mark.parametrize("radix, calls", [("auto", CALLS), ("full", CALLS), ("off", ("causal",)),
                                          ("mlp", ("causal",))])
def test_warm_up_runs_every_variant_of_each_call_the_engine_makes(tiny_model_dir, radix, calls):
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", radix=radix,
                                    prefix_cache_bytes=0)  # its hits make prefix calls in every mode
    engine.backend = backend = CountingBackend()
    assert engine.warm_up() < 30
    assert set(backend.variants) == {variant for variant in VARIANTS if variant[0] in calls}


def test_replica_warms_up_before_it_reports_ready(tiny_model_dir, monkeypatch):
    """Serve marks a replica ready when its constructor returns: by then every variant ran."""
    from deployments import engine_replica

    backend = CountingBackend()
    monkeypatch.setattr("radix_core.engine.make_backend", lambda name, device, dtype: backend)
    monkeypatch.setattr(engine_replica, "cpu_threads", torch.get_num_threads)  # no Ray worker here
    args = AppArgs(model=str(tiny_model_dir("qwen3", "base")), batching={"index_builder": "inline"})
    replica = engine_replica.EngineReplica.func_or_class(args, EngineConfig(device="cpu"))
    assert replica.engine.backend is backend and set(backend.variants) == VARIANTS


def test_engine_replicas_get_a_health_timeout_that_outlasts_a_compile():
    """Ray's default probe timeout is 30 s; the engine's default survives about 3 minutes of a compile holding the
    GIL (3 failed probes in a row replace a replica) and reaches the deployment."""
    from ray.serve._private.constants import DEFAULT_HEALTH_CHECK_TIMEOUT_S

    from deployments.engine_replica import EngineReplica

    from deployments.placement import ClusterShape, engine_options

    deployment = EngineReplica.options(**engine_options(AppArgs(model="m"), ClusterShape(gpus=1, node_cpus=8)))
    assert deployment._deployment_config.health_check_timeout_s == 60 > DEFAULT_HEALTH_CHECK_TIMEOUT_S


def test_a_flash_kernel_that_fails_falls_back_to_triton_once(tiny_model_dir, monkeypatch, caplog):
    triton = CountingBackend("triton")  # the interpreted Triton warm-up takes minutes; the fallback is the point
    monkeypatch.setattr("radix_core.engine.make_backend", lambda name, device, dtype: FailingFlash())
    monkeypatch.setattr("radix_core.attention.TritonAttention", lambda device: triton)
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", attention="auto")
    with caplog.at_level(logging.WARNING, logger="radix_core.attention"):
        engine.warm_up()
    assert engine.backend is triton and engine.info["attention"] == "triton"
    assert set(triton.variants) == VARIANTS
    assert [r.getMessage() for r in caplog.records] == [
        "attention='auto' uses the Triton kernels: flash-attn 4 failed its first call (RuntimeError: cute.compile: "
        "ptxas fatal: unsupported GPU architecture)"]


def test_flash_by_name_or_another_backend_does_not_fall_back(tiny_model_dir, monkeypatch):
    model = str(tiny_model_dir("qwen3", "base"))
    monkeypatch.setattr("radix_core.engine.make_backend", lambda name, device, dtype: FailingFlash())
    with pytest.raises(ValueError, match=r"attention='flash': flash-attn 4 failed its first call \(RuntimeError.*"
                                         r"set attention='auto' to fall back to the Triton kernels"):
        Engine.from_pretrained(model, device="cpu", attention="flash").warm_up()
    broken = CountingBackend()
    broken.attend = FailingFlash().attend  # the torch backend failing in its first call
    monkeypatch.setattr("radix_core.engine.make_backend", lambda name, device, dtype: broken)
    with pytest.raises(RuntimeError, match="ptxas fatal"):
        Engine.from_pretrained(model, device="cpu", attention="auto").warm_up()


@pytest.mark.slow
def test_gpu_check_batch_of_more_than_256_blocks_through_the_triton_interpreter():
    """gpu_check's new kernel batch, at one head of dim 16: the engine's Triton cascade against the path reference."""
    import gpu_check

    (index,) = [index for label, index in gpu_check.kernel_batches().items() if "> 256 blocks" in label]
    meta = gpu_check.full_metadata(index, "cpu")
    assert meta.causal.cu_seqlens.shape[0] - 1 > 256 and meta.prefix.key_start.shape[0] > 256
    torch.manual_seed(0)
    q, k, v = gpu_check.random_qkv(index.num_compact, 1, 1, 16, torch.float32, "cpu")
    got = TritonAttention(q.device)(q, k, v, meta, 16**-0.5)
    error = gpu_check.max_error(got, gpu_check.path_attention_reference(q, k, v, index))
    assert error <= gpu_check.ATTENTION_TOLERANCE[torch.float32]


@pytest.mark.slow
def test_gpu_engine_checks_mlp_mode_on_more_than_256_blocks_through_the_triton_interpreter(tmp_path):
    """gpu_engine_checks' new mode and batch, on a one-layer, one-head model: Triton `mlp` equals float64 torch."""
    import gpu_engine_checks as checks

    assert "mlp" in checks.MODES
    model = str(make_tiny_model(tmp_path / "one-head", "qwen3", "base", hidden_size=16, num_layers=1, num_heads=1,
                                num_kv_heads=1, intermediate_size=32, head_dim=16))
    reference = Engine.from_pretrained(model, device="cpu", dtype=torch.float64, radix="off", attention="torch")
    batch = checks.hidden_batches(reference.arch.vocab_size)["> 256 blocks"]
    assert len(batch) > 256
    engine = Engine.from_pretrained(model, device="cpu", radix="mlp", attention="triton")
    got, expected = torch.cat(engine.hidden_states(batch)), torch.cat(reference.hidden_states(batch))
    assert checks._relative(got, expected) <= checks.ENGINE_TOLERANCE[torch.float32]


def test_gpu_engine_checks_float64_reference_takes_every_batch(tiny_model_dir):
    """The CPU float64 engine every engine check compares with: equal-length sequences apart from each other
    (gathered rows, not a slice) gave the torch backend a float64 log-sum-exp to store in float32."""
    import gpu_engine_checks as checks

    reference = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", dtype=torch.float64,
                                       radix="off", attention="torch")
    for sequences in checks.hidden_batches(reference.arch.vocab_size).values():
        assert [s.shape[0] for s in reference.hidden_states(sequences)] == [len(s) for s in sequences]


@pytest.mark.slow
def test_gpu_check_runs_from_the_root_without_an_install():
    """No site processing, so no editable install: radix_core comes from the path the script inserts."""
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    done = subprocess.run([sys.executable, "-S", "bench/gpu_check.py", "--sections", "kernels", "--attention",
                           "triton"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr  # 2: no CUDA here, after every import and the arguments
    assert "no CUDA device here" in done.stdout


def test_gpu_run_dry_run_plans_every_part_and_joins_split_wheels(tmp_path):
    """Two calls, as on a warm lent machine: the first stashes one half of a split wheel with its checksum, the
    second brings the other half, joins and checks them, and plans flash-attn 4's install and parts too."""
    wheel = "flash_attn_4-4.0.0b36-py3-none-any.whl"
    content = os.urandom(3000)
    first, second = tmp_path / "call1", tmp_path / "call2"
    for call, part, data in ((first, "aa", content[:2000]), (second, "ab", content[2000:])):
        call.mkdir()
        (call / f"{wheel}.part-{part}").write_bytes(data)
    (first / f"{wheel}.sha256").write_text(f"{hashlib.sha256(content).hexdigest()}  {wheel}\n")
    env = {**os.environ, "PYTHON": sys.executable, "STASH_DIR": str(tmp_path / "stash"), "OUT": str(tmp_path / "out")}
    run = lambda *args, wheels: subprocess.run(  # noqa: E731
        ["bash", "bench/gpu_run.sh", *args], cwd=ROOT, env={**env, "WHEELS": str(wheels)}, capture_output=True,
        text=True, timeout=120)
    stashed = run("--stash", wheels=first)
    assert stashed.returncode == 0, stashed.stderr
    done = run("--dry-run", wheels=second)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "stash" / wheel).read_bytes() == content
    summary = (tmp_path / "out" / "gpu_run.md").read_text()
    parts = [line.split("`")[1] for line in summary.splitlines() if line.startswith("| ") and "`" in line]
    assert parts == ["warmup-cold", "warmup-cached", "kernels", "engine", "hybrid", "flash", "timings"], summary
    assert "would install:" in summary and "--attention torch triton flash" in summary
    assert "dry run" in summary and "arguments of every part parse" in summary


@pytest.mark.slow
def test_gpu_run_without_a_gpu_records_each_part_and_keeps_to_its_budget(tmp_path):
    """The real run on the CPU: each part is one gpu_check process (exit 2, no CUDA) until the budget is spent."""
    env = {**os.environ, "PYTHON": sys.executable, "STASH_DIR": str(tmp_path / "stash"), "OUT": str(tmp_path),
           "WHEELS": str(tmp_path / "none"), "CACHE": str(tmp_path / "cache"), "BUDGET_S": "20"}
    done = subprocess.run(["bash", "bench/gpu_run.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = [line for line in (tmp_path / "gpu_run.md").read_text().splitlines() if line.startswith("| `")]
    results = [row.split(" | ")[1] for row in rows]
    assert len(rows) == 6 and set(results) <= {"exit 2", "not run: the budget of 20 s is spent"}, rows
    assert results[-1].startswith("not run")
