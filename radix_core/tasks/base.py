"""What every task shares: the `Task` interface each task module implements once, the job it encodes a request
into, the head query a job asks of the batch, and the check of encoded continuations.

A task is one object (`radix_core.tasks.registry`) that owns everything about it, with its request type
(`radix_core.tasks.request.TaskRequest`) and its job type:

    job = task.encode(context, request)        # check the request, render the template, tokenize (CPU)
    parts = task.split(job, max_tokens)        # token-bounded sub-jobs that keep the shared prefix
    partial = task.finish(part, view)          # a sub-job's result from its slice of a batch's forward
    result = task.merge(job, partials)         # one result, as if the request had run whole
    task.to_dict(result)                       # the response's fields, as the transports name them

A job holds token ids (`TokenSequences`), never text the engine would tokenize again, and what finishing needs.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from radix_core.continuations import EncodedContinuations, continuation_name
from radix_core.errors import RequestError
from radix_core.tasks.context import TaskContext
from radix_core.tasks.request import TaskRequest
from radix_core.tasks.view import BatchView
from radix_core.tokens import TokenSequences


@dataclass(frozen=True)
class HeadQuery:
    """Head outputs a job needs, answered for the whole batch at once (`radix_core.finish.answer_queries`):
    at position `positions[i]` (negative from the end) of the job's sequence `sequences[i]`, either the head's
    outputs (`columns` of them, or all) or, with `targets`, the log-probability of token `targets[i]`."""

    sequences: np.ndarray  # (P,) int64
    positions: np.ndarray  # (P,) int64
    targets: np.ndarray | None = None  # (P,) int64 token ids
    columns: tuple[int, ...] | None = None

    def select(self, keep: slice, first_sequence: int) -> HeadQuery:
        """Queries `keep`, their sequences renumbered from `first_sequence`."""
        targets = None if self.targets is None else self.targets[keep]
        return replace(self, sequences=self.sequences[keep] - first_sequence, positions=self.positions[keep],
                       targets=targets)


@dataclass(frozen=True)
class TaskJob:
    """One request (or a part of one), validated and tokenized; picklable. Every sequence starts with the
    request's `shared_len` shared ids, the prefix the routing key hashes. The split unit is an *item*; by default
    item i is sequence i (a document, a text). `origin` names the request: drawn when it is encoded, kept by its
    parts (the prefix cache admits an item's own rows once a second request has them, `radix_core.prefix_cache`)."""

    sequences: TokenSequences
    shared_len: int
    origin: int = field(default_factory=lambda: int.from_bytes(os.urandom(8)) >> 1, compare=False, kw_only=True)

    @property
    def num_tokens(self) -> int:
        return self.sequences.num_tokens

    @property
    def work_tokens(self) -> int:
        """Rows the engine computes for this job alone, at most: the shared prefix once, then each sequence's own
        tokens after it (the price of its admission; sequences that share more than the prefix cost less)."""
        return self.num_tokens - (len(self.sequences) - 1) * self.shared_len

    @property
    def shared_ids(self) -> np.ndarray:
        """(shared_len,) int32 ids every sequence starts with."""
        return self.sequences.ids[:self.shared_len]

    def item_tokens(self) -> np.ndarray:
        """(I,) int64 tokens each item brings."""
        return self.sequences.lengths

    def select(self, start: int, end: int) -> TaskJob:
        """Items `start .. end - 1` as a job of their own."""
        return replace(self, sequences=self.sequences.select(start, end))


class Task(ABC):
    """One task: its request type, template and encoding, split and merge, finishing and response fields.

    `name` is how users and configs name it (`Engine.rerank`, `templates: {rerank: ...}`, metrics' task label),
    `rpc` its gRPC method of radixserve.v1.Scoring (messages `{rpc}Request`/`{rpc}Response`); the registry finds a
    task by the type of its request or of its job.
    """

    name: ClassVar[str]
    rpc: ClassVar[str]
    request_type: ClassVar[type[TaskRequest]]
    job_type: ClassVar[type[TaskJob]]

    def encode(self, context: TaskContext, request: TaskRequest | Mapping[str, Any]) -> TaskJob:
        """Check and tokenize one request: a `request_type`, or a mapping of its fields (unknown and missing
        keys are named); bad input raises a `RequestError` saying what is wrong."""
        request = self.request_type.of(request, self.name)
        request.check(context.config.max_items)
        return self.job(context, request)

    @abstractmethod
    def job(self, context: TaskContext, request: Any) -> TaskJob:
        """The job of a checked request (of `request_type`); checks what depends on the model."""

    def split(self, job: TaskJob, max_tokens: int) -> list[TaskJob]:
        """Sub-jobs of at most `max_tokens` each (unless one item alone is larger), items in order; each starts
        with the request's shared ids, so all keep its routing key. Token counts are exact."""
        bounds = _chunks(job.item_tokens(), max_tokens)
        return [job] if len(bounds) == 1 else [job.select(start, end) for start, end in bounds]

    def head_query(self, job: TaskJob) -> HeadQuery | None:
        """The head outputs `finish` reads (`view.head`); None when it reads hidden states only."""
        return None

    def reads(self, job: TaskJob) -> tuple[np.ndarray, np.ndarray] | None:
        """(sequences, positions) of the final hidden states `finish` reads, as a `HeadQuery` names them; None for
        every token's. The engine finishes the last layer on their rows only (`Engine.run`'s `reads`). By default
        the head query's."""
        query = self.head_query(job)
        return None if query is None else (query.sequences, query.positions)

    @abstractmethod
    def finish(self, job: TaskJob, view: BatchView) -> Any:
        """The job's partial result (with `view.usage`) from its slice of the batch's forward."""

    @abstractmethod
    def merge(self, job: TaskJob, partials: Sequence[Any]) -> Any:
        """The request's result from its sub-jobs' partial results, in `split` order."""

    @abstractmethod
    def to_dict(self, result: Any) -> dict[str, Any]:
        """The result as the response's fields (the names of `{rpc}Response` in the gRPC API)."""


def _chunks(costs: np.ndarray, max_tokens: int) -> list[tuple[int, int]]:
    """`(start, end)` item ranges of at most `max_tokens` (a single larger item alone), greedy in order."""
    bounds, start, total = [], 0, 0
    for i, cost in enumerate(costs.tolist()):
        if i > start and total + cost > max_tokens:
            bounds.append((start, i))
            start, total = i, 0
        total += cost
    bounds.append((start, len(costs)))
    return bounds


def check_continuations(encoded: EncodedContinuations, limit: int, what: str = "continuation",
                        context_what: str | None = None) -> None:
    """Every continuation adds tokens to a context of at least one, within `limit` tokens in all; errors name
    continuation j of context i as `radix_core.continuations.continuation_name` does."""
    for i, row in enumerate(encoded.rows):
        for j, item in enumerate(row):
            name = continuation_name(i, j, what, context_what)
            if item.start >= len(item.ids):
                raise RequestError(f"{name} adds no tokens to the context", f"give a non-empty {what}")
            if item.start == 0:
                raise RequestError(f"{name} starts the sequence", "the context must give at least one token before it")
            if len(item.ids) > limit:
                raise RequestError(f"{name} gives a sequence of {len(item.ids)} tokens; the limit is {limit}",
                                   f"shorten the context or the {what}", limit=limit)
