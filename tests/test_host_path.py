"""The host-path benchmark (`bench/host_path.py`): its in-process stages answer as the engine does and time every
stage; its workloads never repeat a request; the whole script at a tiny size through a local Ray Serve."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from host_path import workload  # noqa: E402  (bench/ is not a package)
from host_stages import HostPath, stages  # noqa: E402
from local_serve import free_port  # noqa: E402
from wire import TRANSPORTS  # noqa: E402


def test_workload_rounds_and_load_never_repeat_a_request():
    work = workload(np.random.default_rng(0), docs=4, requests=3, per_query=2, rounds=2, clients=2)
    assert [len(r) for r in work.rounds] == [3, 3] and len(work.load) >= 4
    sent = [(r["query"], tuple(r["documents"])) for r in [*work.rounds[0], *work.rounds[1], *work.load]]
    assert len(set(sent)) == len(sent) and all(len(docs) == 4 for _, docs in sent)
    assert work.round_docs == 12


def test_stages_answer_as_the_engine_and_every_stage_is_timed(tiny_model_dir):
    from deployments.batching_config import BatchingConfig
    from radix_core.engine import Engine

    engine = Engine.from_pretrained(tiny_model_dir("qwen3", "causal_lm"), device="cpu")
    path = HostPath(engine, BatchingConfig(max_batch_tokens=256), max_request_tokens=128)
    request = {"query": "what is a trie", "documents": [f"a trie stores key {i} by its prefixes" for i in range(12)]}
    try:
        served = path.answer(request)  # parts of at most 128 tokens, batches of at most 256
    finally:
        path.close()
    alone = engine.rerank(**request)
    assert [h.index for h in served.results] == [h.index for h in alone.results]
    np.testing.assert_allclose([h.score for h in served.results], [h.score for h in alone.results], atol=1e-5)
    for transport in TRANSPORTS:
        assert all(path.clock.seconds[stage] > 0 for stage in stages(transport.name) if stage != "key + route")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_script_writes_its_table_json_and_plot(tmp_path, workdir):
    """With the address of a cluster that is gone in Ray's temp directory (a `ray start` or a test's `Cluster` killed
    before its shutdown leaves one), the script still starts a Ray of its own rather than waiting on that one."""
    (workdir / "ray").mkdir()
    (workdir / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
    subprocess.run([sys.executable, str(BENCH / "host_path.py"), "--presets", "tiny", "--large", "16", "--small", "4",
                    "--small-requests", "2", "--repeats", "1", "--clients", "1", "--out", str(tmp_path)],
                   check=True, timeout=170, cwd=BENCH.parent, env={**os.environ, "RAY_TMPDIR": str(workdir)})
    result = json.loads((tmp_path / "host_path.json").read_text())["results"]["tiny"]
    assert set(result) == {"16", "4"}
    assert "| tiny | 16 |" in (tmp_path / "host_path.md").read_text() and (tmp_path / "host_path.png").stat().st_size
