"""Embedding: one vector per text from the final-normed hidden states.

Qwen3-Embedding style: queries get `Instruct: {instruction}\\nQuery:{text}` (the instruction is one shared
prefix, computed once), documents are plain text, and every sequence ends with the end-of-text token, whose
hidden state is the embedding (`pooling="last"`). `pooling="mean"` averages every token's state instead.
`dimensions` keeps the first d components (Matryoshka representation learning), renormalised when `normalize`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radix_core.errors import RequestError
from radix_core.tasks.base import Task, TaskJob, naming_items
from radix_core.tasks.context import TaskContext
from radix_core.tasks.request import (
    TRUNCATION_DIRECTIONS,
    TaskRequest,
    choice,
    flag,
    items,
    optional_text,
    token_cap,
    whole,
)
from radix_core.tasks.usage import Usage
from radix_core.tasks.view import BatchView
from radix_core.templates import EmbedTemplate
from radix_core.tokens import TokenSequences

POOLINGS = ("last", "mean")


@dataclass(frozen=True)
class EmbedRequest(TaskRequest):
    """Embed `texts`; see the module docstring.

    `instruction`: prefixed to every text by the model's embedding template (queries). `normalize`: unit L2 norm.
    `dimensions`: keep the first d components (1 to the hidden size). `truncate`: cut a text whose sequence
    exceeds the per-sequence token limit (False: refuse it). `pooling`: "last" token or "mean". `max_text_tokens`:
    first cut each text to at most that many tokens of its own. `truncation_direction`: "right" cuts a text's
    end, "left" its start. Every cut is at a token boundary and the sequence is tokenized with the kept text, as
    the tokenizer would encode it.
    """

    texts: Sequence[str] = items()
    instruction: str | None = optional_text()
    normalize: bool = flag(True)
    dimensions: int | None = whole()
    truncate: bool = flag(True)
    pooling: str = choice(POOLINGS, "last")
    max_text_tokens: int | None = token_cap()
    truncation_direction: str = choice(TRUNCATION_DIRECTIONS, "right", " (the side of a text that is cut)")


@dataclass(frozen=True)
class EmbedResult:
    """`embeddings` (n, d) float32, row i for text i; and the call's token usage."""

    embeddings: np.ndarray
    usage: Usage


@dataclass(frozen=True)
class EmbedJob(TaskJob):
    """One sequence per text, and how to pool, cut and normalise its states."""

    pooling: str
    dimensions: int | None
    normalize: bool


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
        prompts = context.prompt_tokenizer()
        with naming_items("texts", "text"):
            batch = prompts.encode_prompts(template.parts(request.texts, request.instruction), context.token_limit,
                                           request.truncate, end_ids=end_token_ids(context, template), what="text",
                                           special_tokens_in_user_text=context.config.special_tokens_in_user_text,
                                           truncation_direction=request.truncation_direction,
                                           max_item_tokens=request.max_text_tokens)
        empty = next((i for i, seq in enumerate(batch.sequences) if not seq), None)
        if empty is not None:
            raise RequestError.about("texts", "gives no tokens: this tokenizer drops all of its characters and this "
                                     "model's embedding prompt adds none of its own", "give it a visible character",
                                     index=empty)
        return EmbedJob(TokenSequences.from_lists(batch.sequences), len(batch.shared_ids), request.pooling,
                        dimensions, request.normalize)

    def finish(self, job: EmbedJob, view: BatchView) -> EmbedResult:
        vectors = (view.last_hidden() if job.pooling == "last" else view.mean_hidden())[:, :job.dimensions]  # (n, d)
        if job.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        return EmbedResult(vectors.cpu().numpy(), view.usage)

    def merge(self, job: EmbedJob, partials: Sequence[EmbedResult]) -> EmbedResult:
        if len(partials) == 1:
            return partials[0]
        return EmbedResult(np.concatenate([p.embeddings for p in partials]), Usage.total([p.usage for p in partials]))

    def to_dict(self, result: EmbedResult) -> dict[str, Any]:
        return {"embeddings": [{"values": row} for row in result.embeddings], "usage": result.usage.to_dict()}


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
