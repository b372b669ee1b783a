"""`ModelCard`: what clients are told the served model is, the same for every transport (radixserve.v1 Info, tei.v1
Info, HTTP `/info`): the name requests may use, its primary task and the labels of its score head.

The primary task is what TEI's `model_type` reports (`tei-client` reranks only when the server says reranker and
embeds only when it says embedding): `rerank` is TEI's `reranker`, `embed` its `embedding` and `classify` its
`classifier`, a model TEI's clients call through `/predict` and `Predict`, which radixserve's `predict` task answers
(the model's own labels; radixserve's `classify` task is few-shot classification by a causal LM, over labels the
caller gives). It changes no behaviour, every task stays callable. `primary_task` in the application args sets
it; unset, the checkpoint decides, first rule that matches:

    sequence-classification head, 1 label         rerank     (a cross-encoder, or a seq-cls Qwen3-Reranker)
    sequence-classification head, 2+ labels       classify   (TEI's classifier: answered by `predict`)
    a sentence-transformers checkpoint            embed      (modules.json beside config.json: Qwen3-Embedding)
    causal LM with a rerank template              rerank     (Qwen3-Reranker: its family has one)
    anything else                                 embed      (base models, other causal LMs)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radix_core.tasks import TaskContext
from radix_core.templates import RerankTemplate, TemplateNotFound

SENTENCE_TRANSFORMERS_FILE = "modules.json"


@dataclass(frozen=True)
class ModelCard:
    """`served_model_name`: what requests may name besides `model` (the path or hub id loaded), and the only name
    Info and /info show; `labels`: the score head's `id2label` in id order, empty without a sequence-classification
    head."""

    model: str
    served_model_name: str
    primary_task: str
    labels: tuple[str, ...]

    def accepts(self, name: str | None) -> bool:
        """Whether a request naming model `name` (None: it named none) is for this model."""
        return name is None or name in (self.model, self.served_model_name)

    def info(self) -> dict[str, Any]:
        """The card's fields for `Ingress.info()`."""
        return {"served_model_name": self.served_model_name, "primary_task": self.primary_task,
                "labels": list(self.labels)}


def model_card(model: str, served_model_name: str | None, primary_task: str | None,
               context: TaskContext) -> ModelCard:
    """The card of `model` (its `TaskContext`; no weights), with the configured name and task when set."""
    labels = context.labels if context.head == "seq_cls" else ()
    task = primary_task or default_primary_task(model, context, len(labels))
    return ModelCard(model, served_model_name or public_name(model), task, labels)


def public_name(model: str) -> str:
    """What clients see of `model` when no served name is set: a hub id as it is, a local directory by its name only
    (its filesystem path is the server's business)."""
    return Path(model).name if Path(model).is_dir() else model


def default_primary_task(model: str, context: TaskContext, num_labels: int) -> str:
    """The rule of the module docstring."""
    if context.head == "seq_cls":
        return "rerank" if num_labels == 1 else "classify"
    if _is_sentence_transformer(model):
        return "embed"
    if context.head == "causal_lm" and _has_rerank_template(context):
        return "rerank"
    return "embed"


def _has_rerank_template(context: TaskContext) -> bool:
    try:
        return isinstance(context.template("rerank"), RerankTemplate)
    except TemplateNotFound:
        return False


def _is_sentence_transformer(model: str) -> bool:
    """A local directory with modules.json, or a hub model whose modules.json is in the local cache or reachable."""
    if Path(model).is_dir():
        return (Path(model) / SENTENCE_TRANSFORMERS_FILE).is_file()
    from transformers.utils import cached_file

    try:
        return cached_file(model, SENTENCE_TRANSFORMERS_FILE, _raise_exceptions_for_missing_entries=False,
                           _raise_exceptions_for_connection_errors=False) is not None
    except OSError:
        return False
