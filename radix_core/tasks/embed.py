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

from radix_core.tasks.common import Usage, check_items, prompt_tokenizer, template_for, token_limit
from radix_core.templates import EmbedTemplate

if TYPE_CHECKING:
    from radix_core.engine import Engine, ForwardResult

POOLINGS = ("last", "mean")


@dataclass(frozen=True)
class EmbedResult:
    """`embeddings` (n, d) float32, row i for text i; and the call's token usage."""

    embeddings: np.ndarray
    usage: Usage


def embed(engine: Engine, texts: Sequence[str], instruction: str | None = None, normalize: bool = True,
          dimensions: int | None = None, truncate: bool = True, pooling: str = "last") -> EmbedResult:
    """Embed `texts`; see the module docstring."""
    check_items("texts", texts, engine.task_config.max_items)
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}: choose one of {', '.join(POOLINGS)}")
    hidden_size = engine.arch.hidden_size
    if dimensions is not None and not 1 <= dimensions <= hidden_size:
        raise ValueError(f"dimensions must be between 1 and the model's hidden size {hidden_size}, got {dimensions}")
    template = template_for(engine, "embed")
    prompts = prompt_tokenizer(engine)
    batch = prompts.encode_prompts(template.parts(texts, instruction), token_limit(engine), truncate,
                                   end_ids=end_token_ids(engine, template), what="text")
    result = engine.forward(batch.sequences)
    vectors = _pool(result, pooling)[:, :dimensions]  # (n, d)
    if normalize:
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
    return EmbedResult(vectors.cpu().numpy(), Usage.of(result))


def end_token_ids(engine: Engine, template: EmbedTemplate) -> list[int]:
    """The end tokens the tokenizer appends itself (Qwen3-Embedding's tokenizer appends `<|endoftext|>`), else
    the template's `end_token`, else none."""
    prompts = prompt_tokenizer(engine)
    if prompts.trailing_ids:
        return prompts.trailing_ids
    if not template.end_token:
        return []
    try:
        return [prompts.token_id(template.end_token)]
    except ValueError as err:
        raise ValueError(f"embedding end token: {err}; configure this model's end-of-text token with "
                         f'TaskConfig(templates={{"embed": EmbedTemplate(end_token=...)}})') from err


def _pool(result: ForwardResult, pooling: str) -> torch.Tensor:
    """(n, hidden) float32: the last token's state, or the mean over each sequence's tokens."""
    n = len(result.plan.cu_seqlens) - 1
    if pooling == "last":
        return result.hidden.index_select(0, torch.cat(result.rows_at([[-1]] * n))).float()
    lengths = np.diff(result.plan.cu_seqlens).tolist()
    per_token = result.hidden.index_select(0, result.plan.row_of_token).float()  # (N, hidden)
    return torch.stack([chunk.mean(0) for chunk in per_token.split(lengths)])
