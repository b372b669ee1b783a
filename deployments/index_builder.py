"""`IndexBuilder`: the CPU half of an engine batch, in its own Ray actor so it overlaps the device half.

One actor per engine replica, created by it. For a batch of requests it validates and tokenizes each one
(`radix_core.tasks.encode_task`), then builds the radix index of their concatenated sequences and resolves the
radix mode (`radix_core.batch.prepare_batch`). A request with bad input fails alone: its slot holds the
`ValueError` and the others still form the batch. The replica runs batch k on the device while this actor
builds batch k+1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from radix_core.batch import BatchLimits, PreparedBatch, prepare_batch
from radix_core.tasks import TaskContext, TaskJob, encode_task


@dataclass
class BuiltBatch:
    """Per request its encoded job or the `ValueError` its input raised; the prepared batch of the jobs."""

    jobs: list[TaskJob | ValueError]
    prepared: PreparedBatch | None  # None when every request failed
    build_s: float

    @property
    def ok_jobs(self) -> list[TaskJob]:
        return [job for job in self.jobs if not isinstance(job, ValueError)]


def build_batch(context: TaskContext, limits: BatchLimits, radix: str,
                items: list[tuple[str, dict[str, Any]]]) -> BuiltBatch:
    """Encode each `(task, request)` and prepare the batch of all that encoded; the actor's work, callable
    inline too (the pipeline benchmark's baseline)."""
    start = time.perf_counter()
    jobs: list[TaskJob | ValueError] = []
    for task, request in items:
        try:
            jobs.append(encode_task(context, task, request))
        except ValueError as err:
            jobs.append(err)
    sequences = [seq for job in jobs if not isinstance(job, ValueError) for seq in job.sequences]
    prepared = prepare_batch(sequences, radix, limits) if sequences else None
    return BuiltBatch(jobs, prepared, time.perf_counter() - start)


class IndexBuilder:
    """The actor: holds the tokenizer (in `context`) and the limits; no model weights. Counts what it built, so
    a replica's batches can be inspected from outside (`stats`)."""

    def __init__(self, context: TaskContext, limits: BatchLimits, radix: str):
        self.context = context
        self.limits = limits
        self.radix = radix
        self.totals = {"batches": 0, "requests": 0, "tokens": 0, "compact_tokens": 0}

    def build(self, items: list[tuple[str, dict[str, Any]]]) -> BuiltBatch:
        built = build_batch(self.context, self.limits, self.radix, items)
        prepared = built.prepared
        if prepared is not None:
            self.totals["batches"] += 1
            self.totals["requests"] += len(built.ok_jobs)
            self.totals["tokens"] += prepared.num_tokens
            self.totals["compact_tokens"] += (prepared.index.num_compact if prepared.index is not None
                                              else prepared.num_tokens)
        return built

    def stats(self) -> dict[str, int]:
        """Batches, requests and tokens built so far; `compact_tokens` counts the rows the batches compute."""
        return dict(self.totals)

    def ping(self) -> bool:
        return True
