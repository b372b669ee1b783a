"""`EngineReplica`: one engine (one GPU with `accelerator: gpu`) behind a token-budget, prefix-grouping batcher.

Requests arrive from the ingress as `(task, request)` with the prefix key and token count the router used.
The batcher groups requests of one prefix into one batch; the replica's `IndexBuilder` actor tokenizes and
indexes batch k+1 while batch k runs here; each request gets its own result (or its own error) back.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from ray.exceptions import RayActorError

from deployments.batcher import TokenBudgetBatcher
from radix_core import Engine
from radix_core.tasks import TaskConfig, run_jobs
from deployments.index_builder import BuiltBatch, IndexBuilder, build_batch

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class EngineSettings:
    """What an engine replica is built with (derived from `AppArgs` by the app builder)."""

    model: str
    device: str  # "cuda" or "cpu"
    dtype: str
    radix: str
    radix_threshold: float
    attention: str
    max_items: int
    max_tokens_per_item: int | None
    max_batch_tokens: int
    batch_wait_timeout_s: float
    index_builder: str  # "actor" (pipelined with the device) or "inline" (built, then run)


@serve.deployment
class EngineReplica:
    """Loads the model once, then serves `submit` calls in token-budget batches."""

    def __init__(self, settings: EngineSettings):
        self.settings = settings
        self.engine = Engine.from_pretrained(
            settings.model, device=settings.device, dtype=settings.dtype, radix=settings.radix,
            radix_threshold=settings.radix_threshold, attention=settings.attention,
            tasks=TaskConfig(max_items=settings.max_items, max_tokens=settings.max_tokens_per_item))
        pipelined = settings.index_builder == "actor"
        self.builder = self._new_builder() if pipelined else None
        self.batcher = TokenBudgetBatcher(self._run if pipelined else self._build_and_run,
                                          settings.max_batch_tokens, settings.batch_wait_timeout_s,
                                          prepare=self._build if pipelined else None)

    async def submit(self, task: str, request: dict[str, Any], *, prefix_key: str | None = None,
                     num_tokens: int = 1) -> Any:
        """One request's result; `prefix_key` and `num_tokens` are the routing contract (deployments.router)."""
        result = await self.batcher.submit((task, request), num_tokens, prefix_key)
        if isinstance(result, ValueError):
            raise result
        return result

    def info(self) -> dict[str, Any]:
        return {**self.engine.info, "index_builder": self.settings.index_builder,
                "max_batch_tokens": self.settings.max_batch_tokens}

    def stats(self) -> dict[str, float]:
        """Batch counters and mean queue, build, wait and forward seconds over recent batches."""
        return self.batcher.stats.summary()

    async def check_health(self) -> None:
        """Serve's health probe: a dead IndexBuilder is replaced here rather than failing the replica."""
        if self.builder is None:
            return
        try:
            await asyncio.wait_for(self.builder.ping.remote(), timeout=10)
        except (RayActorError, asyncio.TimeoutError):
            logger.warning("IndexBuilder did not answer its health ping; starting a new one")
            self.builder = self._new_builder()

    def _new_builder(self):
        """The replica's IndexBuilder actor (no CPU reserved: it shares the replica's), named after the replica."""
        name = f"index-builder-{serve.get_replica_context().replica_id.unique_id}"
        actor = ray.remote(num_cpus=0, name=name, lifetime=None)(IndexBuilder)
        return actor.remote(self.engine.context, self.engine.limits, self.settings.radix)

    async def _build(self, items: list[tuple[str, dict[str, Any]]]) -> BuiltBatch:
        try:
            return await self.builder.build.remote(items)
        except RayActorError:
            logger.warning("IndexBuilder died while building a batch; starting a new one and retrying")
            self.builder = self._new_builder()
            return await self.builder.build.remote(items)

    async def _run(self, built: BuiltBatch) -> list[Any]:
        """Results in request order: each encoded job's result, or the ValueError its input raised."""
        ok = iter(await asyncio.to_thread(run_jobs, self.engine, built.ok_jobs, built.prepared)
                  if built.prepared is not None else [])
        return [job if isinstance(job, ValueError) else next(ok) for job in built.jobs]

    async def _build_and_run(self, items: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        """`index_builder: inline`: build and run one after the other (the pipeline benchmark's baseline)."""
        built = await asyncio.to_thread(build_batch, self.engine.context, self.engine.limits, self.settings.radix,
                                        items)
        return await self._run(built)
