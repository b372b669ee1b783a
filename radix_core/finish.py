"""Finishing the jobs of one batch: every job's head query answered in one pass, then each job from its own view.

    results = finish_jobs(forward_result, jobs)   # partial results, in job order (`Engine.run_jobs`)

Jobs of any tasks share a batch; each job's task is found by the job's type (`radix_core.tasks.task_for`). Their
head queries are grouped by what they ask (log-probabilities, or the outputs of one set of columns) and each group
runs the head once over the distinct rows of the whole batch (`ForwardResult.head_outputs` / `token_logprobs`), so
a batch of 64 rerank requests is one head call, one upload and one download. This is the engine's side: the tasks
never call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from radix_core.forward_result import ForwardResult, token_index
from radix_core.tasks import BatchView, HeadQuery, TaskJob, task_for


def finish_jobs(result: ForwardResult, jobs: Sequence[TaskJob]) -> list[Any]:
    """Each job's partial result (`Task.finish`) from `result`, the forward of the jobs' concatenated sequences."""
    tasks = [task_for(job) for job in jobs]
    firsts = np.cumsum([0] + [len(job.sequences) for job in jobs]).tolist()  # (J+1,)
    answers = answer_queries(result, [task.head_query(job) for task, job in zip(tasks, jobs)], firsts)
    return [task.finish(job, BatchView(result, first, len(job.sequences), answer))
            for task, job, first, answer in zip(tasks, jobs, firsts, answers)]


def read_tokens(jobs: Sequence[TaskJob], cu_seqlens: np.ndarray) -> np.ndarray | None:
    """(T,) int64 the tokens whose final states finishing `jobs` reads (`Task.reads`), as indices into the batch of
    their concatenated sequences (boundaries `cu_seqlens`); None when a job reads every token's."""
    firsts = np.cumsum([0] + [len(job.sequences) for job in jobs]).tolist()
    parts = []
    for job, first in zip(jobs, firsts):
        reads = task_for(job).reads(job)
        if reads is None:
            return None
        sequences, positions = reads
        parts.append(token_index(cu_seqlens, sequences + first, positions))
    return np.concatenate(parts)


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
