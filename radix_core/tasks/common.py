"""What every task shares: usage accounting, input checks and the engine pieces tasks read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radix_core.templates import Template, resolve_template
from radix_core.tokenization import PromptTokenizer

if TYPE_CHECKING:
    from radix_core.engine import Engine, ForwardResult


@dataclass(frozen=True)
class Usage:
    """Tokens of one call: as sent to the model, and rows computed after shared prefixes were deduplicated."""

    input_tokens: int
    computed_tokens: int

    @classmethod
    def of(cls, result: ForwardResult) -> Usage:
        return cls(result.num_tokens, result.num_computed)


def check_text(what: str, text: str) -> None:
    """A required text: a non-empty str."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a string, got {type(text).__name__}")
    if not text:
        raise ValueError(f"{what} is empty")


def check_items(what: str, items: Sequence[str], max_items: int) -> None:
    """A list of strings with 1..max_items entries (a bare string is refused, not split into characters)."""
    if isinstance(items, str) or not isinstance(items, Sequence):
        raise ValueError(f"{what} must be a list of strings, got {type(items).__name__}")
    if not items:
        raise ValueError(f"{what} is empty: give at least one")
    if len(items) > max_items:
        raise ValueError(f"{len(items)} {what} is more than the limit of {max_items} per call: split the request "
                         f"or raise max_items in the task config")
    bad = next((i for i, item in enumerate(items) if not isinstance(item, str)), None)
    if bad is not None:
        raise ValueError(f"{what}[{bad}] must be a string, got {type(items[bad]).__name__}")


def prompt_tokenizer(engine: Engine) -> PromptTokenizer:
    if engine.prompts is None:
        raise ValueError(f"model {engine.model!r} has no tokenizer, which the text tasks need: put its "
                         f"tokenizer.json next to the weights, or call Engine.forward with token ids")
    return engine.prompts


def token_limit(engine: Engine) -> int:
    """Per-sequence tokens: the configured limit, capped at what the model computes exactly."""
    configured = engine.task_config.max_tokens
    return engine.arch.max_seq_len if configured is None else min(configured, engine.arch.max_seq_len)


def template_for(engine: Engine, task: str) -> Template:
    return resolve_template(task, engine.arch.family, engine.arch.head, engine.task_config.templates)
