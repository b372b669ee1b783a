"""Reranking: score each document against one query, sorted best first.

Causal-LM rerankers (Qwen3-Reranker) answer "yes" or "no" after the prompt; the score is P(yes) from a softmax
over the two logits at the last position (the logit difference with `raw_scores`), as the model card computes
it, with only those two rows of the LM head computed, in float32. Sequence-classification rerankers score the
last token with their one-label head; sigmoid unless `raw_scores`. The query and the template text before the
document are one shared prefix, computed once.

A document longer than the prompt's room is cut (`long_documents="truncate"`) or scored by chunks
(`long_documents="chunk"`, `radix_core.chunking`): each chunk is a document of its own in the same prompt, so the
shared prefix is computed once for all chunks of all documents; the document's score pools its chunks' (`pool`)
and its hit carries the best chunk's character span (`best_span`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from radix_core.chunk_spec import LONG_DOCUMENTS, POOLS
from radix_core.chunking import Chunks, chunk_documents, pool_scores
from radix_core.errors import Items, RequestError
from radix_core.prompt_encoding import EncodedBatch
from radix_core.tasks.base import HeadQuery, Task, TaskJob
from radix_core.tasks.context import TaskContext
from radix_core.tasks.request import (
    TRUNCATION_DIRECTIONS,
    TaskRequest,
    choice,
    flag,
    items,
    optional_choice,
    optional_text,
    text,
    token_cap,
    whole,
)
from radix_core.tasks.usage import Usage
from radix_core.tasks.view import BatchView
from radix_core.templates import CrossEncoderPair, RerankTemplate

DOCUMENTS = Items("documents", "document")  # document 2 of a message is documents[2]


@dataclass(frozen=True)
class RerankRequest(TaskRequest):
    """Score `documents` against `query`; see the module docstring for the score of each model kind.

    `instruction`: the task's instruction in the template (a causal-LM reranker's). `top_n`: return only the best
    `top_n`. `return_documents`: echo each document in its hit. `raw_scores`: the logit difference (or the score
    head's logit) instead of a probability. `truncate`: cut a document whose prompt exceeds the per-sequence token
    limit (False: refuse it). `max_document_tokens`: first cut each document to at most that many tokens of its
    own (Cohere's `max_tokens_per_doc`). `truncation_direction`: "right" cuts a document's end, "left" its start.
    Every cut is at a token boundary and the prompt is tokenized with the kept text, as the tokenizer would
    encode it.

    `long_documents`: "truncate" (as above) or "chunk": score each document by windows of at most `chunk_tokens`
    of its own tokens (and what fits the limit beside the prompt), neighbours sharing `chunk_overlap_tokens`, at
    most `max_chunks_per_document` (more: its first ones with `truncate`, its last with `truncation_direction`
    "left", else refused); its score is the `pool` ("max", "mean" or "first") of its chunks' scores and its hit
    the best chunk's `best_span`. Unset (None), each takes the task config's default (`TaskConfig`).
    """

    query: str = text()
    documents: Sequence[str] = items()
    instruction: str | None = optional_text()
    top_n: int | None = whole(at_least=1)
    return_documents: bool = flag(False)
    raw_scores: bool = flag(False)
    truncate: bool = flag(True)
    max_document_tokens: int | None = token_cap()
    truncation_direction: str = choice(TRUNCATION_DIRECTIONS, "right", " (the side of a text that is cut)")
    long_documents: str | None = optional_choice(LONG_DOCUMENTS, " (what a document longer than the limit gets)")
    chunk_tokens: int | None = whole(at_least=1)
    chunk_overlap_tokens: int | None = whole(at_least=0)
    max_chunks_per_document: int | None = whole(at_least=1)
    pool: str | None = optional_choice(POOLS, " (how a document's score comes from its chunks')")


@dataclass(frozen=True)
class RerankHit:
    """One document's score; `index` points into the request's documents. `best_span`: the [start, end)
    character offsets of its best chunk in the document, when it was scored by chunks."""

    index: int
    score: float
    document: str | None = None
    best_span: tuple[int, int] | None = None


@dataclass(frozen=True)
class RerankResult:
    """Documents by descending score (the first `top_n` when asked), and the call's token usage."""

    results: list[RerankHit]
    usage: Usage


@dataclass(frozen=True)
class RerankScores:
    """A sub-job's partial result: one score per document, in order."""

    scores: np.ndarray  # (n,) float32
    usage: Usage


@dataclass(frozen=True)
class RerankJob(TaskJob):
    """One sequence per document, or per chunk of a document (`chunks`); scored by the (no, yes) answer logits of
    a causal LM (`answer_ids`), else (None) by the one-label score head. `top_n`, `documents` and the pooling of
    chunks apply when the parts are merged."""

    answer_ids: tuple[int, int] | None  # (no, yes) token ids
    raw_scores: bool
    top_n: int | None
    documents: tuple[str, ...] | None  # kept only to return them; sub-jobs carry none
    chunks: Chunks | None  # the documents' chunks, one sequence each; None: one sequence per document
    pool: str

    def select(self, start: int, end: int) -> RerankJob:
        return replace(self, sequences=self.sequences.select(start, end), documents=None, chunks=None)


class RerankTask(Task):
    name = "rerank"
    rpc = "Rerank"
    request_type = RerankRequest
    job_type = RerankJob

    def job(self, context: TaskContext, request: RerankRequest) -> RerankJob:
        if context.head not in ("causal_lm", "seq_cls"):
            raise RequestError(f"model {context.model!r} has no LM or score head, so it cannot rerank",
                               "use a causal-LM reranker (Qwen3-Reranker) or a sequence-classification model")
        if context.head == "seq_cls" and context.num_labels != 1:
            raise RequestError(f"model {context.model!r} has a {context.num_labels}-label score head; reranking "
                               f"needs a single relevance logit (num_labels=1)")
        template = context.template(self.name)
        answer_ids = _answer_ids(context, template)
        config = context.config
        spec = config.chunk_spec(request.long_documents, request.chunk_tokens, request.chunk_overlap_tokens,
                                 request.max_chunks_per_document, request.truncate, request.truncation_direction,
                                 request.max_document_tokens)
        encode = partial(encode_rerank, context, template, request.query, instruction=request.instruction,
                         truncation_direction=request.truncation_direction)
        if spec is None:
            chunks, batch = None, encode(request.documents, truncate=request.truncate,
                                         max_document_tokens=request.max_document_tokens)
        else:
            chunks, batch = chunk_documents(
                context.prompt_tokenizer(), request.documents, spec,
                partial(encode, truncate=True, max_document_tokens=None), context.token_limit, config.max_items,
                DOCUMENTS, config.special_tokens_in_user_text)
        return RerankJob(batch.sequences, len(batch.shared_ids), answer_ids,
                         request.raw_scores, request.top_n,
                         tuple(request.documents) if request.return_documents else None, chunks,
                         request.pool or config.pool)

    def head_query(self, job: RerankJob) -> HeadQuery:
        n = len(job.sequences)
        return HeadQuery(np.arange(n), np.full(n, -1), columns=job.answer_ids)

    def finish(self, job: RerankJob, view: BatchView) -> RerankScores:
        last = torch.from_numpy(view.head)  # (n, 2) no/yes logits, or (n, 1) of the score head
        if job.answer_ids is None:
            scores = last[:, 0] if job.raw_scores else last[:, 0].sigmoid()
        else:
            scores = last[:, 1] - last[:, 0] if job.raw_scores else last.softmax(-1)[:, 1]
        return RerankScores(scores.numpy(), view.usage)

    def merge(self, job: RerankJob, partials: Sequence[RerankScores]) -> RerankResult:
        scores = np.concatenate([p.scores for p in partials])  # (n,) one per sequence
        spans = None
        if job.chunks is not None:
            scores, best = pool_scores(scores, job.chunks, job.pool)  # (D,) per document
            spans = [tuple(span) for span in job.chunks.spans[best].tolist()]
        scores = scores.tolist()
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:job.top_n]
        documents = job.documents
        hits = [RerankHit(i, scores[i], documents[i] if documents is not None else None,
                          spans[i] if spans is not None else None) for i in order]
        return RerankResult(hits, Usage.total([p.usage for p in partials]))

    def to_dict(self, result: RerankResult) -> dict[str, Any]:
        return {"results": [_hit_fields(hit) for hit in result.results], "usage": result.usage.to_dict()}


def _hit_fields(hit: RerankHit) -> dict[str, Any]:
    """The fields of a `RerankHit` message; `document` and `best_span` only when set."""
    fields: dict[str, Any] = {"index": hit.index, "score": hit.score}
    if hit.document is not None:
        fields["document"] = hit.document
    if hit.best_span is not None:
        fields["best_span"] = {"start": hit.best_span[0], "end": hit.best_span[1]}
    return fields


def encode_rerank(context: TaskContext, template: RerankTemplate | CrossEncoderPair, query: str,
                  documents: Sequence[str], instruction: str | None, truncate: bool, truncation_direction: str,
                  max_document_tokens: int | None) -> EncodedBatch:
    """Token ids of every (query, document) prompt; the documents are what truncation cuts."""
    prompts = context.prompt_tokenizer()
    cut = {"truncation_direction": truncation_direction, "max_item_tokens": max_document_tokens,
           "special_tokens_in_user_text": context.config.special_tokens_in_user_text}
    if isinstance(template, CrossEncoderPair):
        template.shared_prefix(query, instruction)  # refuses an instruction
        return prompts.encode_pairs(query, documents, context.token_limit, truncate, DOCUMENTS, **cut)
    parts = template.parts(query, documents, instruction)
    return prompts.encode_prompts(parts, context.token_limit, truncate, items=DOCUMENTS, **cut)


def _answer_ids(context: TaskContext, template: RerankTemplate | CrossEncoderPair) -> tuple[int, int] | None:
    """(no, yes) token ids a causal-LM reranker is scored by; None for a seq-cls head."""
    if context.head == "seq_cls":
        return None
    if not isinstance(template, RerankTemplate):
        raise ValueError("a causal-LM reranker needs a RerankTemplate naming its yes/no answer tokens")
    prompts = context.prompt_tokenizer()
    return prompts.token_id(template.no_token), prompts.token_id(template.yes_token)
