"""Prompt templates for the scoring tasks, as (shared prefix, varying part, suffix), in a registry by model type.

Every request renders to `PromptParts`: the text all its sequences share (`shared`: system prompt, instruction,
query), one varying text per item (`varying[i]`: a document or a text) and a suffix. The full prompt of item i
is `shared + varying[i] + suffix`. `shared` is tokenized once into the ids every sequence starts with, and the
ingress's prefix key hashes those ids (not the text):

    template = resolve_template("rerank", "qwen3", "causal_lm")
    shared_text = template.shared_prefix(query, instruction)          # the text
    shared_ids = prompt_tokenizer.encode_prompts(parts, ...).shared_ids  # its ids up to the last safe split point

`shared` and `suffix` are `Segment`s that keep the template's own text apart from the user's: a template's literal
text is the template's, and every value substituted into one of its fields (`{query}`, `{instruction}`), every
varying text and a classify prefix are the user's. The tokenizer treats special-token literals (`<|im_end|>`) as
the model's control tokens only in the template's text, so a document cannot close its turn and write the answer
(see `radix_core.special_tokens`).

Defaults (`DEFAULT_TEMPLATES`, keyed by (task, model_type, head) with "*" as a wildcard):

* rerank, qwen3 causal-LM: the Qwen3-Reranker prompt; the score is P(yes) from the `no`/`yes` logits.
* rerank, qwen3 seq-cls: the same prompt, scored by the score head (seq-cls conversions of Qwen3-Reranker keep it).
* Qwen3.5 (`qwen3_5_text`, a multimodal checkpoint's text model too) and Qwen3-Next: as qwen3, both tasks.
* rerank, any other seq-cls: `CrossEncoderPair`, the tokenizer's own pair encoding `tokenizer(query, document)`,
  exactly what a cross-encoder (sentence-transformers `CrossEncoder`, a text-classification pipeline with
  `text_pair`) feeds the model: `[CLS] q [SEP] d [SEP]` for BERT-style tokenizers, the plain concatenation of the
  two encodings for Qwen/Llama tokenizers, which define no pair template. No instruction.
* embed, qwen3: Qwen3-Embedding (last-token pooling), `Instruct: {instruction}\\nQuery:{text}` for queries (given an
  instruction), plain text otherwise, then `<|endoftext|>` (the token the Qwen3-Embedding tokenizer appends).
* embed, any other model: plain text; an instruction needs a template from config.

Anything else, e.g. rerank with a Llama causal LM, fails with `TemplateNotFound`, which says how to pass one:
`TaskConfig(templates={"rerank": RerankTemplate(...)})`, or a dict of its fields (`template_from_dict`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from string import Formatter

from radix_core.errors import RequestError

TASKS = ("rerank", "embed")
WILDCARD = "*"


@dataclass(frozen=True)
class Segment:
    """A run of prompt text: the template's own (`user=False`), where special-token literals are the model's
    control tokens, or the user's (`user=True`), where they are plain text."""

    text: str
    user: bool


Text = tuple[Segment, ...]


def template_text(text: str) -> Text:
    return (Segment(text, False),) if text else ()


def user_text(text: str) -> Text:
    return (Segment(text, True),) if text else ()


def joined(text: Text) -> str:
    """The plain string of `text`."""
    return "".join(segment.text for segment in text)


def _split_at(template: str, field: str, **values: str) -> tuple[Text, Text]:
    """Render `template` with `values` and return the text before and after `{field}`: the template's literal
    text as template segments, each substituted value as a user segment."""
    formatter, before, after, seen = Formatter(), [], [], False
    try:
        for literal, name, spec, conversion in formatter.parse(template):
            out = after if seen else before
            out += template_text(literal)
            if name == field:
                seen = True
            elif name is not None:
                value = formatter.convert_field(formatter.get_field(name, (), values)[0], conversion)
                out += user_text(formatter.format_field(value, spec))
    except (KeyError, IndexError, AttributeError) as err:
        allowed = ", ".join("{" + name + "}" for name in (field, *values))
        raise ValueError(f"template {template!r} uses an unknown field {err}: it may use {allowed} "
                         f"(write literal braces as {{{{ and }}}})") from err
    return tuple(before), tuple(after)


def _check_field_once(what: str, template: str, field: str) -> None:
    """A template must contain its varying field exactly once (write literal braces as {{ and }})."""
    count = template.count("{" + field + "}") - template.count("{{" + field + "}}")
    if count != 1:
        raise ValueError(f"the {what} must contain {{{field}}} exactly once, got {count} in {template!r}")


@dataclass(frozen=True)
class PromptParts:
    """One request as text: item i's prompt is `shared + varying[i] + suffix`. The varying texts are the user's;
    `shared` and `suffix` are segments, and a plain string given for either is taken as user text (so
    `PromptParts(context, [""], "")` scores a user's context with its special-token literals as plain text)."""

    shared: Text
    varying: list[str]
    suffix: Text

    def __post_init__(self) -> None:
        for name in ("shared", "suffix"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, user_text(value))

    @property
    def prompts(self) -> list[str]:
        """Each item's whole prompt as a string."""
        return [joined(self.shared) + text + joined(self.suffix) for text in self.varying]


@dataclass(frozen=True)
class RerankTemplate:
    """A reranker prompt `prefix + body + suffix`: `prefix` and `suffix` are literal text, `body` a format string
    holding `{document}` once, and may use `{query}` and `{instruction}` (None takes `default_instruction`).
    Causal-LM rerankers are scored by the logits of `yes_token` vs `no_token` after the suffix."""

    prefix: str
    body: str
    suffix: str
    default_instruction: str = ""
    yes_token: str = "yes"
    no_token: str = "no"

    def __post_init__(self) -> None:
        _check_field_once("rerank body", self.body, "document")

    def parts(self, query: str, documents: Sequence[str], instruction: str | None = None) -> PromptParts:
        head, tail = _split_at(self.body, "document", query=query, instruction=self._instruction(instruction))
        return PromptParts(template_text(self.prefix) + head, list(documents), tail + template_text(self.suffix))

    def shared_prefix(self, query: str, instruction: str | None = None) -> str:
        """The text every document's prompt starts with; its ids up to the last safe split point are the shared
        ids that the prefix key hashes."""
        return joined(self.parts(query, [], instruction).shared)

    def _instruction(self, instruction: str | None) -> str:
        return self.default_instruction if instruction is None else instruction


@dataclass(frozen=True)
class CrossEncoderPair:
    """Query and document as the tokenizer's own text pair, `tokenizer(query, document)`; no instruction."""

    def shared_prefix(self, query: str, instruction: str | None = None) -> str:
        """The query: its ids (with the pair's special tokens) start every sequence."""
        if instruction is not None:
            raise RequestError("this model's rerank format (a plain query/document pair) takes no instruction",
                               "drop `instruction` or configure a RerankTemplate whose body uses {instruction}",
                               field="instruction")
        return query


@dataclass(frozen=True)
class EmbedTemplate:
    """Texts to embed: `query` (with `{instruction}` and `{text}`) when an instruction is given, the plain text
    otherwise; then `end_token`, unless the tokenizer appends end tokens of its own. `query=None`: the model has
    no instruction format."""

    query: str | None = None
    end_token: str | None = None

    def __post_init__(self) -> None:
        if self.query is not None:
            _check_field_once("embed query template", self.query, "text")

    def parts(self, texts: Sequence[str], instruction: str | None = None) -> PromptParts:
        if instruction is None:
            return PromptParts("", list(texts), "")
        if self.query is None:
            raise TemplateNotFound(
                "this model has no instruction format for embeddings",
                'embed without `instruction`, or configure '
                'TaskConfig(templates={"embed": EmbedTemplate(query="Instruct: {instruction}\\nQuery:{text}")})',
                field="instruction")
        head, tail = _split_at(self.query, "text", instruction=instruction)
        return PromptParts(head, list(texts), tail)

    def shared_prefix(self, instruction: str | None = None) -> str:
        """The text every text's prompt starts with (empty without an instruction)."""
        return joined(self.parts([], instruction).shared)


Template = RerankTemplate | CrossEncoderPair | EmbedTemplate

QWEN3_RERANKER = RerankTemplate(
    prefix=(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    ),
    body="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    default_instruction="Given a web search query, retrieve relevant passages that answer the query",
)
QWEN3_EMBEDDING = EmbedTemplate(query="Instruct: {instruction}\nQuery:{text}", end_token="<|endoftext|>")
PLAIN_EMBEDDING = EmbedTemplate()

# Qwen3 and the hybrid families after it (Qwen3.5's text model, Qwen3-Next): rerankers and embedding models built
# on them take the Qwen3-Reranker and Qwen3-Embedding formats (same chat tokens, same tokenizer family)
QWEN3_FORMAT_FAMILIES = ("qwen3", "qwen3_5_text", "qwen3_next")

DEFAULT_TEMPLATES: dict[tuple[str, str, str], Template] = {
    **{("rerank", family, head): QWEN3_RERANKER for family in QWEN3_FORMAT_FAMILIES
       for head in ("causal_lm", "seq_cls")},
    ("rerank", WILDCARD, "seq_cls"): CrossEncoderPair(),
    **{("embed", family, WILDCARD): QWEN3_EMBEDDING for family in QWEN3_FORMAT_FAMILIES},
    ("embed", WILDCARD, WILDCARD): PLAIN_EMBEDDING,
}
_TEMPLATE_TYPES = {"rerank": (RerankTemplate, CrossEncoderPair), "embed": (EmbedTemplate,)}


class TemplateNotFound(RequestError):
    """No prompt template for this task and model, so this server cannot answer such a request; the fix says how
    to configure one."""


def resolve_template(task: str, model_type: str, head: str,
                     overrides: Mapping[str, Template] | None = None) -> Template:
    """The configured template for `task`, else the most specific default for (model_type, head)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} for templates: choose one of {', '.join(TASKS)}")
    if overrides and task in overrides:
        return overrides[task]
    for key in ((task, model_type, head), (task, model_type, WILDCARD), (task, WILDCARD, head),
                (task, WILDCARD, WILDCARD)):
        if key in DEFAULT_TEMPLATES:
            return DEFAULT_TEMPLATES[key]
    raise TemplateNotFound(
        f"no {task} prompt template is known for {model_type} {head} models",
        f'pass one in the engine config: TaskConfig(templates={{"{task}": RerankTemplate(prefix=..., '
        f'body="...{{query}}...{{document}}", suffix=...)}}) (as a dict in YAML: templates: {{{task}: '
        f"{{prefix: ..., body: ..., suffix: ...}}}})")


def template_from_dict(task: str, value: Template | Mapping) -> Template:
    """A template from config: an instance, or a dict of its fields (`{"kind": "pair"}` for `CrossEncoderPair`)."""
    if task not in _TEMPLATE_TYPES:
        raise ValueError(f"templates can be configured for {', '.join(TASKS)}, not {task!r}")
    if isinstance(value, _TEMPLATE_TYPES[task]):
        return value
    if not isinstance(value, Mapping):
        kinds = " or ".join(t.__name__ for t in _TEMPLATE_TYPES[task])
        raise ValueError(f"the {task} template must be a {kinds} or a dict of fields, got {type(value).__name__}")
    if task == "rerank" and value.get("kind") == "pair":
        return CrossEncoderPair()
    cls = RerankTemplate if task == "rerank" else EmbedTemplate
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(f"unknown {task} template fields {unknown}: allowed are {sorted(allowed)}")
    return cls(**value)


def classify_parts(prefix: str, template: str | Callable[[str], str] | None, inputs: Sequence[str]) -> PromptParts:
    """Classification prompts `prefix + template(input)`. A format string (`"Review: {input}\\nSentiment:"`) puts
    its text before `{input}` into the shared part; a callable's output is all varying. The prefix, the inputs
    and a callable's output are user text; only a format string's literal text is the template's."""
    if template is None or callable(template):
        render = template or (lambda text: text)
        return PromptParts(user_text(prefix), [render(text) for text in inputs], ())
    try:
        _check_field_once("classify template", template, "input")
        head, tail = _split_at(template, "input")
    except ValueError as err:  # also Python's own format-string errors ("Single '}' encountered")
        raise RequestError(f"template is not a format string holding {{input}} once: {err}",
                           "e.g. \"Review: {input}\\nSentiment:\"", field="template") from err
    return PromptParts(user_text(prefix) + head, list(inputs), tail)
