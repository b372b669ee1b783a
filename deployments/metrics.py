"""Application metrics: what only radixserve knows, exported by Ray beside its own Serve metrics.

The metrics are `ray.serve.metrics` objects, created inside each replica (the router's inside the ingress replica
that owns it), so Ray adds the `deployment`, `replica` and `application` tags and every node's metrics agent
exports them with Ray's own on its metrics port (Prometheus text). Ray prefixes every application metric with
`ray_` and a counter's name with `_total`: `radixserve_requests` is scraped as `ray_radixserve_requests_total`.
Durations are seconds, with the unit in the name, as TEI (`te_*`) and Ray Serve name theirs.

    ingress replica (IngressMetrics)
      radixserve_requests_total{task, api, code}             client requests by outcome (gRPC status name)
      radixserve_request_duration_seconds{task, api, code}   histogram, transport in to answer out
      radixserve_request_input_tokens_total{task, api}       tokens of answered requests as sent to the model
      radixserve_request_computed_tokens_total{task, api}    tokens computed for them: 1 - computed/input is the
                                                             share deduplication saved
      radixserve_request_cached_tokens_total{task, api}      tokens of them read from the prefix cache
      radixserve_request_stage_seconds{stage}                histogram per task call on the request path: encode
                                                             (thread hand-off, check, template, tokens, split),
                                                             engine (the engine call, Ray's hops included), merge
    router, in the ingress replica (RouterMetrics)
      radixserve_router_keys{engine_replica}                 distinct prefix keys among the last KEY_WINDOW
                                                             keyed requests, by the replica they went to
      radixserve_router_spills_total                         keyed requests not sent to their key's home
                                                             replica (bounded load, or it was full)
      radixserve_router_key_moves_total                      keys moved to even out the replicas' work
    engine replica (EngineMetrics)
      radixserve_batches_total{mode}                         batches run, by the radix mode chosen (off/mlp/full)
      radixserve_batch_compression{mode}                     histogram of N'/N: rows computed over tokens (1 off)
      radixserve_batch_tokens, _items, _prefix_keys          histograms of each batch's size
      radixserve_batch_stage_seconds{stage}                  histogram: queue, build (index), wait (for the
                                                             device), forward; the batcher's `BatchStats`
      radixserve_engine_request_stage_seconds{stage}         histogram per engine call: replica (its submit, from
                                                             arrival to answer): the ingress's engine stage less
                                                             it is what Ray's hops and pickling cost
      radixserve_queue_items, radixserve_queue_tokens        gauges: what waits in the batch queue now
      radixserve_index_builder_restarts_total{reason}        IndexBuilder actors replaced (health, build)
      radixserve_prefix_cache_hit_tokens_total               tokens read from the replica's prefix cache
      radixserve_prefix_cache_lookup_tokens_total            tokens looked up in it (every batch's): hits over
                                                             lookups is the hit ratio
      radixserve_prefix_cache_evictions_total                cached segments evicted to make room
      radixserve_prefix_cache_bytes, _budget_bytes           gauges: K/V held now, and the budget

With `placement.topology: combined` an ingress replica runs its engine replica: the engine's metrics come from it
(tagged `deployment="Ingress"`), and there is no router, so none of the router's.

`api` is the face a request came in by: `grpc` (radixserve.v1), `tei_grpc` (tei.v1), and `http_<dialect>` for
each HTTP dialect (`http_api(dialect.name)`). `code` is a gRPC status name for every api, so one dashboard
query covers all of them. Ray exports a counter only once it has counted something (it refuses an increment of 0),
so a spill or restart counter appears with its first event. Ray exports a histogram's `_count` and buckets exactly
but its `_sum` from bucket midpoints, so means are approximate; quantiles come from the buckets. The stage traces
also keep exact running totals per stage (`StageTrace.totals`), which `info` returns: a benchmark reads them before
and after a run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ray.serve.metrics import Counter, Gauge, Histogram

from deployments.batcher import BATCH_STAGES, BatchStats
from radix_core.prefix_cache import PrefixCacheStats
from radix_core.tasks import Usage

logger = logging.getLogger("ray.serve")

API_GRPC = "grpc"  # radixserve.v1.Scoring
API_TEI_GRPC = "tei_grpc"  # tei.v1
KEY_WINDOW = 4096  # recent distinct prefix keys the router's keys-per-replica gauge counts
REQUEST_STAGES = ("encode", "engine", "merge")  # deployments.request_path's steps, as the ingress times them

REQUEST_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
STAGE_BUCKETS_S = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
COMPRESSION_BUCKETS = [round(0.05 * i, 2) for i in range(1, 21)]  # 0.05 .. 1.0
TOKEN_BUCKETS = [float(2 ** i) for i in range(4, 19)]  # 16 .. 262144
COUNT_BUCKETS = [float(2 ** i) for i in range(0, 12)]  # 1 .. 2048

_CURRENT: ContextVar[RequestMeter | None] = ContextVar("radixserve_request_meter", default=None)


def http_api(dialect: str) -> str:
    """The `api` label of an HTTP dialect's requests (`cohere` -> `http_cohere`)."""
    return f"http_{dialect}"


def name_task(task: str) -> None:
    """Label the request being metered in this context with the task it runs (a transport that learns the task
    only once its route runs, as HTTP does)."""
    meter = _CURRENT.get()
    if meter is not None:
        meter.task = task


def count_usage(usage: Usage) -> None:
    """Add one task call's tokens to the request being metered in this context (none: a DeploymentHandle call)."""
    meter = _CURRENT.get()
    if meter is not None:
        meter.input_tokens += usage.input_tokens
        meter.computed_tokens += usage.computed_tokens
        meter.cached_tokens += usage.cached_tokens


@dataclass
class RequestMeter:
    """One client request while it is answered: its labels, the tokens its task calls used, and its outcome,
    which the transport sets (`code`, a gRPC status name) before the request ends."""

    task: str
    api: str
    request_id: str
    code: str | None = None
    input_tokens: int = 0
    computed_tokens: int = 0
    cached_tokens: int = 0


class StageTrace:
    """Seconds of each stage of a request: a `radixserve_<name>_stage_seconds{stage}` histogram, and exact running
    totals per stage (calls and seconds) for `info`."""

    def __init__(self, name: str, description: str, stages: tuple[str, ...]):
        self.histogram = Histogram(f"radixserve_{name}_stage_seconds", description, boundaries=STAGE_BUCKETS_S,
                                   tag_keys=("stage",))
        self.totals = {stage: {"count": 0, "seconds": 0.0} for stage in stages}

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """Time the block as `stage` (perf_counter), when it ends without raising."""
        started = time.perf_counter()
        yield
        self.observe(stage, time.perf_counter() - started)

    def observe(self, stage: str, seconds: float) -> None:
        total = self.totals[stage]
        total["count"] += 1
        total["seconds"] += seconds
        self.histogram.observe(seconds, tags={"stage": stage})


class IngressMetrics:
    """The ingress replica's request metrics; `request(...)` meters one client request, `stages` times each task
    call's steps on the request path."""

    def __init__(self):
        self.stages = StageTrace("request", "Seconds of each stage of a task call on the request path: encode, "
                                 "engine (the engine call, Ray's hops included), merge.", REQUEST_STAGES)
        labels = ("task", "api", "code")
        self.requests = Counter("radixserve_requests", "Client requests by task, api and gRPC status code.",
                                tag_keys=labels)
        self.duration = Histogram("radixserve_request_duration_seconds",
                                  "Seconds from the transport receiving a request to its answer.",
                                  boundaries=REQUEST_BUCKETS_S, tag_keys=labels)
        self.input_tokens = Counter("radixserve_request_input_tokens",
                                    "Tokens of answered requests as sent to the model.", tag_keys=("task", "api"))
        self.computed_tokens = Counter("radixserve_request_computed_tokens",
                                       "Tokens computed for answered requests after shared prefixes were "
                                       "deduplicated.", tag_keys=("task", "api"))
        self.cached_tokens = Counter("radixserve_request_cached_tokens",
                                     "Tokens of answered requests read from the engine's prefix cache instead of "
                                     "computed.", tag_keys=("task", "api"))

    @contextmanager
    def request(self, task: str, api: str, request_id: str) -> Iterator[RequestMeter]:
        """Meter the request answered inside the block: the task calls it makes count their tokens into it
        (`count_usage`), and it is recorded when the block ends, with the `code` the transport set (CANCELLED when
        the block is cancelled, INTERNAL when it raises)."""
        meter = RequestMeter(task, api, request_id)
        token = _CURRENT.set(meter)
        started = time.perf_counter()
        try:
            yield meter
        except asyncio.CancelledError:
            meter.code = "CANCELLED"
            raise
        except Exception:
            meter.code = "INTERNAL"
            raise
        finally:
            _CURRENT.reset(token)
            self._record(meter, time.perf_counter() - started)

    def _record(self, meter: RequestMeter, duration_s: float) -> None:
        code = meter.code or "UNKNOWN"
        tags = {"task": meter.task, "api": meter.api, "code": code}
        self.requests.inc(1, tags=tags)
        self.duration.observe(duration_s, tags=tags)
        if code == "OK":  # tokens of what was answered: the sum of the usage the client got back
            task_tags = {"task": meter.task, "api": meter.api}
            for counter, tokens in ((self.input_tokens, meter.input_tokens),
                                    (self.computed_tokens, meter.computed_tokens),
                                    (self.cached_tokens, meter.cached_tokens)):
                if tokens > 0:  # Ray refuses an increment of 0 (a request whose rows a batch neighbour computed)
                    counter.inc(tokens, tags=task_tags)
        logger.debug("request %s: %s %s %s in %.3f s, %d input tokens, %d computed, %d cached", meter.request_id,
                     meter.api, meter.task, code, duration_s, meter.input_tokens, meter.computed_tokens,
                     meter.cached_tokens)


class EngineMetrics:
    """The engine replica's batch and queue metrics; the batcher reports to it as its `BatchObserver`."""

    def __init__(self):
        self.requests = StageTrace("engine_request", "Seconds an engine call spent in the replica, from its arrival "
                                   "to its answer.", ("replica",))
        self.batches = Counter("radixserve_batches", "Batches run, by the radix mode chosen.", tag_keys=("mode",))
        self.compression = Histogram("radixserve_batch_compression",
                                     "N'/N per batch: rows computed over tokens (1 when the mode is off).",
                                     boundaries=COMPRESSION_BUCKETS, tag_keys=("mode",))
        self.tokens = Histogram("radixserve_batch_tokens", "Tokens per batch.", boundaries=TOKEN_BUCKETS)
        self.items = Histogram("radixserve_batch_items", "Sub-requests per batch.", boundaries=COUNT_BUCKETS)
        self.keys = Histogram("radixserve_batch_prefix_keys", "Distinct prefix keys per batch.",
                              boundaries=COUNT_BUCKETS)
        self.stages = Histogram("radixserve_batch_stage_seconds",
                                "Seconds of each batch stage: queue (oldest item's wait), build (the radix index), "
                                "wait (for the device), forward.", boundaries=STAGE_BUCKETS_S, tag_keys=("stage",))
        self.queue_items = Gauge("radixserve_queue_items", "Sub-requests waiting in the batch queue.")
        self.queue_tokens = Gauge("radixserve_queue_tokens", "Tokens waiting in the batch queue.")
        self.restarts = Counter("radixserve_index_builder_restarts",
                                "IndexBuilder actors replaced, by why: health (no ping answer) or build (it died "
                                "building a batch).", tag_keys=("reason",))
        self.cache_hits = Counter("radixserve_prefix_cache_hit_tokens",
                                  "Tokens read from the prefix cache instead of computed.")
        self.cache_lookups = Counter("radixserve_prefix_cache_lookup_tokens",
                                     "Tokens looked up in the prefix cache (every token of every batch); hits over "
                                     "lookups is the hit ratio.")
        self.cache_evictions = Counter("radixserve_prefix_cache_evictions",
                                       "Prefix cache segments evicted to make room (least recently used first, "
                                       "those never read back before those read back).")
        self.cache_bytes = Gauge("radixserve_prefix_cache_bytes", "Bytes of K/V the prefix cache holds now.")
        self.cache_budget = Gauge("radixserve_prefix_cache_budget_bytes",
                                  "The prefix cache's budget in bytes (engine.prefix_cache_bytes, resolved).")
        self._cache_seen: PrefixCacheStats | None = None

    def ran(self, mode: str, num_tokens: int, num_compact: int) -> None:
        """One batch run in `mode`: `num_compact` rows computed for `num_tokens` tokens."""
        self.batches.inc(1, tags={"mode": mode})
        self.compression.observe(num_compact / num_tokens, tags={"mode": mode})

    def restarted(self, reason: str) -> None:
        self.restarts.inc(1, tags={"reason": reason})

    def prefix_cache(self, stats: PrefixCacheStats) -> None:
        """The prefix cache now: its counters grow by what changed since the last call (from zero after a clear),
        its gauges are set."""
        seen, self._cache_seen = self._cache_seen, stats
        for counter, field in ((self.cache_hits, "hit_tokens"), (self.cache_lookups, "lookup_tokens"),
                               (self.cache_evictions, "evictions")):
            now, before = getattr(stats, field), getattr(seen, field) if seen is not None else 0
            grown = now - before if now >= before else now
            if grown > 0:  # Ray refuses an increment of 0
                counter.inc(grown)
        self.cache_bytes.set(stats.bytes)
        self.cache_budget.set(stats.budget_bytes)

    def queue_changed(self, items: int, tokens: int) -> None:
        self.queue_items.set(items)
        self.queue_tokens.set(tokens)

    def batch_done(self, stats: BatchStats) -> None:
        if not stats.ok:  # its requests' errors are counted by code at the ingress; the batcher logged it
            return
        self.tokens.observe(stats.num_tokens)
        self.items.observe(stats.num_items)
        self.keys.observe(stats.num_keys)
        for stage in BATCH_STAGES:
            self.stages.observe(getattr(stats, f"{stage}_s"), tags={"stage": stage})


class KeyWindow:
    """The last `size` distinct prefix keys and the replica each went to last; `counts` per replica."""

    def __init__(self, size: int = KEY_WINDOW):
        self.size = size
        self._replica_of: OrderedDict[str, str] = OrderedDict()
        self.counts: Tally[str] = Tally()

    def route(self, key: str, replica: str) -> set[str]:
        """Record `key` going to `replica`; the replicas whose count changed."""
        changed = {replica}
        previous = self._replica_of.pop(key, None)
        if previous is not None:
            self.counts[previous] -= 1
            changed.add(previous)
        self._replica_of[key] = replica
        self.counts[replica] += 1
        if len(self._replica_of) > self.size:
            _, oldest = self._replica_of.popitem(last=False)
            self.counts[oldest] -= 1
            changed.add(oldest)
        return changed

    def forget(self, replica: str) -> None:
        """Drop the keys of a replica that left."""
        for key in [k for k, r in self._replica_of.items() if r == replica]:
            del self._replica_of[key]
        self.counts.pop(replica, None)


class RouterMetrics:
    """The prefix router's keys per engine replica and its spills, in the ingress replica that owns it."""

    def __init__(self, window: int = KEY_WINDOW):
        self.window = KeyWindow(window)
        self.keys = Gauge("radixserve_router_keys",
                          f"Distinct prefix keys among the last {window} keyed requests, by the engine replica "
                          "they were routed to.", tag_keys=("engine_replica",))
        self.spills = Counter("radixserve_router_spills",
                              "Keyed requests not routed to their key's home replica (its first on the ring until "
                              "it moves).")
        self.moves = Counter("radixserve_router_key_moves",
                             "Prefix keys moved to the engine replica with the least recent work, to even out the "
                             "replicas' work (with a prefix cache); each move computes the key's prefix again there.")

    def routed(self, key: str, replica: str, first: str) -> None:
        """A request with `key` went to `replica`; `first` is the key's home."""
        if replica != first:
            self.spills.inc()
        for changed in self.window.route(key, replica):
            self.keys.set(self.window.counts[changed], tags={"engine_replica": changed})

    def key_moved(self) -> None:
        self.moves.inc()

    def replica_left(self, replica: str) -> None:
        self.window.forget(replica)
        self.keys.set(0, tags={"engine_replica": replica})
