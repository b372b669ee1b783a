"""Embedding: one vector per text from the final-normed hidden states.

Qwen3-Embedding style: queries get `Instruct: {instruction}\\nQuery:{text}` (the instruction is one shared
prefix, computed once), documents are plain text, and every sequence ends with the end-of-text token, whose
hidden state is the embedding (`pooling="last"`). `pooling="mean"` averages every token's state instead.
`dimensions` keeps the first d components (Matryoshka representation learning), renormalised when `normalize`.

A text longer than the prompt's room is cut (`long_documents="truncate"`) or embedded by chunks
(`long_documents="chunk"`, `radix_core.chunking`), each a text of its own behind the same instruction, computed
once for all chunks: `chunks="pooled"` gives the text the mean of its chunks' embeddings weighted by their tokens
(renormalised when `normalize`), `chunks="each"` one embedding per chunk with its text's index and its span.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from radix_core.chunk_spec import CHUNK_OUTPUTS, LONG_DOCUMENTS
from radix_core.chunking import Chunks, chunk_documents, token_weighted_means
from radix_core.errors import Items, RequestError
from radix_core.prompt_encoding import EncodedBatch
from radix_core.tasks.base import Task, TaskJob
from radix_core.tasks.context import TaskContext
from radix_core.tasks.request import (
    TRUNCATION_DIRECTIONS,
    TaskRequest,
    choice,
    flag,
    items,
    optional_choice,
    optional_text,
    token_cap,
    whole,
)
from radix_core.tasks.usage import Usage
from radix_core.tasks.view import BatchView
from radix_core.templates import EmbedTemplate

POOLINGS = ("last", "mean")
TEXTS = Items("texts", "text")  # text 2 of a message is texts[2]


@dataclass(frozen=True)
class EmbedRequest(TaskRequest):
    """Embed `texts`; see the module docstring.

    `instruction`: prefixed to every text by the model's embedding template (queries). `normalize`: unit L2 norm.
    `dimensions`: keep the first d components (1 to the hidden size). `truncate`: cut a text whose sequence
    exceeds the per-sequence token limit (False: refuse it). `pooling`: "last" token or "mean". `max_text_tokens`:
    first cut each text to at most that many tokens of its own. `truncation_direction`: "right" cuts a text's
    end, "left" its start. Every cut is at a token boundary and the sequence is tokenized with the kept text, as
    the tokenizer would encode it.

    `long_documents`: "truncate" (as above) or "chunk": embed each text by windows of at most `chunk_tokens` of
    its own tokens (and what fits the limit beside the prompt), neighbours sharing `chunk_overlap_tokens`, at most
    `max_chunks_per_document` (more: its first ones with `truncate`, its last with `truncation_direction` "left",
    else refused); `chunks` "pooled" gives each text one embedding, "each" one per chunk. Unset (None), each takes
    the task config's default (`TaskConfig`).
    """

    texts: Sequence[str] = items()
    instruction: str | None = optional_text()
    normalize: bool = flag(True)
    dimensions: int | None = whole()
    truncate: bool = flag(True)
    pooling: str = choice(POOLINGS, "last")
    max_text_tokens: int | None = token_cap()
    truncation_direction: str = choice(TRUNCATION_DIRECTIONS, "right", " (the side of a text that is cut)")
    long_documents: str | None = optional_choice(LONG_DOCUMENTS, " (what a text longer than the limit gets)")
    chunk_tokens: int | None = whole(at_least=1)
    chunk_overlap_tokens: int | None = whole(at_least=0)
    max_chunks_per_document: int | None = whole(at_least=1)
    chunks: str | None = optional_choice(CHUNK_OUTPUTS, " (one embedding per text, or one per chunk)")


@dataclass(frozen=True)
class EmbedResult:
    """`embeddings` (n, d) float32, row i for text i; and the call's token usage. By chunks with `chunks="each"`,
    row r is a chunk of text `indices[r]`, at the [start, end) character offsets `spans[r]` in it."""

    embeddings: np.ndarray
    usage: Usage
    indices: np.ndarray | None = None  # (n,) int64
    spans: np.ndarray | None = None  # (n, 2) int64


@dataclass(frozen=True)
class EmbedJob(TaskJob):
    """One sequence per text, or per chunk of a text (`chunks`), and how to pool, cut and normalise its states;
    `each`: one embedding per chunk, else one per text."""

    pooling: str
    dimensions: int | None
    normalize: bool
    chunks: Chunks | None
    each: bool

    def select(self, start: int, end: int) -> EmbedJob:
        return replace(self, sequences=self.sequences.select(start, end), chunks=None)


class EmbedTask(Task):
    name = "embed"
    rpc = "Embed"
    request_type = EmbedRequest
    job_type = EmbedJob

    def job(self, context: TaskContext, request: EmbedRequest) -> EmbedJob:
        dimensions, hidden_size = request.dimensions, context.hidden_size
        if dimensions is not None and not 1 <= dimensions <= hidden_size:
            raise RequestError.about("dimensions", f"must be between 1 and the model's hidden size {hidden_size}, "
                                     f"got {dimensions}", limit=1 if dimensions < 1 else hidden_size)
        template = context.template(self.name)
        prompts, config = context.prompt_tokenizer(), context.config
        spec = config.chunk_spec(request.long_documents, request.chunk_tokens, request.chunk_overlap_tokens,
                                 request.max_chunks_per_document, request.truncate, request.truncation_direction,
                                 request.max_text_tokens)

        def encode(texts: Sequence[str], truncate: bool, max_item_tokens: int | None) -> EncodedBatch:
            return prompts.encode_prompts(template.parts(texts, request.instruction), context.token_limit, truncate,
                                          end_ids=end_token_ids(context, template), items=TEXTS,
                                          special_tokens_in_user_text=config.special_tokens_in_user_text,
                                          truncation_direction=request.truncation_direction,
                                          max_item_tokens=max_item_tokens)

        if spec is None:
            chunks, batch = None, encode(request.texts, request.truncate, request.max_text_tokens)
        else:
            chunks, batch = chunk_documents(prompts, request.texts, spec, lambda texts: encode(texts, True, None),
                                            context.token_limit, config.max_items, TEXTS,
                                            config.special_tokens_in_user_text)
        empty = np.flatnonzero(batch.sequences.lengths == 0)  # (E,) sequences without a token
        if empty.size:
            raise RequestError.about("texts", "gives no tokens: this tokenizer drops all of its characters and this "
                                     "model's embedding prompt adds none of its own", "give it a visible character",
                                     index=int(empty[0] if chunks is None else chunks.owners[empty[0]]))
        return EmbedJob(batch.sequences, len(batch.shared_ids), request.pooling,
                        dimensions, request.normalize, chunks, (request.chunks or config.chunks) == "each")

    def reads(self, job: EmbedJob) -> tuple[np.ndarray, np.ndarray] | None:
        n = len(job.sequences)
        return (np.arange(n), np.full(n, -1)) if job.pooling == "last" else None

    def finish(self, job: EmbedJob, view: BatchView) -> EmbedResult:
        vectors = (view.last_hidden() if job.pooling == "last" else view.mean_hidden())[:, :job.dimensions]  # (n, d)
        if job.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        return EmbedResult(vectors.cpu().numpy(), view.usage)

    def merge(self, job: EmbedJob, partials: Sequence[EmbedResult]) -> EmbedResult:
        whole = partials[0] if len(partials) == 1 else EmbedResult(np.concatenate([p.embeddings for p in partials]),
                                                                   Usage.total([p.usage for p in partials]))
        chunks = job.chunks
        if chunks is None:
            return whole
        if job.each:
            return replace(whole, indices=chunks.owners, spans=chunks.spans)
        pooled = torch.from_numpy(token_weighted_means(whole.embeddings, chunks))  # (D, d)
        if job.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return replace(whole, embeddings=pooled.numpy())

    def to_dict(self, result: EmbedResult) -> dict[str, Any]:
        if result.spans is None:
            rows = [{"values": row} for row in result.embeddings]
        else:
            rows = [{"values": row, "index": i, "span": {"start": start, "end": end}}
                    for row, i, (start, end) in zip(result.embeddings, result.indices.tolist(), result.spans.tolist())]
        return {"embeddings": rows, "usage": result.usage.to_dict()}


def end_token_ids(context: TaskContext, template: EmbedTemplate) -> list[int]:
    """The end tokens the tokenizer appends itself (Qwen3-Embedding's tokenizer appends `<|endoftext|>`), else
    the template's `end_token`, else none."""
    prompts = context.prompt_tokenizer()
    if prompts.trailing_ids:
        return prompts.trailing_ids
    if not template.end_token:
        return []
    try:
        return [prompts.token_id(template.end_token)]
    except ValueError as err:
        raise ValueError(f"embedding end token: {err}; configure this model's end-of-text token with "
                         f'TaskConfig(templates={{"embed": EmbedTemplate(end_token=...)}})') from err
