"""`TaskConfig`: limits and prompt-template overrides for the scoring tasks, passed to the `Engine`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from radix_core.chunk_spec import CHUNK_OUTPUTS, LONG_DOCUMENTS, POOLS, ChunkSpec
from radix_core.errors import RequestError
from radix_core.templates import Template, template_from_dict

DEFAULT_MAX_ITEMS = 1024


@dataclass(frozen=True)
class TaskConfig:
    """What the task methods accept, and which prompt templates they use.

    `max_items` bounds documents per rerank, texts per embed, inputs per predict, continuations per score and
    the (input, label) sequences of a classify (inputs x labels). `max_tokens` is the per-sequence token limit;
    None takes the model's own maximum (a larger value is capped at it). `templates` maps a task ("rerank",
    "embed") to a template, or a dict of its fields, that replaces the registry default for this model (see
    `radix_core.templates`).
    `special_tokens_in_user_text`: False (the default) encodes special-token literals in user text (`<|im_end|>` in
    a document) as plain text, so only the template's own control tokens are control tokens; True gives the
    tokenizer's raw behaviour, which lets whoever writes a document rewrite the prompt: trusted text only.

    Long documents (rerank and embed; a request's field of the same name, when set, wins): `long_documents`
    "truncate" cuts a document to the per-sequence limit, "chunk" scores it by windows of at most `chunk_tokens`
    of its own tokens, neighbours sharing `chunk_overlap_tokens`, at most `max_chunks_per_document` of them
    (`radix_core.chunking`); `pool` makes a reranked document's score from its chunks' ("max", "mean" or
    "first"), `chunks` gives an embedded text one vector ("pooled": the token-weighted mean of its chunks') or one
    per chunk ("each").
    """

    max_items: int = DEFAULT_MAX_ITEMS
    max_tokens: int | None = None
    templates: Mapping[str, Template | Mapping] = field(default_factory=dict)
    special_tokens_in_user_text: bool = False
    long_documents: str = "truncate"
    chunk_tokens: int = 512
    chunk_overlap_tokens: int = 64
    max_chunks_per_document: int = 16
    pool: str = "max"
    chunks: str = "pooled"

    def __post_init__(self) -> None:
        if self.max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {self.max_items}")
        for name, choices in (("long_documents", LONG_DOCUMENTS), ("pool", POOLS), ("chunks", CHUNK_OUTPUTS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.chunk_tokens < 1 or self.max_chunks_per_document < 1:
            raise ValueError(f"chunk_tokens and max_chunks_per_document must be at least 1, got "
                             f"{self.chunk_tokens} and {self.max_chunks_per_document}")
        if not 0 <= self.chunk_overlap_tokens < self.chunk_tokens:
            raise ValueError(f"chunk_overlap_tokens must be at least 0 and less than chunk_tokens "
                             f"({self.chunk_tokens}), got {self.chunk_overlap_tokens}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2 (or None for the model's limit), got {self.max_tokens}")
        templates = {task: template_from_dict(task, value) for task, value in self.templates.items()}
        object.__setattr__(self, "templates", templates)

    def chunk_spec(self, long_documents: str | None, chunk_tokens: int | None, chunk_overlap_tokens: int | None,
                   max_chunks_per_document: int | None, truncate: bool, direction: str,
                   max_document_tokens: int | None) -> ChunkSpec | None:
        """How a request cuts its long documents, its unset (None) fields taking this config's defaults (an unset
        overlap beside a chunk size of the request's own keeps the default's share of a chunk); None when it
        truncates them. The overlap must be less than the chunk (a RequestError names the field)."""
        if (long_documents or self.long_documents) == "truncate":
            return None
        tokens = self.chunk_tokens if chunk_tokens is None else chunk_tokens
        overlap = chunk_overlap_tokens
        if overlap is None:  # the default keeps its share of the chunk (64 of 512: an eighth)
            overlap = self.chunk_overlap_tokens * tokens // self.chunk_tokens
        if overlap >= tokens:
            raise RequestError.about("chunk_overlap_tokens", f"must be less than chunk_tokens ({tokens}), got "
                                     f"{overlap}", "lower it, or raise chunk_tokens", limit=tokens - 1)
        max_chunks = self.max_chunks_per_document if max_chunks_per_document is None else max_chunks_per_document
        return ChunkSpec(tokens, overlap, max_chunks, truncate, direction, max_document_tokens)

    @classmethod
    def from_dict(cls, data: Mapping) -> TaskConfig:
        """From plain config (YAML); templates may be dicts of their fields."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            allowed = ", ".join(f.name for f in fields(cls))
            raise ValueError(f"unknown task config keys {unknown}: allowed are {allowed}")
        return cls(**{**data, "templates": data.get("templates") or {}})
