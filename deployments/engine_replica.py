"""`EngineReplica`: one engine (one GPU with `accelerator: gpu`) behind a token-budget, prefix-grouping batcher.

A client request arrives from the ingress as one `EngineRequest`: its parts (`radix_core.tasks.TaskJob`: token
ids and what finishing needs), already validated and tokenized, with the prefix key the router used and the work
it costs. The batcher admits the request whole or refuses it whole, groups parts of one prefix into one batch,
and drops the parts of a request whose call was cancelled; the replica's `IndexBuilder` actor indexes batch k+1
while batch k runs here, and a batch formed while the device is idle is indexed on the compute thread (nothing runs
for the actor's build to overlap; its call only adds latency: 3-4 ms of a 40-50 ms 8-document `tiny` request on 2
CPUs); the request gets its parts' partial results back, which the ingress merges. With `placement.topology:
combined` there is no engine deployment: each ingress replica makes an `EngineReplica` in its own process and calls
`submit` directly (`deployments.engine_link.LocalEngine`).

A refusal is returned, not raised (`QueueFullError` as the call's value): Ray Serve logs every exception a
replica method raises at ERROR with its stack trace, and a refusal is routine under load (the ingress logs it as
one WARNING line and answers RESOURCE_EXHAUSTED).

Each job keeps the id of the client request it came from (Ray carries it from the ingress in the request
context): the batch's log lines name the ids of its requests, so a slow or failed request can be followed from
the ingress to its batch. `EngineMetrics` exports the batches (mode, N'/N, sizes, stage times), the queue,
IndexBuilder restarts and the prefix cache.

**The prefix cache** is the engine's (`Engine.prefix_cache`, `engine.prefix_cache_bytes`): K/V of prefixes this
replica computed, kept across batches in its device memory, so a hot prefix that prefix routing keeps sending here
is computed once per replica instead of once per batch. Nothing is persisted: a replica that restarts starts cold.
Each part travels through the batcher with its request's `cache_scope` (the API key's digest, or None for the shared
tree) into `Engine.run_jobs(..., scopes=...)`. The cache is matched inside `Engine.run`, right before the forward,
not in the IndexBuilder: batch k changes the cache while the builder prepares batch k+1 (`radix_core.cached_forward`).
Rows computed (`computed_tokens`, the batch compression) count after cache hits.

**Batches are budgeted in what the device computes.** Each part enters the batcher with its input tokens and its
work (its rows, the shared prefix once) less the rows of its shared prefix this replica's cache holds when the part
arrives (`PrefixCache.cached_length`), and the batcher fills a batch by the work: a classification request behind a
cached 1,024-token prompt holds ~200 rows of the batch, not ~8,600, so the requests that read one prompt (or several)
share a batch instead of running one by one; where nothing is cached, a part's shared prefix still counts once, not
once per sequence (a 1,000-document rerank's parts of ~8,170 tokens cost ~4,960 rows each).
The count is an estimate made while another batch runs: that batch's admissions, or the next one's, can evict a
prefix a queued part counted on, and that batch then computes the prefix again, over its budget by those rows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import os
import time
from typing import Any

import ray
import torch
from ray import serve
from ray.exceptions import RayActorError

from deployments import request_ids
from deployments.batcher import QueueFullError, TokenBudgetBatcher
from deployments.compute_thread import ComputeThread
from deployments.config import AppArgs
from deployments.engine_request import EngineRequest
from deployments.index_builder import IndexBuilder, build_batch
from deployments.metrics import EngineMetrics
from radix_core import Engine, EngineConfig
from radix_core.batch import PreparedBatch
from radix_core.host_memory import keep_freed_memory
from radix_core.tasks import TaskJob

logger = logging.getLogger("ray.serve")
BUILDER_PING_TIMEOUT_S = 10.0  # a started IndexBuilder answers its health ping within this, even while it builds
ScopedJob = tuple[TaskJob, str | None]  # a part and its request's prefix cache scope: what the batcher queues


@serve.deployment
class EngineReplica:
    """Loads the model once, then serves `submit` calls in token-budget batches."""

    def __init__(self, args: AppArgs, engine: EngineConfig):
        """`engine`: `args.engine` with this deployment's device (`deployments.placement.engine_config`)."""
        self.batching = args.batching
        keep_freed_memory()
        self.compute = ComputeThread()  # every torch call of the replica runs there
        if engine.device == "cpu":
            self.compute.call(torch.set_num_threads, cpu_threads())
        self.engine = self.compute.call(Engine.from_pretrained, args.model, engine, tasks=args.tasks)
        seconds = self.compute.call(self.engine.warm_up)  # kernels compile here, before Serve marks the replica ready
        logger.info("engine warmed up in %.1f s (attention %s, %s)", seconds, self.engine.backend.name,
                    self.engine.dtype)
        pipelined = self.batching.pipelined
        self.metrics = EngineMetrics()
        self.input_tokens = 0  # tokens of the sequences this replica's batches ran (N)
        self.computed_tokens = 0  # rows this replica's batches computed (the load benchmark's goodput reads it)
        self.cached_tokens = 0  # tokens they read from the prefix cache instead
        self._cache_changed()
        self._builders = itertools.count()
        self._forwards = 0  # batches handed to the compute thread and not yet done
        self.builder = self._new_builder() if pipelined else None
        self._builder_up = False  # whether `self.builder` answered once (a ping or a build): it started
        self.batcher = TokenBudgetBatcher(self._run if pipelined else self._build_and_run,
                                          self.batching.max_batch_tokens, self.batching.batch_wait_timeout_s,
                                          prepare=self._build if pipelined else None,
                                          max_queued_tokens=self.batching.queued_token_bound,
                                          max_queue_wait_s=self.batching.max_queue_wait_s,
                                          aging_s=self.batching.batch_priority_aging_s, observer=self.metrics)

    async def submit(self, request: EngineRequest) -> list[Any] | QueueFullError:
        """The partial results of the request's parts, in order, or its refusal."""
        parts = request.parts
        cached = self._cached_prefixes(parts, request.cache_scope)
        try:
            with self.metrics.requests.stage("replica"):
                return await self.batcher.submit([(part, request.cache_scope) for part in parts],
                                                 [max(1, part.num_tokens - len(part.sequences) * c)
                                                  for part, c in zip(parts, cached)],
                                                 [max(1, part.work_tokens - c) for part, c in zip(parts, cached)],
                                                 request.prefix_key, request_ids.current(), int(request.priority))
        except QueueFullError as refusal:
            return refusal

    def _cached_prefixes(self, parts: tuple[TaskJob, ...], scope: str | None) -> list[int]:
        """Tokens of each part's shared prefix the prefix cache holds in the request's scope now (0 without one)."""
        cache = self.engine.prefix_cache
        if cache is None:
            return [0] * len(parts)
        return [cache.cached_length(part.shared_ids, scope) if part.shared_len else 0 for part in parts]

    def info(self) -> dict[str, Any]:
        return {**self.engine.info, "replica": serve.get_replica_context().replica_id.unique_id,
                "index_builder": self.batching.index_builder,
                "max_batch_tokens": self.batching.max_batch_tokens, "torch_threads": torch.get_num_threads(),
                "input_tokens": self.input_tokens, "computed_tokens": self.computed_tokens,
                "cached_tokens": self.cached_tokens,
                "prefix_cache": self._cache_stats(), "batcher": self.batcher.stats.summary(),
                "engine_request_stages": self.metrics.requests.totals,
                "cpu_s": time.process_time()}  # CPU seconds this replica's process used, all its threads

    async def check_health(self) -> None:
        """Serve's health probe: the device must still compute (else Serve replaces the replica); a dead
        IndexBuilder, or one that answered before and no longer does, is replaced here rather than failing the
        replica. One that never answered is still starting (a new worker process: over 10 s on a loaded node) and is
        left to start: replaced on every probe, it never would, and each build waiting on it would fail."""
        # Beside the compute thread, so that a long batch does not fail the probe; its one-element op starts no
        # parallel region (no OpenMP team of its own, `deployments.compute_thread`).
        await asyncio.to_thread(self.engine.check_device)
        builder = self.builder
        if builder is None:
            return
        try:
            await asyncio.wait_for(builder.ping.remote(), timeout=BUILDER_PING_TIMEOUT_S)  # answered while it builds
        except RayActorError:
            logger.warning("IndexBuilder died; starting a new one")
            self._replace_builder(builder, "health")
        except asyncio.TimeoutError:
            if builder is self.builder and self._builder_up:
                logger.warning("IndexBuilder did not answer its health ping; starting a new one")
                self._replace_builder(builder, "health")
            else:
                logger.info("IndexBuilder has not started yet")
        else:
            self._answered(builder)

    def _new_builder(self):
        """A new IndexBuilder actor (no CPU reserved: it shares the replica's), named after the replica and its
        generation, so a replacement never collides with the name of one that is still shutting down."""
        replica = serve.get_replica_context().replica_id.unique_id
        name = f"index-builder-{replica}-{next(self._builders)}"
        actor = ray.remote(num_cpus=0, name=name, lifetime=None)(IndexBuilder)
        return actor.remote(self.engine.limits, self.engine.radix)

    def _replace_builder(self, failed, reason: str) -> None:
        """Kill the IndexBuilder `failed` and start a new one, unless `failed` was replaced already (the health
        probe and a failing build can both find the same builder dead): its replacement is kept."""
        if failed is not self.builder:
            return
        self.metrics.restarted(reason)
        ray.kill(failed, no_restart=True)
        self.builder, self._builder_up = self._new_builder(), False

    def _answered(self, builder) -> None:
        """`builder` answered a call: it started."""
        if builder is self.builder:
            self._builder_up = True

    async def _build(self, items: list[ScopedJob]) -> tuple[list[ScopedJob], PreparedBatch]:
        """The batch built by the IndexBuilder while a batch runs; on the compute thread while none does, and when
        the builder dies meanwhile (its replacement may take seconds to start, and could die too)."""
        jobs = [job for job, _ in items]
        if not self._forwards:
            return items, await self._build_here(jobs)
        builder = self.builder
        try:
            prepared = await builder.build.remote(jobs)
        except RayActorError:
            logger.warning("IndexBuilder died while building a batch; building it here, and starting a new one")
            self._replace_builder(builder, "build")
            return items, await self._build_here(jobs)
        self._answered(builder)
        return items, prepared

    async def _run(self, built: tuple[list[ScopedJob], PreparedBatch]) -> list[Any]:
        """Each job's partial result, in order, from the prepared batch."""
        return await self._forward(*built)

    async def _build_and_run(self, items: list[ScopedJob]) -> list[Any]:
        """`index_builder: inline`: build and run one after the other (the pipeline benchmark's baseline)."""
        return await self._forward(items, await self._build_here([job for job, _ in items]))

    async def _build_here(self, jobs: list[TaskJob]) -> PreparedBatch:
        """The batch built on the compute thread."""
        return await self.compute.run(build_batch, self.engine.limits, self.engine.radix, jobs)

    async def _forward(self, items: list[ScopedJob], prepared: PreparedBatch) -> list[Any]:
        """The jobs' partial results, each job reading and filling its request's prefix cache scope."""
        jobs, scopes = [job for job, _ in items], [scope for _, scope in items]
        self._forwards += 1  # before the first await: the batcher forms the next batch once this one is handed over
        try:
            results = await self.compute.run(self.engine.run_jobs, jobs, prepared, scopes)
        finally:
            self._forwards -= 1
        self._ran(prepared, results)
        return results

    def _ran(self, prepared: PreparedBatch, results: list[Any]) -> None:
        """Export the mode and N'/N of a batch that ran: the rows it computed after in-batch sharing and cache hits,
        the sum of its jobs' `usage` (all N tokens when the mode is off and nothing was cached)."""
        computed = sum(result.usage.computed_tokens for result in results)
        self.input_tokens += sum(result.usage.input_tokens for result in results)
        self.computed_tokens += computed
        self.cached_tokens += sum(result.usage.cached_tokens for result in results)
        self.metrics.ran(prepared.mode, prepared.num_tokens, computed)
        self._cache_changed()

    def _cache_changed(self) -> None:
        if self.engine.prefix_cache is not None:
            self.metrics.prefix_cache(self.engine.prefix_cache.stats())

    def _cache_stats(self) -> dict[str, Any] | None:
        """The prefix cache's counters and what it holds (`PrefixCacheStats`, with its hit ratio); None without one."""
        if self.engine.prefix_cache is None:
            return None
        stats = self.engine.prefix_cache.stats()
        return {**dataclasses.asdict(stats), "hit_ratio": stats.hit_ratio}


def cpu_threads() -> int:
    """Torch threads of a CPU replica: its CPU reservation rounded up, at most the machine's cores (Ray sets
    OMP_NUM_THREADS to 1 for a fractional reservation, so torch would otherwise run on one core)."""
    reserved = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return max(1, min(math.ceil(reserved), os.cpu_count() or 1))
