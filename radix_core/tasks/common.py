"""What every task shares: the context its CPU half reads, the job base class, usage accounting, input checks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from radix_core.tasks.config import TaskConfig
from radix_core.templates import Template, resolve_template
from radix_core.tokenization import PromptTokenizer

if TYPE_CHECKING:
    from radix_core.engine import Engine
    from radix_core.tasks.jobs import BatchView


@dataclass(frozen=True)
class Usage:
    """Tokens of one call: as sent to the model, and rows computed after shared prefixes were deduplicated."""

    input_tokens: int
    computed_tokens: int


@dataclass(frozen=True)
class TaskContext:
    """Everything the CPU half of a task (validation, templates, tokenization) reads: the model's facts, its
    tokenizer and the task config, without weights. Picklable, so tasks can be encoded in another process."""

    model: str
    family: str  # config.model_type, e.g. "qwen3"
    head: str  # "causal_lm", "seq_cls" or "base"
    hidden_size: int
    max_seq_len: int
    prompts: PromptTokenizer | None  # None for a model without a tokenizer: no text tasks
    config: TaskConfig

    def prompt_tokenizer(self) -> PromptTokenizer:
        if self.prompts is None:
            raise ValueError(f"model {self.model!r} has no tokenizer, which the text tasks need: put its "
                             f"tokenizer.json next to the weights, or call Engine.forward with token ids")
        return self.prompts

    @property
    def token_limit(self) -> int:
        """Per-sequence tokens: the configured limit, capped at what the model computes exactly."""
        configured = self.config.max_tokens
        return self.max_seq_len if configured is None else min(configured, self.max_seq_len)

    def template(self, task: str) -> Template:
        return resolve_template(task, self.family, self.head, self.config.templates)


@dataclass(frozen=True)
class TaskJob(ABC):
    """One request, validated and tokenized: the sequences it adds to a batch and what finishing it needs.

    Picklable. `finish` reads the job's own slice of the batch's forward (a `BatchView`), so jobs of different
    tasks can share one forward.
    """

    task: ClassVar[str]
    sequences: list[list[int]]  # token ids this request contributes to the batch

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.sequences))

    @abstractmethod
    def finish(self, engine: Engine, view: BatchView) -> Any:
        """The task's result (with `view.usage`) from the forward rows of this job's sequences."""


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
