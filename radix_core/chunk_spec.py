"""What a request asks of chunking (`radix_core.chunking`): the choices of its fields and `ChunkSpec`, the windows
a request cuts its documents into. Light (no tokenizer, no torch), so the configuration that holds the defaults
(`radix_core.tasks.config`) is checked before the model is loaded."""

from __future__ import annotations

from dataclasses import dataclass

LONG_DOCUMENTS = ("truncate", "chunk")  # what a task does with a document longer than its prompt's room
POOLS = ("max", "mean", "first")  # how a document's score comes from its chunks' scores
CHUNK_OUTPUTS = ("pooled", "each")  # one embedding per text (token-weighted mean of its chunks'), or one per chunk


@dataclass(frozen=True)
class ChunkSpec:
    """How a request cuts its documents: windows of at most `tokens` tokens, `overlap` shared by neighbours, at
    most `max_chunks` per document; `truncate`, `direction` and `max_document_tokens` as the request's."""

    tokens: int
    overlap: int
    max_chunks: int
    truncate: bool = True
    direction: str = "right"
    max_document_tokens: int | None = None

    def overlap_at(self, size: int) -> int:
        """The overlap of windows of `size` tokens: `overlap`, or its share of a window the limit made smaller."""
        return self.overlap * size // self.tokens
