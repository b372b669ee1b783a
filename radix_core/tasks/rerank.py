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

from radix_core.tasks.common import Usage, check_items, check_text, prompt_tokenizer, template_for, token_limit
from radix_core.templates import CrossEncoderPair, RerankTemplate
from radix_core.tokenization import EncodedBatch

if TYPE_CHECKING:
    from radix_core.engine import Engine, ForwardResult


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


def rerank(engine: Engine, query: str, documents: Sequence[str], instruction: str | None = None,
           top_n: int | None = None, return_documents: bool = False, raw_scores: bool = False,
           truncate: bool = True) -> RerankResult:
    """Score `documents` against `query`; see the module docstring for the score of each model kind."""
    check_text("query", query)
    check_items("documents", documents, engine.task_config.max_items)
    if top_n is not None and top_n < 1:
        raise ValueError(f"top_n must be at least 1, got {top_n}")
    if engine.arch.head not in ("causal_lm", "seq_cls"):
        raise ValueError(f"model {engine.model!r} has no LM or score head, so it cannot rerank: use a "
                         f"causal-LM reranker (Qwen3-Reranker) or a sequence-classification model")
    template = template_for(engine, "rerank")
    batch = encode_rerank(engine, template, query, documents, instruction, truncate)
    result = engine.forward(batch.sequences)
    scores = _scores(engine, template, result, len(documents), raw_scores).tolist()
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_n]
    hits = [RerankHit(i, scores[i], documents[i] if return_documents else None) for i in order]
    return RerankResult(hits, Usage.of(result))


def encode_rerank(engine: Engine, template: RerankTemplate | CrossEncoderPair, query: str,
                  documents: Sequence[str], instruction: str | None, truncate: bool) -> EncodedBatch:
    """Token ids of every (query, document) prompt; the documents are what truncation cuts."""
    prompts = prompt_tokenizer(engine)
    if isinstance(template, CrossEncoderPair):
        template.shared_prefix(query, instruction)  # refuses an instruction
        return prompts.encode_pairs(query, documents, token_limit(engine), truncate, what="document")
    parts = template.parts(query, documents, instruction)
    return prompts.encode_prompts(parts, token_limit(engine), truncate, what="document")


def _scores(engine: Engine, template: RerankTemplate | CrossEncoderPair, result: ForwardResult, n: int,
            raw_scores: bool) -> torch.Tensor:
    """(n,) float scores from the head at each sequence's last token."""
    last = torch.cat(engine.head_at(result, [[-1]] * n))  # (n, out)
    if engine.arch.head == "seq_cls":
        if last.shape[1] != 1:
            raise ValueError(f"model {engine.model!r} has a {last.shape[1]}-label score head; reranking needs a "
                             f"single relevance logit (num_labels=1)")
        return last[:, 0] if raw_scores else last[:, 0].sigmoid()
    if not isinstance(template, RerankTemplate):
        raise ValueError("a causal-LM reranker needs a RerankTemplate naming its yes/no answer tokens")
    prompts = prompt_tokenizer(engine)
    yes_no = last[:, [prompts.token_id(template.no_token), prompts.token_id(template.yes_token)]]  # (n, 2)
    return yes_no[:, 1] - yes_no[:, 0] if raw_scores else yes_no.softmax(-1)[:, 1]
