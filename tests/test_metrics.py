"""Metrics and request ids without a cluster: what the batcher reports to its observer (queue depth at every change,
one `BatchStats` per batch with its request ids, a failed batch logged once naming them), the batcher's loops not
inheriting the first caller's request context, the router's keys-per-replica window and spills, and the request
meter's tokens and codes. The exported values are checked on a live application in tests/test_metrics_serve.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import defaultdict

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve.request_router import PendingRequest

from deployments.batcher import BatchStats, TokenBudgetBatcher
from deployments.engine_request import EngineRequest
from deployments.hash_ring import HashRing
from deployments.metrics import EngineMetrics, IngressMetrics, KeyWindow, count_usage
from radix_core.prefix_cache import PrefixCacheStats
from deployments.router import PrefixAffinityRouter
from radix_core.tasks import Usage
from serving import CallResult

CALLER = contextvars.ContextVar("caller", default=None)


class Recorder:
    """A `BatchObserver` that keeps what it hears."""

    def __init__(self):
        self.queue: list[tuple[int, int]] = []
        self.batches: list[BatchStats] = []

    def queue_changed(self, items: int, tokens: int) -> None:
        self.queue.append((items, tokens))

    def batch_done(self, stats: BatchStats) -> None:
        self.batches.append(stats)


def test_batcher_reports_queue_depth_and_each_batch_with_its_request_ids():
    recorder = Recorder()
    seen_context = []

    async def run(items):
        seen_context.append(CALLER.get())
        return items

    async def main():
        batcher = TokenBudgetBatcher(run, max_batch_tokens=100, wait_timeout_s=0.05, observer=recorder)
        CALLER.set("first caller")
        results = await asyncio.gather(*(batcher.submit([i], [30], prefix_key="k", request_id=f"req-{i % 2}")
                                         for i in range(3)))
        await batcher.close()
        return results

    assert asyncio.run(main()) == [[0], [1], [2]]
    assert recorder.queue[:3] == [(1, 30), (2, 60), (3, 90)]  # at every submit
    assert recorder.queue[3] == (0, 0)  # the batch took all three
    (stats,) = recorder.batches
    assert (stats.num_items, stats.num_tokens, stats.num_keys, stats.ok) == (3, 90, 1, True)
    assert stats.request_ids == ("req-0", "req-1")  # distinct, in batch order
    assert stats.queue_s >= 0.04 and stats.forward_s >= 0  # closed by the timeout, not the budget
    assert seen_context == [None]  # the run loop does not carry the first caller's context


def test_a_failed_batch_is_logged_once_naming_its_requests(caplog):
    recorder = Recorder()

    async def run(items):
        raise RuntimeError("device lost")

    async def main():
        batcher = TokenBudgetBatcher(run, max_batch_tokens=100, wait_timeout_s=0.01, observer=recorder)
        results = await asyncio.gather(batcher.submit(["a"], [10], request_id="slow-1"),
                                       batcher.submit(["b"], [10], request_id="slow-2"), return_exceptions=True)
        await batcher.close()
        return results

    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        results = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) for r in results)
    assert [b.ok for b in recorder.batches] == [False]
    (line,) = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert "device lost" in line and "slow-1, slow-2" in line


def test_key_window_counts_distinct_recent_keys_per_replica():
    window = KeyWindow(size=3)
    assert window.route("a", "r1") == {"r1"}
    window.route("b", "r1")
    assert window.route("a", "r2") == {"r1", "r2"}  # key a moved
    assert dict(window.counts) == {"r1": 1, "r2": 1}
    window.route("c", "r2")
    assert window.route("d", "r2") == {"r1", "r2"}  # b, the oldest, left the window
    assert dict(window.counts) == {"r1": 0, "r2": 3}
    window.forget("r2")
    assert window.counts["r2"] == 0 and window.route("a", "r1") == {"r1"}


def test_router_counts_spills_off_the_first_replica():
    deployment = DeploymentID(name="engine", app_name="radixserve")

    class Replica:
        def __init__(self, name):
            self.replica_id = ReplicaID(name, deployment)
            self.max_ongoing_requests = 10

    async def main():
        router = PrefixAffinityRouter(deployment_id=deployment, handle_source=DeploymentHandleSource.UNKNOWN,
                                      use_replica_queue_len_cache=True)
        router.initialize_state(virtual_nodes=16)
        router.update_replicas([Replica("rep0"), Replica("rep1")])
        owner = HashRing(["rep0", "rep1"], virtual_nodes=16).walk("key")[0]
        other = ({"rep0", "rep1"} - {owner}).pop()
        spills = []
        router.metrics.spills.inc = lambda value=1.0, tags=None: spills.append(value)  # a spy on the counter
        for i, replica in enumerate([owner, other, owner]):
            request = PendingRequest(args=[EngineRequest((), "key", 10)], kwargs={},
                                     metadata=RequestMetadata(request_id=f"r{i}", internal_request_id=f"r{i}"))
            router.on_request_routed(request, ReplicaID(replica, deployment), CallResult())
        assert spills == [1.0]
        assert router.metrics.window.counts[owner] == 1  # the key's last replica holds it
        router.update_replicas([Replica(owner)])  # `other` left: its keys are forgotten
        assert other not in router.metrics.window.counts

    asyncio.run(main())


def test_request_meter_sums_the_tokens_of_its_task_calls():
    metrics = IngressMetrics()

    async def one_call(n):
        count_usage(Usage(input_tokens=10 * n, computed_tokens=4 * n, cached_tokens=5 * n))

    async def main():
        with metrics.request("rerank", "tei_grpc", "id-1") as meter:
            await asyncio.gather(one_call(1), one_call(2))  # task calls of one request, in tasks of their own
            meter.code = "OK"
        count_usage(Usage(1, 1))  # after the request: not its tokens
        return meter

    meter = asyncio.run(main())
    assert (meter.input_tokens, meter.computed_tokens, meter.cached_tokens, meter.code) == (30, 12, 15, "OK")


def test_prefix_cache_counters_grow_by_what_changed_between_batches():
    """The cache's stats are running totals; the exported counters grow by each batch's change (an increment of 0
    is never sent: Ray refuses it), from zero again after the cache was cleared; the gauges are set."""
    metrics = EngineMetrics()
    counted, gauges = defaultdict(list), {}
    for name in ("cache_hits", "cache_lookups", "cache_evictions"):
        getattr(metrics, name).inc = lambda value=1.0, tags=None, name=name: counted[name].append(value)  # spies
    for name in ("cache_bytes", "cache_budget"):
        getattr(metrics, name).set = lambda value, tags=None, name=name: gauges.__setitem__(name, value)
    budget = 1 << 20
    for stats in (PrefixCacheStats(budget),  # the replica's start: gauges only
                  PrefixCacheStats(budget, bytes=4096, lookup_tokens=100, hit_tokens=0),
                  PrefixCacheStats(budget, bytes=8192, lookup_tokens=250, hit_tokens=120, evictions=2),
                  PrefixCacheStats(budget, bytes=0, lookup_tokens=30, hit_tokens=10)):  # after a clear
        metrics.prefix_cache(stats)
    assert counted == {"cache_lookups": [100, 150, 30], "cache_hits": [120, 10], "cache_evictions": [2]}
    assert gauges == {"cache_bytes": 0, "cache_budget": budget}


def test_a_cancelled_request_is_recorded_as_cancelled():
    metrics = IngressMetrics()
    meters = []

    async def main():
        with metrics.request("embed", "grpc", "id-2") as meter:
            meters.append(meter)
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert meters[0].code == "CANCELLED"
