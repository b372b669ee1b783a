"""`EngineReplica`: one engine (one GPU with `accelerator: gpu`) behind a token-budget, prefix-grouping batcher.

A client request arrives from the ingress as one `EngineRequest`: its parts (`radix_core.tasks.TaskJob`: token
ids and what finishing needs), already validated and tokenized, with the prefix key the router used and the work
it costs. The batcher admits the request whole or refuses it whole, groups parts of one prefix into one batch,
and drops the parts of a request whose call was cancelled; the replica's `IndexBuilder` actor indexes batch k+1
while batch k runs here; the request gets its parts' partial results back, which the ingress merges.

A refusal is returned, not raised (`QueueFullError` as the call's value): Ray Serve logs every exception a
replica method raises at ERROR with its stack trace, and a refusal is routine under load (the ingress logs it as
one WARNING line and answers RESOURCE_EXHAUSTED).

Each job keeps the id of the client request it came from (Ray carries it from the ingress in the request
context): the batch's log lines name the ids of its requests, so a slow or failed request can be followed from
the ingress to its batch. `EngineMetrics` exports the batches (mode, N'/N, sizes, stage times), the queue and
IndexBuilder restarts.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
from typing import Any

import ray
import torch
from ray import serve
from ray.exceptions import RayActorError

from deployments import request_ids
from deployments.batcher import QueueFullError, TokenBudgetBatcher
from deployments.config import AppArgs
from deployments.engine_request import EngineRequest
from deployments.index_builder import IndexBuilder, build_batch
from deployments.metrics import EngineMetrics
from radix_core import Engine
from radix_core.batch import PreparedBatch
from radix_core.tasks import TaskJob

logger = logging.getLogger("ray.serve")


@serve.deployment
class EngineReplica:
    """Loads the model once, then serves `submit` calls in token-budget batches."""

    def __init__(self, args: AppArgs, device: str):
        self.args = args
        if device == "cpu":
            torch.set_num_threads(cpu_threads())
        self.engine = Engine.from_pretrained(
            args.model, device=device, dtype=args.dtype, radix=args.radix, radix_threshold=args.radix_threshold,
            attention=args.attention, tasks=args.task_config())
        seconds = self.engine.warm_up()  # kernels compile here, before Serve marks the replica ready
        logger.info("engine warmed up in %.1f s (attention %s, %s)", seconds, self.engine.backend.name,
                    self.engine.dtype)
        pipelined = args.index_builder == "actor"
        self.metrics = EngineMetrics()
        self.computed_tokens = 0  # rows this replica's batches computed (the load benchmark's goodput reads it)
        self._builders = itertools.count()
        self.builder = self._new_builder() if pipelined else None
        self.batcher = TokenBudgetBatcher(self._run if pipelined else self._build_and_run,
                                          args.max_batch_tokens, args.batch_wait_timeout_s,
                                          prepare=self._build if pipelined else None,
                                          max_queued_tokens=args.queued_token_bound,
                                          max_queue_wait_s=args.max_queue_wait_s,
                                          aging_s=args.batch_priority_aging_s, observer=self.metrics)

    async def submit(self, request: EngineRequest) -> list[Any] | QueueFullError:
        """The partial results of the request's parts, in order, or its refusal."""
        parts = request.parts
        try:
            return await self.batcher.submit(parts, [part.num_tokens for part in parts],
                                             [part.work_tokens for part in parts], request.prefix_key,
                                             request_ids.current(), int(request.priority))
        except QueueFullError as refusal:
            return refusal

    def info(self) -> dict[str, Any]:
        return {**self.engine.info, "replica": serve.get_replica_context().replica_id.unique_id,
                "index_builder": self.args.index_builder,
                "max_batch_tokens": self.args.max_batch_tokens, "torch_threads": torch.get_num_threads(),
                "computed_tokens": self.computed_tokens,
                "batcher": self.batcher.stats.summary()}

    async def check_health(self) -> None:
        """Serve's health probe: the device must still compute (else Serve replaces the replica); a dead
        IndexBuilder is replaced here rather than failing the replica."""
        await asyncio.to_thread(self.engine.check_device)
        builder = self.builder
        if builder is None:
            return
        try:
            await asyncio.wait_for(builder.ping.remote(), timeout=10)  # answered while a build runs
        except (RayActorError, asyncio.TimeoutError):
            logger.warning("IndexBuilder did not answer its health ping; starting a new one")
            self._replace_builder(builder, "health")

    def _new_builder(self):
        """A new IndexBuilder actor (no CPU reserved: it shares the replica's), named after the replica and its
        generation, so a replacement never collides with the name of one that is still shutting down."""
        replica = serve.get_replica_context().replica_id.unique_id
        name = f"index-builder-{replica}-{next(self._builders)}"
        actor = ray.remote(num_cpus=0, name=name, lifetime=None)(IndexBuilder)
        return actor.remote(self.engine.limits, self.args.radix)

    def _replace_builder(self, failed, reason: str) -> None:
        """Kill the IndexBuilder `failed` and start a new one, unless `failed` was replaced already (the health
        probe and a failing build can both find the same builder dead): its replacement is kept."""
        if failed is not self.builder:
            return
        self.metrics.restarted(reason)
        ray.kill(failed, no_restart=True)
        self.builder = self._new_builder()

    async def _build(self, jobs: list[TaskJob]) -> tuple[list[TaskJob], PreparedBatch]:
        """The batch built by the IndexBuilder; when the builder dies meanwhile, built again on its replacement."""
        builder = self.builder
        try:
            return jobs, await builder.build.remote(jobs)
        except RayActorError:
            logger.warning("IndexBuilder died while building a batch; retrying on a new one")
            self._replace_builder(builder, "build")
            return jobs, await self.builder.build.remote(jobs)

    async def _run(self, built: tuple[list[TaskJob], PreparedBatch]) -> list[Any]:
        """Each job's partial result, in order, from the batch the IndexBuilder prepared."""
        jobs, prepared = built
        results = await asyncio.to_thread(self.engine.run_jobs, jobs, prepared)
        self._ran(prepared)
        return results

    async def _build_and_run(self, jobs: list[TaskJob]) -> list[Any]:
        """`index_builder: inline`: build and run one after the other (the pipeline benchmark's baseline)."""
        prepared = await asyncio.to_thread(build_batch, self.engine.limits, self.args.radix, jobs)
        results = await asyncio.to_thread(self.engine.run_jobs, jobs, prepared)
        self._ran(prepared)
        return results

    def _ran(self, prepared: PreparedBatch) -> None:
        """Export the mode and N'/N of a batch that ran (the rows computed: all N tokens when the mode is off)."""
        computed = prepared.index.num_compact if prepared.index is not None else prepared.num_tokens
        self.computed_tokens += computed
        self.metrics.ran(prepared.mode, prepared.num_tokens, computed)


def cpu_threads() -> int:
    """Torch threads of a CPU replica: its CPU reservation rounded up, at most the machine's cores (Ray sets
    OMP_NUM_THREADS to 1 for a fractional reservation, so torch would otherwise run on one core)."""
    reserved = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return max(1, min(math.ceil(reserved), os.cpu_count() or 1))
