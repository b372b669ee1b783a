"""Where the engine replica builds a batch's index: on its compute thread while the device is idle (nothing runs for
the IndexBuilder actor's build to overlap, so the actor's call would only add latency), in the actor while a batch
runs. Driven through the real `TokenBudgetBatcher` and `ComputeThread`; the builder and the forward are stand-ins
that record where and when they ran."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from deployments import engine_replica
from deployments.batcher import TokenBudgetBatcher
from deployments.compute_thread import ComputeThread

FORWARD_S = 0.3  # long enough for a second request to arrive while the first batch runs


class Builder:
    """The IndexBuilder actor's `build.remote`, recording the batches it built."""

    def __init__(self):
        self.built: list[list[str]] = []
        self.build = SimpleNamespace(remote=self._build)

    async def _build(self, jobs):
        self.built.append(list(jobs))
        return ("actor", list(jobs))


@pytest.fixture
def replica(monkeypatch):
    """An `EngineReplica` with its batching methods, a compute thread and a recording builder and engine."""
    inline: list[tuple[list[str], int]] = []  # (jobs, thread) of each build on the compute thread

    def build_batch(limits, radix, jobs):
        inline.append((list(jobs), threading.get_ident()))
        return ("inline", list(jobs))

    monkeypatch.setattr(engine_replica, "build_batch", build_batch)

    def run_jobs(jobs, prepared, scopes):
        time.sleep(FORWARD_S)
        return [(prepared[0], job) for job in jobs]

    replica = object.__new__(engine_replica.EngineReplica.func_or_class)
    replica.engine = SimpleNamespace(limits=None, radix=None, run_jobs=run_jobs)
    replica.compute, replica.builder, replica._forwards = ComputeThread(), Builder(), 0
    replica._ran = lambda prepared, results: None
    replica.batcher = TokenBudgetBatcher(replica._run, max_batch_tokens=100, wait_timeout_s=0.0,
                                         prepare=replica._build)
    replica.inline = inline
    return replica


def test_a_batch_formed_on_an_idle_replica_is_built_on_the_compute_thread(replica):
    async def main():
        try:
            return await replica.batcher.submit([("a", None)], [10])
        finally:
            await replica.batcher.close()

    assert asyncio.run(main()) == [("inline", "a")]
    assert replica.builder.built == []
    assert [jobs for jobs, _ in replica.inline] == [["a"]]
    assert replica.inline[0][1] == replica.compute.call(threading.get_ident)
    assert replica._forwards == 0


def test_a_batch_formed_while_one_runs_is_built_by_the_actor(replica):
    async def main():
        try:
            first = asyncio.create_task(replica.batcher.submit([("a", None)], [10]))
            await asyncio.sleep(FORWARD_S / 3)  # the first batch is on the device now
            assert replica._forwards == 1
            second = await replica.batcher.submit([("b", None)], [10])
            return await first, second
        finally:
            await replica.batcher.close()

    assert asyncio.run(main()) == ([("inline", "a")], [("actor", "b")])
    assert replica.builder.built == [["b"]]
    assert [jobs for jobs, _ in replica.inline] == [["a"]]
    assert replica._forwards == 0


def test_a_failed_forward_leaves_the_device_idle(replica):
    def failing(jobs, prepared, scopes):
        raise RuntimeError("out of memory")

    replica.engine.run_jobs = failing

    async def main():
        try:
            with pytest.raises(RuntimeError, match="out of memory"):
                await replica.batcher.submit([("a", None)], [10])
            replica.engine.run_jobs = lambda jobs, prepared, scopes: [(prepared[0], job) for job in jobs]
            return await replica.batcher.submit([("b", None)], [10])
        finally:
            await replica.batcher.close()

    assert asyncio.run(main()) == [("inline", "b")]  # built on the compute thread again: no forward counted as running
    assert replica.builder.built == []
