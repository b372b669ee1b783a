"""Finishing the jobs of one batch: every job's head query answered in one pass, then each job from its own view.

    results = finish_jobs(forward_result, jobs)   # partial results, in job order

Jobs of any tasks share a batch. Their head queries are grouped by what they ask (log-probabilities, or the
outputs of one set of columns) and each group runs the head once over the distinct rows of the whole batch
(`ForwardResult.head_outputs` / `token_logprobs`), so a batch of 64 rerank requests is one head call, one upload
and one download.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radix_core.forward_result import ForwardResult
from radix_core.tasks.base import HeadQuery, TaskJob, Usage
from radix_core.tasks.registry import task_of


@dataclass(frozen=True)
class BatchView:
    """A `ForwardResult` restricted to sequences `[first, first + count)`: what one job reads."""

    result: ForwardResult
    first: int
    count: int
    head: np.ndarray | None = None  # the answer to the job's HeadQuery: (P, C) outputs or (P,) log-probabilities

    @property
    def lengths(self) -> np.ndarray:
        """(count,) int64 lengths of the slice's sequences."""
        return np.diff(self._cu_seqlens)

    def rows(self, sequences: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """(P,) int64 computed rows of the local `sequences` at `positions` (negative from the end)."""
        return self.result.rows(np.asarray(sequences) + self.first, positions)

    def last_hidden(self) -> torch.Tensor:
        """(count, hidden) float32 state of each sequence's last token, on the device."""
        return self.result.hidden_at(self.rows(np.arange(self.count), np.full(self.count, -1)))

    def mean_hidden(self) -> torch.Tensor:
        """(count, hidden) float32 mean state over each sequence's tokens, on the device."""
        start, end = self._cu_seqlens[[0, -1]].tolist()
        per_token = self.result.hidden_at(self.result.row_of_token[start:end])  # (n, hidden)
        owner = torch.from_numpy(np.repeat(np.arange(self.count), self.lengths)).to(per_token.device)  # (n,)
        sums = torch.zeros(self.count, per_token.shape[1], device=per_token.device).index_add_(0, owner, per_token)
        return sums / torch.from_numpy(self.lengths).to(sums)[:, None]

    @property
    def usage(self) -> Usage:
        """The slice's tokens, and the computed rows its sequences created first. Rows are numbered in the order
        sequences first create them (`BatchPlan.cu_rows`), so over the slices of a batch these sum to
        `ForwardResult.num_computed`; a prefix shared with an earlier slice counts there."""
        cu_rows = self.result.plan.cu_rows[[self.first, self.first + self.count]]
        return Usage(int(self.lengths.sum()), int(cu_rows[1] - cu_rows[0]))

    @property
    def _cu_seqlens(self) -> np.ndarray:
        return self.result.prepared.cu_seqlens[self.first:self.first + self.count + 1]  # (count+1,)


def finish_jobs(result: ForwardResult, jobs: Sequence[TaskJob]) -> list[Any]:
    """Each job's partial result (`Task.finish`) from `result`, the forward of the jobs' concatenated sequences."""
    tasks = [task_of(job.task) for job in jobs]
    firsts = np.cumsum([0] + [len(job.sequences) for job in jobs]).tolist()  # (J+1,)
    answers = answer_queries(result, [task.head_query(job) for task, job in zip(tasks, jobs)], firsts)
    return [task.finish(job, BatchView(result, first, len(job.sequences), answer))
            for task, job, first, answer in zip(tasks, jobs, firsts, answers)]


def answer_queries(result: ForwardResult, queries: Sequence[HeadQuery | None],
                   firsts: Sequence[int]) -> list[np.ndarray | None]:
    """Per job the answer to its query (None for none): one head pass per kind of query over the whole batch."""
    groups: dict[tuple, list[int]] = {}
    for j, query in enumerate(queries):
        if query is not None:
            kind = ("logprobs",) if query.targets is not None else ("outputs", query.columns)
            groups.setdefault(kind, []).append(j)
    answers: list[np.ndarray | None] = [None] * len(queries)
    for kind, members in groups.items():
        rows = np.concatenate([result.rows(queries[j].sequences + firsts[j], queries[j].positions) for j in members])
        if kind[0] == "logprobs":
            out = result.token_logprobs(rows, np.concatenate([queries[j].targets for j in members]))
        else:
            out = result.head_outputs(rows, kind[1])
        splits = np.cumsum([len(queries[j].positions) for j in members])[:-1]
        for j, part in zip(members, np.split(out, splits)):
            answers[j] = part
    return answers
