"""`TaskConfig`: limits and prompt-template overrides for the scoring tasks, passed to the `Engine`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

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
    """

    max_items: int = DEFAULT_MAX_ITEMS
    max_tokens: int | None = None
    templates: Mapping[str, Template | Mapping] = field(default_factory=dict)
    special_tokens_in_user_text: bool = False

    def __post_init__(self) -> None:
        if self.max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {self.max_items}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2 (or None for the model's limit), got {self.max_tokens}")
        templates = {task: template_from_dict(task, value) for task, value in self.templates.items()}
        object.__setattr__(self, "templates", templates)

    @classmethod
    def from_dict(cls, data: Mapping) -> TaskConfig:
        """From plain config (YAML); templates may be dicts of their fields."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            allowed = ", ".join(f.name for f in fields(cls))
            raise ValueError(f"unknown task config keys {unknown}: allowed are {allowed}")
        return cls(**{**data, "templates": data.get("templates") or {}})
