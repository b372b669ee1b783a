"""Continuation scoring and classification by the LM's next-token distribution.

`score(context, continuations)`: per continuation the summed and mean log-probability of its tokens given the
context and the continuation's earlier tokens (multiple-choice scoring). `classify(inputs, labels)`: each label is
scored as a continuation of `prefix + template(input)` and the probability over labels is the softmax of those
summed log-probabilities, so labels of several tokens are scored exactly (their full sequence); for single-token
labels this is the softmax of the label logits at the last position.

Each (context, continuation) pair is one sequence; the shared context is one prefix in the batch and is computed
once, and identical sequences (single-token labels of one input) are sent once. Each continuation token is one
head query (`HeadQuery` with targets): the LM head runs only on the rows that predict continuation tokens, and
their log-softmax is computed by vocabulary chunks (`ForwardResult.token_logprobs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from radix_core.continuations import EncodedContinuations
from radix_core.errors import RequestError
from radix_core.tasks.base import HeadQuery, Task, TaskJob, check_continuations
from radix_core.tasks.context import TaskContext
from radix_core.tasks.request import TaskRequest, items, optional_text, template_or_text, text
from radix_core.tasks.usage import Usage
from radix_core.tasks.view import BatchView
from radix_core.templates import PromptParts, classify_parts
from radix_core.tokens import TokenSequences


@dataclass(frozen=True)
class ScoreRequest(TaskRequest):
    """Log-probabilities of each of `continuations` after `context`; see the module docstring."""

    context: str = text()
    continuations: Sequence[str] = items()


@dataclass(frozen=True)
class ClassifyRequest(TaskRequest):
    """Probability of each of `labels` after `prefix + template(input)` for each of `inputs`; see the module
    docstring. `template` is a format string with `{input}` (its text before `{input}` joins the shared prefix) or
    a callable; a request encoded in another process must hold a string, as a callable need not pickle (the job
    never holds it).

    Every (input, label) pair is a sequence, so `max_items` bounds their number, inputs x labels, as it bounds a
    rerank's documents; a request over it is refused before anything is tokenized."""

    inputs: Sequence[str] = items()
    labels: Sequence[str] = items()
    prefix: str = optional_text("")
    template: str | Callable[[str], str] | None = template_or_text()


@dataclass(frozen=True)
class ContinuationScore:
    """Log-probability of one continuation's `num_tokens` tokens: summed (`logprob`) and per token."""

    index: int
    logprob: float
    mean_logprob: float
    num_tokens: int


@dataclass(frozen=True)
class ScoreResult:
    """One score per continuation, in request order; and the call's token usage."""

    scores: list[ContinuationScore]
    usage: Usage


@dataclass(frozen=True)
class ClassifyResult:
    """`probabilities` (n_inputs, n_labels) float64, rows summing to 1, columns in `labels` order."""

    labels: list[str]
    probabilities: np.ndarray
    usage: Usage

    @property
    def predictions(self) -> list[str]:
        """The most probable label of each input."""
        return [self.labels[j] for j in self.probabilities.argmax(1)]


@dataclass(frozen=True)
class ItemLogprobs:
    """A sub-job's partial result: per item the log-probabilities of its continuation tokens."""

    logprobs: list[np.ndarray]  # per item (T_i,) float32
    usage: Usage


@dataclass(frozen=True)
class ContinuationJob(TaskJob):
    """Continuations as sequences: a sequence is every token of an item but the last, and each continuation token
    is one head query (the position before it, the token as target). Items come in groups of `group_size` (one
    classify input's labels, or one scored continuation); a group's items with equal inputs share one sequence,
    and a split keeps groups whole."""

    group_cu: np.ndarray  # (G+1,) int64 sequences of each group
    group_size: int  # items per group
    queries: HeadQuery  # one per continuation token, item by item
    item_cu: np.ndarray  # (I+1,) int64 queries of each item

    def item_tokens(self) -> np.ndarray:
        """(G,) tokens of each group: the unit a split cuts at."""
        return np.diff(self.sequences.cu[self.group_cu])

    def select(self, start: int, end: int) -> ContinuationJob:
        first, last = int(self.group_cu[start]), int(self.group_cu[end])
        q0, q1 = self.item_cu[[start * self.group_size, end * self.group_size]].tolist()
        return replace(self, sequences=self.sequences.select(first, last),
                       group_cu=self.group_cu[start:end + 1] - first,
                       queries=self.queries.select(slice(q0, q1), first),
                       item_cu=self.item_cu[start * self.group_size:end * self.group_size + 1] - q0)


@dataclass(frozen=True)
class ScoreJob(ContinuationJob):
    """Items are the continuations, in request order, one per group."""


@dataclass(frozen=True)
class ClassifyJob(ContinuationJob):
    """Items are input-major: item `i * len(labels) + j` is label j after input i; a group is one input."""

    labels: tuple[str, ...]


class ContinuationTask(Task):
    """What scoring and classification share: the head query and the item log-probabilities."""

    def head_query(self, job: ContinuationJob) -> HeadQuery:
        return job.queries

    def item_logprobs(self, job: ContinuationJob, view: BatchView) -> ItemLogprobs:
        return ItemLogprobs(np.split(view.head, job.item_cu[1:-1]), view.usage)

    def finish(self, job: ContinuationJob, view: BatchView) -> ItemLogprobs:
        return self.item_logprobs(job, view)


class ScoreTask(ContinuationTask):
    name = "score"
    rpc = "Score"
    request_type = ScoreRequest
    job_type = ScoreJob

    def job(self, task_context: TaskContext, request: ScoreRequest) -> ScoreJob:
        prompts = task_context.prompt_tokenizer()
        encoded = prompts.encode_continuations(
            PromptParts(request.context, [""], ""), request.continuations, task_context.token_limit,
            special_tokens_in_user_text=task_context.config.special_tokens_in_user_text)
        check_continuations(encoded, task_context.token_limit)
        return ScoreJob(*_layout(task_context, encoded, group_size=1))

    def merge(self, job: ScoreJob, partials: Sequence[ItemLogprobs]) -> ScoreResult:
        logprobs = [lp for p in partials for lp in p.logprobs]
        scores = [ContinuationScore(j, float(lp.sum()), float(lp.mean()), len(lp)) for j, lp in enumerate(logprobs)]
        return ScoreResult(scores, Usage.total([p.usage for p in partials]))

    def to_dict(self, result: ScoreResult) -> dict[str, Any]:
        scores = [{"index": s.index, "logprob": s.logprob, "mean_logprob": s.mean_logprob, "num_tokens": s.num_tokens}
                  for s in result.scores]
        return {"scores": scores, "usage": result.usage.to_dict()}


class ClassifyTask(ContinuationTask):
    name = "classify"
    rpc = "Classify"
    request_type = ClassifyRequest
    job_type = ClassifyJob

    def job(self, task_context: TaskContext, request: ClassifyRequest) -> ClassifyJob:
        inputs, labels = request.inputs, request.labels
        _check_pairs(len(inputs), len(labels), task_context.config.max_items)
        if len(set(labels)) != len(labels):
            raise RequestError.about("labels", f"must be distinct, got {list(labels)}", "send each label once")
        parts = classify_parts(request.prefix, request.template, inputs)
        special = task_context.config.special_tokens_in_user_text
        encoded = task_context.prompt_tokenizer().encode_continuations(parts, labels, task_context.token_limit,
                                                                       what="label", context_what="input",
                                                                       special_tokens_in_user_text=special)
        check_continuations(encoded, task_context.token_limit, what="label", context_what="input")
        return ClassifyJob(*_layout(task_context, encoded, group_size=len(labels)), labels=tuple(labels))

    def merge(self, job: ClassifyJob, partials: Sequence[ItemLogprobs]) -> ClassifyResult:
        sums = torch.tensor([float(lp.sum()) for p in partials for lp in p.logprobs], dtype=torch.float64)
        probabilities = sums.view(-1, len(job.labels)).softmax(-1)  # (n_inputs, n_labels)
        return ClassifyResult(list(job.labels), probabilities.numpy(), Usage.total([p.usage for p in partials]))

    def to_dict(self, result: ClassifyResult) -> dict[str, Any]:
        rows = [{"probabilities": row, "label": label}
                for row, label in zip(result.probabilities.tolist(), result.predictions)]  # (n, L) -> n rows
        return {"labels": list(result.labels), "results": rows, "usage": result.usage.to_dict()}


def _layout(context: TaskContext, encoded: EncodedContinuations, group_size: int
            ) -> tuple[TokenSequences, int, np.ndarray, int, HeadQuery, np.ndarray]:
    """The fields of a `ContinuationJob` (sequences, shared_len, group_cu, group_size, queries, item_cu) for the
    encoded items, input-major, in groups of `group_size`: a sequence is every token of an item but the last,
    position p predicts token p + 1, and within a group items with equal inputs share a sequence."""
    if context.head != "causal_lm":
        raise RequestError(f"model {context.model!r} has no LM head ({context.head}); scoring continuations "
                           f"needs a causal LM")
    items = [item for row in encoded.rows for item in row]
    sequences: list[list[int]] = []
    group_cu, query_seq, query_pos, targets, item_cu = [0], [], [], [], [0]
    for g in range(0, len(items), group_size):
        slots: dict[tuple[int, ...], int] = {}
        for item in items[g:g + group_size]:
            key = tuple(item.ids[:-1])
            if key not in slots:
                slots[key] = len(sequences)
                sequences.append(item.ids[:-1])
            positions = range(item.start - 1, len(item.ids) - 1)
            query_seq += [slots[key]] * len(positions)
            query_pos += positions
            targets += item.ids[item.start:]
            item_cu.append(len(targets))
        group_cu.append(len(sequences))
    queries = HeadQuery(np.array(query_seq, dtype=np.int64), np.array(query_pos, dtype=np.int64),
                        targets=np.array(targets, dtype=np.int64))
    return (TokenSequences.from_lists(sequences), len(encoded.shared_ids), np.array(group_cu, dtype=np.int64),
            group_size, queries, np.array(item_cu, dtype=np.int64))


def _check_pairs(num_inputs: int, num_labels: int, max_items: int) -> None:
    """At most `max_items` (input, label) sequences in one classify call (each count alone is within it)."""
    if num_inputs * num_labels > max_items:
        raise RequestError.about("inputs", f"x labels is {num_inputs} x {num_labels} = {num_inputs * num_labels} "
                                 f"sequences, more than the limit of {max_items} per call",
                                 f"send at most {max_items // num_labels} inputs with {num_labels} labels per "
                                 "request, or raise max_items in the task config", limit=max_items)
