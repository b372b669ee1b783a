"""Embedding: one vector per text from the final-normed hidden states.

Qwen3-Embedding style: queries get `Instruct: {instruction}\\nQuery:{text}` (the instruction is one shared
prefix, computed once), documents are plain text, and every sequence ends with the end-of-text token, whose
hidden state is the embedding (`pooling="last"`). `pooling="mean"` averages every token's state instead.
`dimensions` keeps the first d components (Matryoshka representation learning), renormalised when `normalize`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from radix_core.errors import RequestError
from radix_core.tasks.base import (
    Task,
    TaskJob,
    Usage,
    check_choice,
    check_flag,
    check_items,
    check_optional_int,
    check_optional_text,
    check_truncation,
    usage_dict,
)
from radix_core.tasks.context import TaskContext
from radix_core.templates import EmbedTemplate
from radix_core.tokens import TokenSequences

if TYPE_CHECKING:
    from radix_core.tasks.view import BatchView

POOLINGS = ("last", "mean")


@dataclass(frozen=True)
class EmbedResult:
    """`embeddings` (n, d) float32, row i for text i; and the call's token usage."""

    embeddings: np.ndarray
    usage: Usage


@dataclass(frozen=True)
class EmbedJob(TaskJob):
    """One sequence per text, and how to pool, cut and normalise its states."""

    task = "embed"
    pooling: str
    dimensions: int | None
    normalize: bool


class EmbedTask(Task):
    name = "embed"
    rpc = "Embed"

    def job(self, context: TaskContext, /, texts: Sequence[str], instruction: str | None = None,
            normalize: bool = True, dimensions: int | None = None, truncate: bool = True,
            pooling: str = "last", max_text_tokens: int | None = None,
            truncation_direction: str = "right") -> EmbedJob:
        """Embed `texts`; see the module docstring.

        `truncate`: cut a text whose sequence exceeds the per-sequence token limit (False: refuse it).
        `max_text_tokens`: first cut each text to at most that many tokens of its own. `truncation_direction`:
        "right" cuts a text's end, "left" its start. Every cut is at a token boundary and the sequence is
        tokenized with the kept text, as the tokenizer would encode it.
        """
        check_items("texts", texts, context.config.max_items)
        check_optional_text("instruction", instruction)
        check_truncation(truncation_direction, "max_text_tokens", max_text_tokens)
        check_flag("normalize", normalize)
        check_flag("truncate", truncate)
        check_choice("pooling", pooling, POOLINGS)
        check_optional_int("dimensions", dimensions)
        hidden_size = context.hidden_size
        if dimensions is not None and not 1 <= dimensions <= hidden_size:
            raise RequestError(f"dimensions must be between 1 and the model's hidden size {hidden_size}, "
                               f"got {dimensions}", field="dimensions", limit=1 if dimensions < 1 else hidden_size)
        template = context.template("embed")
        prompts = context.prompt_tokenizer()
        batch = prompts.encode_prompts(template.parts(texts, instruction), context.token_limit, truncate,
                                       end_ids=end_token_ids(context, template), what="text",
                                       special_tokens_in_user_text=context.config.special_tokens_in_user_text,
                                       truncation_direction=truncation_direction, max_item_tokens=max_text_tokens)
        empty = next((i for i, seq in enumerate(batch.sequences) if not seq), None)
        if empty is not None:
            raise RequestError(f"texts[{empty}] gives no tokens: this tokenizer drops all of its characters and "
                               f"this model's embedding prompt adds none of its own", "give it a visible character",
                               field="texts", index=empty)
        return EmbedJob(TokenSequences.from_lists(batch.sequences), len(batch.shared_ids), pooling, dimensions,
                        normalize)

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
        return {"embeddings": [{"values": row} for row in result.embeddings], "usage": usage_dict(result.usage)}


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
