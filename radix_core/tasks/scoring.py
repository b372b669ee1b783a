"""Continuation scoring and classification by the LM's next-token distribution.

`score(context, continuations)`: per continuation the summed and mean log-probability of its tokens given the
context and the continuation's earlier tokens (multiple-choice scoring). `classify(inputs, labels)`: each label is
scored as a continuation of `prefix + template(input)` and the probability over labels is the softmax of those
summed log-probabilities, so labels of several tokens are scored exactly (their full sequence); for single-token
labels this is the softmax of the label logits at the last position.

Each (context, continuation) pair is one sequence; the shared context is one prefix in the batch and is computed
once, and identical sequences (single-token labels of one input) are sent once. The LM head runs only on the
rows that predict continuation tokens (`Engine.head_at`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from radix_core.tasks.common import TaskContext, TaskJob, Usage, check_items, check_text
from radix_core.templates import PromptParts, classify_parts
from radix_core.tokenization import ContinuationIds

if TYPE_CHECKING:
    from radix_core.engine import Engine
    from radix_core.tasks.jobs import BatchView


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
class ContinuationPick:
    """Where one continuation's log-probabilities are read: rows `rows` of the head outputs of `sequence`, which
    predict `targets`, the continuation's token ids."""

    sequence: int
    rows: list[int]
    targets: list[int]


@dataclass(frozen=True)
class ContinuationJob(TaskJob):
    """Continuations as sequences: a sequence is every token of an item but the last; items with equal inputs
    (one input's single-token labels) share one sequence, which asks the head for the union of their positions."""

    positions: list[list[int]]  # per sequence, the sorted positions the LM head runs at
    picks: list[ContinuationPick]  # per item

    def logprobs(self, engine: Engine, view: BatchView) -> list[torch.Tensor]:
        """Per item the (float32) log-probability of each of its continuation tokens."""
        logprobs = [logits.log_softmax(-1) for logits in engine.head_at(view, self.positions)]  # each (P_s, vocab)
        out = []
        for pick in self.picks:
            targets = torch.tensor(pick.targets, device=logprobs[pick.sequence].device)  # (T,)
            out.append(logprobs[pick.sequence][pick.rows].gather(1, targets[:, None])[:, 0].cpu())
        return out


@dataclass(frozen=True)
class ScoreJob(ContinuationJob):
    """Items are the continuations, in request order."""

    task = "score"

    def finish(self, engine: Engine, view: BatchView) -> ScoreResult:
        logprobs = self.logprobs(engine, view)
        scores = [ContinuationScore(j, float(lp.sum()), float(lp.mean()), len(lp)) for j, lp in enumerate(logprobs)]
        return ScoreResult(scores, view.usage)


@dataclass(frozen=True)
class ClassifyJob(ContinuationJob):
    """Items are input-major: item `i * len(labels) + j` is label j after input i."""

    task = "classify"
    labels: list[str]

    def finish(self, engine: Engine, view: BatchView) -> ClassifyResult:
        sums = torch.tensor([float(lp.sum()) for lp in self.logprobs(engine, view)], dtype=torch.float64)
        probabilities = sums.view(-1, len(self.labels)).softmax(-1)  # (n_inputs, n_labels)
        return ClassifyResult(list(self.labels), probabilities.numpy(), view.usage)


def score_job(task_context: TaskContext, /, context: str, continuations: Sequence[str]) -> ScoreJob:
    """Log-probabilities of each continuation after `context`; see the module docstring."""
    check_text("context", context)
    _check_continuations("continuations", continuations, task_context.config.max_items)
    parts = PromptParts(context, [""], "")
    prompts = task_context.prompt_tokenizer()
    (items,) = prompts.encode_continuations(parts, continuations, task_context.token_limit)
    return ScoreJob(*_layout(task_context, items))


def classify_job(task_context: TaskContext, /, inputs: Sequence[str], labels: Sequence[str], prefix: str = "",
                 template: str | Callable[[str], str] | None = None) -> ClassifyJob:
    """Probability of each label after `prefix + template(input)`; see the module docstring. `template` is a
    format string with `{input}` (its text before `{input}` joins the shared prefix) or a callable; a request
    encoded in another process must hold a string, as a callable need not pickle (the job never holds it)."""
    max_items = task_context.config.max_items
    check_items("inputs", inputs, max_items)
    _check_continuations("labels", labels, max_items)
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be distinct, got {list(labels)}")
    parts = classify_parts(prefix, template, inputs)
    rows = task_context.prompt_tokenizer().encode_continuations(parts, labels, task_context.token_limit,
                                                                what="label", context_what="input")
    return ClassifyJob(*_layout(task_context, [item for row in rows for item in row]), labels=list(labels))


def _layout(context: TaskContext, items: Sequence[ContinuationIds]
            ) -> tuple[list[list[int]], list[list[int]], list[ContinuationPick]]:
    """(sequences, positions, picks) of `ContinuationJob` for `items`: a sequence needs every token of an item
    but the last as input, and position p predicts token p + 1."""
    if context.head != "causal_lm":
        raise ValueError(f"model {context.model!r} has no LM head ({context.head}); scoring continuations "
                         f"needs a causal LM")
    slots: dict[tuple[int, ...], int] = {}
    slot_of = [slots.setdefault(tuple(item.ids[:-1]), len(slots)) for item in items]
    wanted: list[set[int]] = [set() for _ in slots]
    for item, slot in zip(items, slot_of):
        wanted[slot].update(range(item.start - 1, len(item.ids) - 1))
    positions = [sorted(p) for p in wanted]
    row_of = [{p: r for r, p in enumerate(ps)} for ps in positions]
    picks = [ContinuationPick(slot, [row_of[slot][p] for p in range(item.start - 1, len(item.ids) - 1)],
                              item.ids[item.start:]) for item, slot in zip(items, slot_of)]
    return [list(seq) for seq in slots], positions, picks


def _check_continuations(what: str, texts: Sequence[str], max_items: int) -> None:
    check_items(what, texts, max_items)
    empty = next((i for i, text in enumerate(texts) if not text), None)
    if empty is not None:
        raise ValueError(f"{what}[{empty}] is empty: every one needs at least one character")
