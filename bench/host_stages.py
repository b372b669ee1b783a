"""The served path's stages timed in-process, one request at a time: the functions the ingress and the engine
replica run, called in their order, each under its own clock, so the host-path benchmark can say where a request's
time goes without a tracing hook in the server.

    ingress  decode + check (each transport: `bench/wire.py`; `TaskRequest.check`) -> tokenize + split
             (`Task.job`, `Task.split`) -> key + route (`prefix_key`, `EngineRequest.of`, `HashRing.rank`)
    replica  cache lookup (`PrefixCache.cached_length` per part as `EngineReplica.submit` does, then the lease's
             walk) -> batcher (`TokenBudgetBatcher` on this thread's loop: its bookkeeping and its wait for more
             work, `batch_wait_timeout_s` when a request is under the budget) -> index build (`build_batch`, the
             IndexBuilder actor's work, inline here) -> plan (layout and upload without the cached rows) -> forward
             (`run_layers`) -> cache commit -> finish (`finish_jobs`: the head and each part's result)
    ingress  merge (`Task.merge`) -> encode (each transport)

The replica's steps repeat `radix_core.cached_forward.run_with_cache` and `Engine.run_jobs` with a clock between
them (the engine reports no per-stage times). What Ray adds is not here: the proxies, the handle calls to the
ingress and the engine replica, the IndexBuilder's actor call, the worker-thread hand-offs and the pickling between
them; the benchmark reads it as the served time less these stages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from wire import TRANSPORTS

from deployments.batcher import TokenBudgetBatcher
from deployments.batching_config import BatchingConfig
from deployments.engine_request import EngineRequest
from deployments.hash_ring import HashRing
from deployments.index_builder import build_batch
from deployments.request_path import prefix_key
from radix_core.batch import PreparedBatch
from radix_core.cached_forward import plan_with_cache
from radix_core.engine import Engine
from radix_core.finish import finish_jobs, read_tokens
from radix_core.forward import run_layers
from radix_core.forward_result import ForwardResult
from radix_core.prefix_cache import Origins
from radix_core.tasks import RerankResult, TaskJob, task_for

COMMON = ("tokenize + split", "key + route", "cache lookup", "batcher", "index build", "plan", "forward",
          "cache commit", "finish", "merge")  # the stages every transport shares, in path order


def stages(transport: str) -> tuple[str, ...]:
    """The stages of a request that came in by `transport`, in path order."""
    return (f"decode + check {transport}", *COMMON, f"encode {transport}")


class StageClock:
    """Seconds per stage, summed over every request timed."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - start)

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds


class HostPath:
    """One ingress and one engine replica of the served path in this process, over `engine` (with its prefix cache,
    as served by default); `answer(request)` runs one rerank request (a dict of its fields) through it, adds its
    stages to `clock` and returns the result.
    Every transport decodes and encodes each request (the path between runs once, on the first one's decoding)."""

    def __init__(self, engine: Engine, batching: BatchingConfig, max_request_tokens: int):
        if engine.prefix_cache is None:
            raise ValueError("HostPath times the served default, the prefix cache on: load the engine with "
                             "prefix_cache_bytes 'auto' or a budget")
        self.engine = engine
        self.context = engine.context
        self.max_request_tokens = max_request_tokens
        self.ring = HashRing(["replica"])
        self.clock = StageClock()
        self.loop = asyncio.new_event_loop()  # the batcher's loops live on it across requests
        self.batcher = TokenBudgetBatcher(self._run, batching.max_batch_tokens, batching.batch_wait_timeout_s,
                                          prepare=self._build)
        self._inside = 0.0  # seconds in the batcher's prepare and run callbacks, which have stages of their own

    def answer(self, request: dict) -> RerankResult:
        return self.loop.run_until_complete(self._answer(request))

    def close(self) -> None:
        self.loop.run_until_complete(self.batcher.close())
        self.loop.close()

    async def _answer(self, request: dict) -> RerankResult:
        clock = self.clock
        decoded = []
        for transport in TRANSPORTS:
            data = transport.wire(request)
            with clock(f"decode + check {transport.name}"):
                decoded.append(transport.decode(data))
                decoded[-1].check(self.context.config.max_items)
        typed = decoded[0]
        task = task_for(typed)
        with clock("tokenize + split"):
            job = task.job(self.context, typed)
            parts = task.split(job, self.max_request_tokens)
        with clock("key + route"):
            call = EngineRequest.of(parts, prefix_key(job))
            if call.prefix_key is not None:
                self.ring.rank(call.prefix_key, {}, weight=call.cost)
        partials = await self._submit(call)
        with clock("merge"):
            result = task.merge(job, partials)
        for transport in TRANSPORTS:
            with clock(f"encode {transport.name}"):
                transport.encode(result, len(typed.documents))
        return result

    async def _submit(self, call: EngineRequest) -> list:
        """`EngineReplica.submit`: the parts priced less their cached prefix, through the batcher."""
        cache = self.engine.prefix_cache
        with self.clock("cache lookup"):
            cached = [cache.cached_length(part.shared_ids) if part.shared_len else 0 for part in call.parts]
        started, inside = time.perf_counter(), self._inside
        results = await self.batcher.submit(
            list(call.parts),
            [max(1, part.num_tokens - len(part.sequences) * c) for part, c in zip(call.parts, cached)],
            [max(1, part.work_tokens - c) for part, c in zip(call.parts, cached)], call.prefix_key)
        self.clock.add("batcher", time.perf_counter() - started - (self._inside - inside))
        return results

    async def _build(self, jobs: list[TaskJob]) -> tuple[list[TaskJob], PreparedBatch]:
        started = time.perf_counter()
        with self.clock("index build"):
            prepared = build_batch(self.engine.limits, self.engine.radix, jobs)
        self._inside += time.perf_counter() - started
        return jobs, prepared

    async def _run(self, built: tuple[list[TaskJob], PreparedBatch]) -> list:
        started = time.perf_counter()
        results = self._forward(*built)
        self._inside += time.perf_counter() - started
        return results

    @torch.inference_mode()
    def _forward(self, jobs: list[TaskJob], prepared: PreparedBatch) -> list:
        """`Engine.run_jobs` with the cache (`run_with_cache`), a clock between its steps."""
        engine, clock = self.engine, self.clock
        mark = time.perf_counter()
        with engine.prefix_cache.lease(prepared.input_ids, prepared.cu_seqlens, origins=Origins.of(jobs)) as lease:
            clock.add("cache lookup", time.perf_counter() - mark)
            with clock("plan"):
                plan = plan_with_cache(prepared, lease, engine.device, read_tokens(jobs, prepared.cu_seqlens))
            with clock("forward"):
                hidden = run_layers(engine.arch, plan, engine.backend)
                if engine.device.type == "cuda":
                    torch.cuda.synchronize(engine.device)
            mark = time.perf_counter()
            lease.commit(plan.kept)
        clock.add("cache commit", time.perf_counter() - mark)
        with clock("finish"):
            return finish_jobs(ForwardResult(prepared, plan, hidden, engine.arch.head_module), jobs)
