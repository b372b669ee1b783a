"""The GPU check's engine sections: the engine and every task head on CUDA against a CPU float64 engine, and the
engine's warm-up.

Models are tiny random-weight Qwen3 checkpoints from `radix_core.tiny_models` with the head size of real ones
(head_dim 128, 4 query heads over 2 kv heads, so grouped-query attention with Qwen3-0.6B's ratio of 2), one per
head: `causal_lm` (rerank by the yes/no logits, classify, score, embed) and `seq_cls` (rerank by the score head).
Each dtype (fp32, bf16, fp16) runs with each attention backend it allows and the run asked for, in `off`, `mlp`
and `full` mode, over batches with exact duplicates and prefixes, the `[[7], [7]]` case included (sequences that
add no queries), and a batch of more than 256 blocks (flash-attn 4's other scheduler).
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gpu_report import CHECK_COLUMNS, TIMING_COLUMNS, Check, Report

from radix_core.engine import Engine, many_blocks_batch
from radix_core.tiny_models import make_tiny_model

ENGINE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}  # error / max abs reference
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MODES = ("off", "mlp", "full")
MODEL = dict(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512, head_dim=128)
QUERY = "which animal guards the radix tree"
DOCUMENTS = ["A trie stores strings by their prefixes.", "Bread rises when yeast ferments.",
             "A trie stores strings by their prefixes.", "Radix trees merge single-child nodes.", "Cats sleep."]
INPUTS = ["the movie was wonderful", "the movie was dull", "the movie was wonderful", "a fine day"]
LABELS = ["positive", "negative", "neutral"]
CONTEXT = "The capital of France is"
CONTINUATIONS = [" Paris", " Lyon", " Paris", " a city in Europe"]


def backends(dtype: torch.dtype, capability: tuple[int, int], attentions) -> list[tuple[str, bool]]:
    """(attention, supported here) for `dtype`, of the `attentions` asked for: flash-attn 4 runs half precision
    on compute capability >= 8."""
    allowed = [("torch", True), ("triton", True)]
    if dtype != torch.float32:
        allowed.insert(1, ("flash", capability >= (8, 0)))
    return [(attention, supported) for attention, supported in allowed if attention in attentions]


def task_calls(head: str) -> dict[str, Callable[[Engine], np.ndarray]]:
    """Per task of `head`: the call that gives its numbers for the fixed requests, float64, in request order."""
    if head == "seq_cls":
        return {"rerank (score head)": rerank}
    return {
        "rerank (yes/no logits)": rerank,
        "embed": lambda e: e.embed(DOCUMENTS).embeddings.astype(np.float64),
        "classify": lambda e: e.classify(INPUTS, LABELS, prefix="Review sentiment: ").probabilities,
        "score": lambda e: _by_index([(s.index, s.logprob) for s in e.score(CONTEXT, CONTINUATIONS).scores]),
    }


def rerank(engine: Engine) -> np.ndarray:
    return _by_index([(h.index, h.score) for h in engine.rerank(QUERY, DOCUMENTS, raw_scores=True).results])


def _by_index(pairs: list[tuple[int, float]]) -> np.ndarray:
    return np.array([value for _, value in sorted(pairs)], dtype=np.float64)  # (n,)


def hidden_batches(vocab_size: int) -> dict[str, list[list[int]]]:
    """A reranking-like batch (shared template, two queries, passages, an exact duplicate), item 3's case,
    duplicates of prefixes, and more than 256 blocks in every mode (`many_blocks_batch`)."""
    rng = np.random.default_rng(2)
    draw = lambda n: rng.integers(0, vocab_size, n).tolist()  # noqa: E731
    template, queries = draw(40), [draw(12), draw(9)]
    sequences = [template + queries[i % 2] + draw(int(rng.integers(5, 60))) for i in range(8)]
    return {"9 seqs, shared prefixes + duplicate": sequences + [list(sequences[3])],
            "[[7], [7]] (duplicate, one query)": [[7], [7]],
            "duplicates + prefixes": [template[:20], template, template[:20], template, template[:1]],
            "> 256 blocks": many_blocks_batch()}


def engine_checks(report: Report, attentions) -> None:
    """Hidden states of each dtype x backend x mode against the float64 CPU engine, on the head_dim 128 model."""
    report.section("Engine against a CPU float64 engine (error relative to max abs value)", CHECK_COLUMNS)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "base", "qwen3", "base", **MODEL))
        _hidden_state_checks(report, model_dir, "engine", "D=128, 4/2 heads", DTYPES, attentions)


def _hidden_state_checks(report: Report, model_dir: str, label: str, detail: str, dtypes, attentions) -> None:
    """`model_dir`'s hidden states on CUDA, each of `dtypes` x backend x mode, against its CPU float64 engine."""
    capability = torch.cuda.get_device_capability()
    reference = Engine.from_pretrained(model_dir, device="cpu", dtype=torch.float64, radix="off", attention="torch",
                                       prefix_cache_bytes=0)
    batches = hidden_batches(reference.arch.vocab_size)
    expected = {name: torch.cat(reference.hidden_states(seqs)) for name, seqs in batches.items()}  # (N, hidden)
    for dtype in dtypes:
        for attention, supported in backends(dtype, capability, attentions):
            for mode in MODES:
                engine = _engine(report, model_dir, dtype, attention, mode, supported)
                for name, seqs in batches.items():
                    if engine is not None:
                        report.guarded(f"{label} attention={attention} mode={mode}", f"{detail}, {name}",
                                       _name(dtype), ENGINE_TOLERANCE[dtype],
                                       lambda: _relative(torch.cat(engine.hidden_states(seqs)), expected[name]))


def task_checks(report: Report, attentions) -> None:
    """Every task head on CUDA (each dtype x backend, `full` mode) against the float64 CPU engine."""
    report.section("Task heads against a CPU float64 engine (error relative to max abs value)", CHECK_COLUMNS)
    capability = torch.cuda.get_device_capability()
    with tempfile.TemporaryDirectory() as tmp:
        for head in ("causal_lm", "seq_cls"):
            model_dir = str(make_tiny_model(Path(tmp) / head, "qwen3", head, **MODEL))
            reference = Engine.from_pretrained(model_dir, device="cpu", dtype=torch.float64, radix="off",
                                               attention="torch")
            expected = {task: want for task, call in task_calls(head).items()
                        if (want := _reference(report, task, call, reference)) is not None}
            for dtype in DTYPES:
                for attention, supported in backends(dtype, capability, attentions):
                    engine = _engine(report, model_dir, dtype, attention, "full", supported)
                    for task, want in expected.items():
                        if engine is not None:
                            call = task_calls(head)[task]
                            report.guarded(f"task {task} attention={attention}", f"{head}, D=128, duplicates",
                                           _name(dtype), ENGINE_TOLERANCE[dtype],
                                           lambda: _relative_np(call(engine), want))


def warmup_timings(report: Report, attentions) -> None:
    """`Engine.warm_up` on CUDA in bf16, radix auto, per compiling backend asked for: the seconds a replica spends
    before it reports ready. The model has Qwen3-0.6B's attention shape for flash-attn 4 (head_dim 128, 2 query
    heads per kv head), so it compiles the kernels a Qwen3-Reranker-0.6B replica compiles. A cold figure needs a
    fresh process and empty caches; run again, it reads the persistent caches (bench/gpu_run.sh does both). For
    flash-attn, then a check that the engine section's batches compile nothing more."""
    report.section("Engine.warm_up: every kernel variant compiled before serving", TIMING_COLUMNS)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "base", "qwen3", "base", **MODEL))
        for attention in (a for a in ("triton", "flash") if a in attentions):
            warmed: dict[str, Engine] = {}
            report.timed(f"Engine.warm_up attention={attention}", "bf16, radix auto, D=128, 4/2 heads",
                         lambda: _warm_up_ms(model_dir, attention, warmed))
            if attention == "flash" and warmed:
                report.guarded("flash-attn 4 kernels compiled after Engine.warm_up", "the engine section's "
                               "batches, radix auto", "bf16", 0.0, lambda: _compiles_after(warmed["engine"]))


def _warm_up_ms(model_dir: str, attention: str, warmed: dict[str, Engine]) -> tuple[float, str]:
    cached = _cached_files()
    engine = Engine.from_pretrained(model_dir, device="cuda", dtype=torch.bfloat16, attention=attention)
    seconds = engine.warm_up()
    warmed["engine"] = engine
    return seconds * 1e3, f"{seconds:.1f} s, ran {engine.backend.name}; files in the compile caches before: {cached}"


def _compiles_after(engine: Engine) -> float:
    """How many kernels flash-attn 4 compiles (or loads) for the engine section's batches after the warm-up: its
    forward's and its scheduler helpers' in-memory caches (`flash_attn.cute.interface`), counted around them."""
    from flash_attn.cute import interface

    caches = [f.compile_cache.cache for f in (interface._flash_attn_fwd, interface._compute_tile_cumsum,
                                              interface._compute_blocks_to_batch)]
    before = sum(map(len, caches))
    for sequences in hidden_batches(engine.arch.vocab_size).values():
        engine.hidden_states(sequences)
    return float(sum(map(len, caches)) - before)


def _cached_files() -> str:
    """Files in Triton's and (when enabled) flash-attn 4's persistent compile caches: 0 before a cold start."""
    dirs = {"triton": os.environ.get("TRITON_CACHE_DIR", str(Path.home() / ".triton" / "cache"))}
    if os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") == "1":
        default = Path(tempfile.gettempdir()) / getpass.getuser() / "flash_attention_cute_dsl_cache"
        dirs["flash-attn"] = os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(default))
    return ", ".join(f"{name} {sum(len(files) for *_, files in os.walk(path))}" for name, path in dirs.items())


def _reference(report: Report, task: str, call, reference: Engine) -> np.ndarray | None:
    """The float64 CPU result, or None after recording the task's failure."""
    try:
        return call(reference)
    except Exception as err:
        report.check(Check(f"task {task}", "CPU float64 reference", "fp64", None, 0.0,
                           f"{type(err).__name__}: {str(err)[:100]}"))
        return None


def _engine(report: Report, model_dir: str, dtype, attention: str, mode: str, supported: bool) -> Engine | None:
    """The CUDA engine, or None after recording why it could not be built."""
    try:
        return Engine.from_pretrained(model_dir, device="cuda", dtype=dtype, attention=attention, radix=mode)
    except Exception as err:
        report.check(Check(f"engine attention={attention} mode={mode}", "load", _name(dtype), None,
                           ENGINE_TOLERANCE[dtype], f"{type(err).__name__}: {str(err)[:100]}", supported))
        return None


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got - expected| / max |expected|, in float64 on the CPU."""
    return ((got.cpu().double() - expected).abs().max() / expected.abs().max()).item()


def _relative_np(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, dtype=np.float64) - expected).max() / max(np.abs(expected).max(), 1e-12))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("float", "fp").replace("bfp", "bf")


def invariance_checks(report: Report, attentions) -> None:
    """Batch-invariant mode on CUDA (issue 32): a target sequence's final hidden states alone (`off`, no cache)
    against the same sequence inside other batches, in every mode, with the prefix cache cold and holding its
    prompt: the error is the number of elements whose bits differ (tolerance 0); then alone against the CPU float64
    engine. The default engine's count on the same batches is noted (how much the mode changes), not checked."""
    report.section("Batch-invariant mode: a sequence's bits in any batch (error: elements that differ)", CHECK_COLUMNS)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "base", "qwen3", "base", **MODEL))
        reference = Engine.from_pretrained(model_dir, device="cpu", dtype=torch.float64, radix="off",
                                           attention="torch")
        rng = np.random.default_rng(5)
        prompt = rng.integers(0, reference.arch.vocab_size, 150).tolist()
        target = prompt + rng.integers(0, reference.arch.vocab_size, 70).tolist()
        others = [prompt + rng.integers(0, reference.arch.vocab_size, n).tolist() for n in (9, 130, 40)]
        batches = {"alone": [target], "3 sharing its prompt": others + [target],
                   "after 300 blocks": many_blocks_batch(150) + [target]}
        expected = reference.hidden_states([target])[0]
        for dtype in (torch.float32, torch.bfloat16):
            engine = Engine.from_pretrained(model_dir, device="cuda", dtype=dtype, batch_invariant=True)
            default = Engine.from_pretrained(model_dir, device="cuda", dtype=dtype, attention="auto")
            alone = engine.hidden_states([target], mode="off")[0]
            report.guarded("batch_invariant alone vs CPU float64", "D=128, 4/2 heads", _name(dtype),
                           ENGINE_TOLERANCE[dtype], lambda: _relative(alone, expected))
            for name, seqs in batches.items():
                for mode in MODES:
                    for cached in (False, True):
                        note = _differing(default, seqs, mode, cached, default.hidden_states([target], mode="off")[0])
                        report.guarded(f"batch_invariant mode={mode} cache={'warm' if cached else 'cold'}",
                                       f"{name}; default engine: {note:.0f} differ", _name(dtype), 0.0,
                                       lambda: _differing(engine, seqs, mode, cached, alone))


def _differing(engine: Engine, seqs: list[list[int]], mode: str, cached: bool, alone: torch.Tensor) -> float:
    """Elements of the last sequence's final hidden states whose bits differ from `alone`; with `cached`, after two
    batches that put its prompt in the prefix cache."""
    if engine.prefix_cache is not None:
        engine.prefix_cache.clear()
        if cached:
            for _ in range(2):
                engine.hidden_states([seqs[-1][:150] + [1], seqs[-1][:150] + [2]], mode=mode)
    got = engine.hidden_states(seqs, mode=mode)[-1]
    return float((got.view(torch.int16 if got.element_size() == 2 else torch.int32)
                  != alone.view(torch.int16 if alone.element_size() == 2 else torch.int32)).sum().item())


def hybrid_checks(report: Report, attentions) -> None:
    """A tiny Qwen3.5 (Gated DeltaNet + gated attention, 3:1) on CUDA in each dtype x backend x mode against the CPU
    float64 engine, on the same batches as the engine section. With `flash-linear-attention` installed (the `gpu`
    extra) the recurrence runs its chunked Triton kernel (transformers' `torch_chunk_gated_delta_rule` dispatches to
    `fla`'s `chunk_gated_delta_rule`, with each chain's `initial_state`); without, the torch reference rule."""
    rule = "fla chunked kernel" if importlib.util.find_spec("fla") is not None else "torch reference rule"
    report.section(f"Hybrid model (qwen3_5, {rule}) against a CPU float64 engine (error relative to max abs value)",
                   CHECK_COLUMNS)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "hybrid", "qwen3_5", "base"))
        _hidden_state_checks(report, model_dir, "hybrid", "qwen3_5 3:1", (torch.float32, torch.bfloat16), attentions)
