"""The host-path benchmark (`bench/host_path.py`): its in-process stages answer as the engine does and time every
stage; its workloads never repeat a request; its per-process CPU accounting and the node arithmetic
(`bench/host_capacity.py`); the whole script at a tiny size through a local Ray Serve."""

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


def test_workload_rounds_and_load_never_repeat_a_request_and_load_enough_documents():
    work = workload(np.random.default_rng(0), docs=4, requests=3, per_query=2, rounds=2, clients=2, load_docs=50)
    assert [len(r) for r in work.rounds] == [3, 3] and len(work.load) >= 4
    assert sum(len(r["documents"]) for r in work.load) >= 50  # each process's CPU read over seconds
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


def test_the_node_sustains_the_least_of_its_cores_and_its_one_core_processes():
    from host_capacity import FORWARD_THREADS, INDEX_BUILDER, OTHER_THREADS, PROXY, Cost, capacity

    costs = {FORWARD_THREADS: Cost(5000.0, 0.0), OTHER_THREADS: Cost(10.0, 0.02), PROXY: Cost(100.0, 0.5),
             INDEX_BUILDER: Cost(20.0, 0.01), "ray::ServeReplica:radixserve:Ingress": Cost(300.0, 0.02),
             "raylet": Cost(5.0, 0.45)}
    node = capacity(costs, feeder_ms=30.0, cores=8)
    assert node.host_ms == pytest.approx(465.0)  # the forward's threads left out, the feeder's stages in
    assert node.idle_cores == pytest.approx(1.0)
    assert node.docs_s == pytest.approx(0.5 * 1e6 / 100.0) and "proxy" in node.bound  # its idle half left
    small = capacity(costs, feeder_ms=30.0, cores=2)
    assert small.docs_s == pytest.approx((2 - 1.0) * 1e6 / 465.0) and "2 cores" in small.bound
    replica = capacity({**costs, OTHER_THREADS: Cost(200.0, 0.02), PROXY: Cost(100.0, 0.0)}, feeder_ms=30.0,
                       cores=64)
    assert replica.docs_s == pytest.approx(0.98 * 1e6 / 230.0) and "engine replica" in replica.bound


@pytest.mark.parametrize("topology", ["split", "combined"])
def test_load_cpu_counts_each_tagged_process_and_splits_the_engine_replica_by_thread(topology):
    """A process titled as the engine replica (the ingress under `combined`), idle while its idle share is read, then
    burns ~0.4 s of CPU in one thread and ~0.1 s in another: with one torch thread the first is its forward, the
    second its other threads; an untagged process is not counted."""
    import subprocess
    import uuid

    from host_capacity import ENGINE, FORWARD_THREADS, INGRESS, OTHER_THREADS, LoadCpu
    from peer_vllm_processes import TAG_ENV, process_name

    tag, title = uuid.uuid4().hex, ENGINE if topology == "split" else INGRESS
    burn = ("import sys, threading, time\n"
            "end = threading.Event()\n"
            "def spin(s, spun):\n    until = time.process_time() + s\n    while time.process_time() < until: pass\n"
            "    spun.set(); end.wait()\n"  # a thread that ended leaves /proc/PID/task with its CPU time
            "print('ready', flush=True)\nsys.stdin.readline()\n"
            "for s in (0.4, 0.1):\n"  # one spinner at a time: the process's CPU clock is each one's own
            "    spun = threading.Event(); threading.Thread(target=spin, args=(s, spun)).start(); spun.wait()\n"
            "print('done', flush=True)\nsys.stdin.readline()\nend.set()\n")
    env = {**os.environ, TAG_ENV: tag}
    with subprocess.Popen(["bash", "-c", f'exec -a "{title}" {sys.executable} -c "$0"', burn], env=env,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as engine, \
            subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True) as untagged:
        assert engine.stdout.readline() == "ready\n" and untagged.stdout.readline() == "ready\n"
        assert process_name(engine.pid) == title  # bash exec'd the titled interpreter, now waiting on its stdin
        cpu = LoadCpu(tag, idle_s=0.3, engine=title)
        for process in (engine, untagged):
            process.stdin.write("go\n")
            process.stdin.flush()
        assert engine.stdout.readline() == "done\n" and untagged.stdout.readline() == "done\n"
        spent = cpu.per_1000(1000, torch_threads=1)  # ms per 1,000 documents = ms here
        for process in (engine, untagged):
            process.stdin.write("end\n")
            process.stdin.flush()
    assert 350 <= spent[FORWARD_THREADS].ms <= 600 and 80 <= spent[OTHER_THREADS].ms <= 250
    assert spent[FORWARD_THREADS].idle < 0.05 and spent[OTHER_THREADS].idle < 0.05  # waiting on its stdin
    assert set(spent) == {FORWARD_THREADS, OTHER_THREADS}
