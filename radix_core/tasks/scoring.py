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

from radix_core.tasks.common import Usage, check_items, check_text, prompt_tokenizer, token_limit
from radix_core.templates import PromptParts, classify_parts
from radix_core.tokenization import ContinuationIds

if TYPE_CHECKING:
    from radix_core.engine import Engine


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


def score(engine: Engine, context: str, continuations: Sequence[str]) -> ScoreResult:
    """Log-probabilities of each continuation after `context`; see the module docstring."""
    check_text("context", context)
    _check_continuations("continuations", continuations, engine.task_config.max_items)
    parts = PromptParts(context, [""], "")
    (items,) = prompt_tokenizer(engine).encode_continuations(parts, continuations, token_limit(engine))
    logprobs, usage = continuation_logprobs(engine, items)
    scores = [ContinuationScore(j, float(lp.sum()), float(lp.mean()), len(lp)) for j, lp in enumerate(logprobs)]
    return ScoreResult(scores, usage)


def classify(engine: Engine, inputs: Sequence[str], labels: Sequence[str], prefix: str = "",
             template: str | Callable[[str], str] | None = None) -> ClassifyResult:
    """Probability of each label after `prefix + template(input)`; see the module docstring. `template` is a
    format string with `{input}` (its text before `{input}` joins the shared prefix) or a callable."""
    max_items = engine.task_config.max_items
    check_items("inputs", inputs, max_items)
    _check_continuations("labels", labels, max_items)
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be distinct, got {list(labels)}")
    parts = classify_parts(prefix, template, inputs)
    rows = prompt_tokenizer(engine).encode_continuations(parts, labels, token_limit(engine), what="label",
                                                         context_what="input")
    logprobs, usage = continuation_logprobs(engine, [item for row in rows for item in row])
    sums = torch.tensor([float(lp.sum()) for lp in logprobs], dtype=torch.float64).view(len(inputs), len(labels))
    return ClassifyResult(list(labels), sums.softmax(-1).numpy(), usage)


def continuation_logprobs(engine: Engine, items: Sequence[ContinuationIds]) -> tuple[list[torch.Tensor], Usage]:
    """Per item the (float32) log-probability of each of its continuation tokens.

    A sequence needs every token but the last as input; items with equal inputs (one input's single-token
    labels) share one sequence. Each sequence asks the head for the union of its items' positions.
    """
    if engine.arch.head != "causal_lm":
        raise ValueError(f"model {engine.model!r} has no LM head ({engine.arch.head}); scoring continuations "
                         f"needs a causal LM")
    slots: dict[tuple[int, ...], int] = {}
    slot_of = [slots.setdefault(tuple(item.ids[:-1]), len(slots)) for item in items]
    wanted: list[set[int]] = [set() for _ in slots]
    for item, slot in zip(items, slot_of):
        wanted[slot].update(range(item.start - 1, len(item.ids) - 1))
    positions = [sorted(p) for p in wanted]
    result = engine.forward([list(seq) for seq in slots])
    logprobs = [logits.log_softmax(-1) for logits in engine.head_at(result, positions)]  # each (P_s, vocab)
    out = []
    for item, slot in zip(items, slot_of):
        row_of = {p: r for r, p in enumerate(positions[slot])}
        rows = [row_of[p] for p in range(item.start - 1, len(item.ids) - 1)]
        targets = torch.tensor(item.ids[item.start:], device=logprobs[slot].device)
        out.append(logprobs[slot][rows].gather(1, targets[:, None])[:, 0].cpu())
    return out, Usage.of(result)


def _check_continuations(what: str, texts: Sequence[str], max_items: int) -> None:
    check_items(what, texts, max_items)
    empty = next((i for i, text in enumerate(texts) if not text), None)
    if empty is not None:
        raise ValueError(f"{what}[{empty}] is empty: every one needs at least one character")
