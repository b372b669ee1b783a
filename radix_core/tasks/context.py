"""`TaskContext`: what the CPU half of every task reads (validation, templates, tokenization), without weights."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from radix_core.architectures import head_of, load_config, max_seq_len
from radix_core.errors import RequestError
from radix_core.prompt_encoding import PromptTokenizer, load_prompt_tokenizer
from radix_core.tasks.config import TaskConfig
from radix_core.templates import Template, resolve_template


@dataclass(frozen=True)
class TaskContext:
    """The model's facts, its tokenizer and the task config. Picklable, so tasks can be encoded in another process
    (the Ray Serve ingress encodes requests with a context loaded by `load_task_context`)."""

    model: str
    family: str  # config.model_type, e.g. "qwen3"
    head: str  # "causal_lm", "seq_cls" or "base"
    hidden_size: int
    max_seq_len: int
    labels: tuple[str, ...]  # a seq-cls head's outputs by id (config.id2label)
    prompts: PromptTokenizer | None  # None for a model without a tokenizer: no text tasks
    config: TaskConfig

    def prompt_tokenizer(self) -> PromptTokenizer:
        if self.prompts is None:
            raise RequestError(f"model {self.model!r} has no tokenizer, which the text tasks need",
                               "put its tokenizer.json next to the weights, or call Engine.forward with token ids")
        return self.prompts

    @property
    def num_labels(self) -> int:
        """Outputs of a seq-cls head (config.num_labels)."""
        return len(self.labels)

    @property
    def token_limit(self) -> int:
        """Per-sequence tokens: the configured limit, capped at what the model computes exactly."""
        configured = self.config.max_tokens
        return self.max_seq_len if configured is None else min(configured, self.max_seq_len)

    def template(self, task: str) -> Template:
        return resolve_template(task, self.family, self.head, self.config.templates)


def load_task_context(model: str, config: TaskConfig) -> TaskContext:
    """The `TaskContext` of `model` from its config and tokenizer alone: no weights are read."""
    return task_context(model, load_config(model), load_prompt_tokenizer(model), config)


def task_context(model: str, hf_config: PretrainedConfig, prompts: PromptTokenizer | None,
                 config: TaskConfig) -> TaskContext:
    """The `TaskContext` of `model` from its transformers config (the one place it is read for the tasks)."""
    labels = tuple(str(hf_config.id2label[i]) for i in range(hf_config.num_labels))
    return TaskContext(model, hf_config.model_type, head_of(hf_config), hf_config.hidden_size, max_seq_len(hf_config),
                       labels, prompts, config)
