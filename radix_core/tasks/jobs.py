"""Requests of any task as jobs that share one forward batch.

A request is served in two halves. `encode_task` (CPU, no weights: it reads a picklable `TaskContext`) checks and
tokenizes it into a `TaskJob`; `run_jobs` runs the sequences of several jobs, of any tasks, as one batch and
finishes each job from its own `BatchView`, its slice of the batch's forward:

    jobs = [encode_task(engine.context, "rerank", {"query": q, "documents": docs}),
            encode_task(engine.context, "embed", {"texts": texts})]
    ranked, embedded = run_jobs(engine, jobs)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from radix_core.tasks.common import TaskContext, TaskJob, Usage
from radix_core.tasks.embed import embed_job
from radix_core.tasks.rerank import rerank_job
from radix_core.tasks.scoring import classify_job, score_job

if TYPE_CHECKING:
    from radix_core.batch import PreparedBatch
    from radix_core.engine import Engine, ForwardResult

ENCODERS: dict[str, Callable[..., TaskJob]] = {
    "rerank": rerank_job, "embed": embed_job, "classify": classify_job, "score": score_job,
}
TASKS = tuple(ENCODERS)


@dataclass(frozen=True)
class BatchView:
    """A `ForwardResult` restricted to sequences `[first, first + count)`: what one job reads."""

    result: ForwardResult
    first: int
    count: int

    @property
    def hidden(self) -> torch.Tensor:
        """(R, hidden) the whole batch's computed rows: index it with rows from `rows_at` or `row_of_token`."""
        return self.result.hidden

    @property
    def lengths(self) -> np.ndarray:
        """(count,) int64 lengths of the slice's sequences."""
        return np.diff(self._cu_seqlens)

    @property
    def row_of_token(self) -> torch.Tensor:
        """(n,) int64 computed row of each of the slice's tokens."""
        start, end = self._cu_seqlens[[0, -1]].tolist()
        return self.result.plan.row_of_token[start:end]

    def rows_at(self, sequence_positions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per local sequence, the (int64) computed rows holding the given positions (negative from the end)."""
        if len(sequence_positions) > self.count:
            raise ValueError(f"positions for {len(sequence_positions)} sequences, but this view has {self.count}")
        return self.result.rows_at(sequence_positions, first=self.first)

    @property
    def usage(self) -> Usage:
        """The slice's tokens, and the computed rows its sequences created first. Rows are numbered in the order
        sequences first create them (`BatchPlan.cu_rows`), so over the slices of a batch these sum to
        `ForwardResult.num_computed`; a prefix shared with an earlier slice counts there."""
        cu_rows = self.result.plan.cu_rows[[self.first, self.first + self.count]]
        return Usage(int(self.lengths.sum()), int(cu_rows[1] - cu_rows[0]))

    @property
    def _cu_seqlens(self) -> np.ndarray:
        return self.result.plan.cu_seqlens[self.first:self.first + self.count + 1]  # (count+1,)


def encode_task(context: TaskContext, task: str, request: Mapping[str, Any]) -> TaskJob:
    """Validate and tokenize one request of `task`. `request` holds the keyword arguments of the `Engine`
    method of that task (`{"query": ..., "documents": [...], "top_n": 3}`); an unknown task, an unknown or
    missing key, and bad input raise a ValueError saying what is wrong."""
    check_request(task, request)
    return ENCODERS[task](context, **request)


def check_request(task: str, request: Mapping[str, Any]) -> None:
    """A known task, and a mapping holding only its encoder's keywords and all the required ones."""
    if task not in ENCODERS:
        raise ValueError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
    if not isinstance(request, Mapping):
        raise ValueError(f"the {task} request must be a mapping of its arguments, got {type(request).__name__}")
    params = list(inspect.signature(ENCODERS[task]).parameters.values())[1:]  # after the TaskContext
    allowed = [p.name for p in params]
    unknown = sorted(set(request) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {task} request keys {unknown}: allowed are {allowed}")
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    missing = [name for name in required if name not in request]
    if missing:
        raise ValueError(f"the {task} request lacks {missing}: it needs {required}")


def run_jobs(engine: Engine, jobs: Sequence[TaskJob], prepared: PreparedBatch | None = None) -> list:
    """Run the jobs' sequences as one batch and finish each job from its view; results in job order.

    `prepared`: the batch prepared elsewhere (`Engine.prepare`, e.g. in an index-building process) from exactly
    the jobs' concatenated sequences; checked by sequence lengths. Without it the engine prepares the batch.
    """
    sequences = [seq for job in jobs for seq in job.sequences]
    if prepared is None:
        prepared = engine.prepare(sequences)
    elif not np.array_equal(np.diff(prepared.cu_seqlens), [len(seq) for seq in sequences]):
        raise ValueError(f"the prepared batch ({prepared.num_sequences} sequences, {prepared.num_tokens} tokens) "
                         f"is not these jobs' sequences ({len(sequences)}, {sum(map(len, sequences))} tokens): "
                         f"prepare exactly the concatenation of the jobs' sequences, in job order")
    result = engine.run(prepared)
    starts = np.cumsum([0] + [len(job.sequences) for job in jobs]).tolist()  # (J+1,)
    return [job.finish(engine, BatchView(result, first, len(job.sequences))) for job, first in zip(jobs, starts)]
