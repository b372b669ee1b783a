"""Reranking: score each document against one query, sorted best first.

Causal-LM rerankers (Qwen3-Reranker) answer "yes" or "no" after the prompt; the score is P(yes) from a softmax
over the two logits at the last position (the logit difference with `raw_scores`), as the model card computes
it. Sequence-classification rerankers score the last token with their one-label head; sigmoid unless
`raw_scores`. The query and the template text before the document are one shared prefix, computed once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radix_core.tasks.common import TaskContext, TaskJob, Usage, check_items, check_text
from radix_core.templates import CrossEncoderPair, RerankTemplate
from radix_core.tokenization import EncodedBatch

if TYPE_CHECKING:
    from radix_core.engine import Engine
    from radix_core.tasks.jobs import BatchView


@dataclass(frozen=True)
class RerankHit:
    """One document's score; `index` points into the request's documents."""

    index: int
    score: float
    document: str | None = None


@dataclass(frozen=True)
class RerankResult:
    """Documents by descending score (the first `top_n` when asked), and the call's token usage."""

    results: list[RerankHit]
    usage: Usage


@dataclass(frozen=True)
class RerankJob(TaskJob):
    """One sequence per document, and how to score them: by the no/yes answer logits of a causal LM (`answer_ids`),
    else (None) by the one-label score head."""

    task = "rerank"
    model: str
    answer_ids: tuple[int, int] | None  # (no, yes) token ids
    top_n: int | None
    raw_scores: bool
    documents: list[str] | None  # kept only to return them

    def finish(self, engine: Engine, view: BatchView) -> RerankResult:
        scores = self._scores(engine, view).tolist()
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:self.top_n]
        hits = [RerankHit(i, scores[i], self.documents[i] if self.documents is not None else None) for i in order]
        return RerankResult(hits, view.usage)

    def _scores(self, engine: Engine, view: BatchView) -> torch.Tensor:
        """(n,) float scores from the head at each sequence's last token."""
        last = torch.cat(engine.head_at(view, [[-1]] * view.count))  # (n, out)
        if self.answer_ids is None:
            if last.shape[1] != 1:
                raise ValueError(f"model {self.model!r} has a {last.shape[1]}-label score head; reranking needs a "
                                 f"single relevance logit (num_labels=1)")
            return last[:, 0] if self.raw_scores else last[:, 0].sigmoid()
        no_yes = last[:, list(self.answer_ids)]  # (n, 2)
        return no_yes[:, 1] - no_yes[:, 0] if self.raw_scores else no_yes.softmax(-1)[:, 1]


def rerank_job(task_context: TaskContext, /, query: str, documents: Sequence[str],
               instruction: str | None = None, top_n: int | None = None, return_documents: bool = False,
               raw_scores: bool = False, truncate: bool = True) -> RerankJob:
    """Score `documents` against `query`; see the module docstring for the score of each model kind."""
    check_text("query", query)
    check_items("documents", documents, task_context.config.max_items)
    check_top_n(top_n)
    if task_context.head not in ("causal_lm", "seq_cls"):
        raise ValueError(f"model {task_context.model!r} has no LM or score head, so it cannot rerank: use a "
                         f"causal-LM reranker (Qwen3-Reranker) or a sequence-classification model")
    template = task_context.template("rerank")
    batch = encode_rerank(task_context, template, query, documents, instruction, truncate)
    return RerankJob(batch.sequences, task_context.model, _answer_ids(task_context, template), top_n, raw_scores,
                     list(documents) if return_documents else None)


def check_top_n(top_n: int | None) -> None:
    """None (every document) or at least 1."""
    if top_n is not None and top_n < 1:
        raise ValueError(f"top_n must be at least 1, got {top_n}")


def encode_rerank(context: TaskContext, template: RerankTemplate | CrossEncoderPair, query: str,
                  documents: Sequence[str], instruction: str | None, truncate: bool) -> EncodedBatch:
    """Token ids of every (query, document) prompt; the documents are what truncation cuts."""
    prompts = context.prompt_tokenizer()
    if isinstance(template, CrossEncoderPair):
        template.shared_prefix(query, instruction)  # refuses an instruction
        return prompts.encode_pairs(query, documents, context.token_limit, truncate, what="document")
    parts = template.parts(query, documents, instruction)
    return prompts.encode_prompts(parts, context.token_limit, truncate, what="document")


def _answer_ids(context: TaskContext, template: RerankTemplate | CrossEncoderPair) -> tuple[int, int] | None:
    """(no, yes) token ids a causal-LM reranker is scored by; None for a seq-cls head."""
    if context.head == "seq_cls":
        return None
    if not isinstance(template, RerankTemplate):
        raise ValueError("a causal-LM reranker needs a RerankTemplate naming its yes/no answer tokens")
    prompts = context.prompt_tokenizer()
    return prompts.token_id(template.no_token), prompts.token_id(template.yes_token)
