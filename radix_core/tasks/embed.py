"""Embedding: one vector per text from the final-normed hidden states.

Qwen3-Embedding style: queries get `Instruct: {instruction}\\nQuery:{text}` (the instruction is one shared
prefix, computed once), documents are plain text, and every sequence ends with the end-of-text token, whose
hidden state is the embedding (`pooling="last"`). `pooling="mean"` averages every token's state instead.
`dimensions` keeps the first d components (Matryoshka representation learning), renormalised when `normalize`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from radix_core.tasks.common import TaskContext, TaskJob, Usage, check_items
from radix_core.templates import EmbedTemplate

if TYPE_CHECKING:
    from radix_core.engine import Engine
    from radix_core.tasks.jobs import BatchView

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

    def finish(self, engine: Engine, view: BatchView) -> EmbedResult:
        vectors = _pool(view, self.pooling)[:, :self.dimensions]  # (n, d)
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        return EmbedResult(vectors.cpu().numpy(), view.usage)


def embed_job(task_context: TaskContext, /, texts: Sequence[str], instruction: str | None = None,
              normalize: bool = True, dimensions: int | None = None, truncate: bool = True,
              pooling: str = "last") -> EmbedJob:
    """Embed `texts`; see the module docstring."""
    check_items("texts", texts, task_context.config.max_items)
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}: choose one of {', '.join(POOLINGS)}")
    hidden_size = task_context.hidden_size
    if dimensions is not None and not 1 <= dimensions <= hidden_size:
        raise ValueError(f"dimensions must be between 1 and the model's hidden size {hidden_size}, got {dimensions}")
    template = task_context.template("embed")
    prompts = task_context.prompt_tokenizer()
    batch = prompts.encode_prompts(template.parts(texts, instruction), task_context.token_limit, truncate,
                                   end_ids=end_token_ids(task_context, template), what="text")
    return EmbedJob(batch.sequences, pooling, dimensions, normalize)


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


def _pool(view: BatchView, pooling: str) -> torch.Tensor:
    """(n, hidden) float32: the last token's state, or the mean over each sequence's tokens."""
    if pooling == "last":
        return view.hidden.index_select(0, torch.cat(view.rows_at([[-1]] * view.count))).float()
    per_token = view.hidden.index_select(0, view.row_of_token).float()  # (N, hidden) the slice's tokens
    return torch.stack([chunk.mean(0) for chunk in per_token.split(view.lengths.tolist())])
