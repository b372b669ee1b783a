"""Hugging Face text-embeddings-inference (TEI) requests as the library's task calls, for both TEI transports: the
HTTP routes (`deployments.http.tei`) and the gRPC `tei.v1` calls (`deployments.tei_grpc`) read their messages and
hand TEI's fields to the functions here, so each TEI field is converted in one place:

    TEI                                            library
    rerank  query, texts, raw_scores, return_text  query, documents, raw_scores, return_documents
    embed   inputs, normalize, dimensions          texts, normalize, dimensions
    predict inputs, raw_scores                     predict's inputs, raw_scores
    truncate (TEI's default false)                 truncate
    truncation_direction Right / Left (HTTP), TRUNCATION_DIRECTION_RIGHT / _LEFT (gRPC)   "right" / "left"
    prompt_name                                    refused by name: no named prompts (radixserve.v1 has instruction)

`Names` rewrites a task's error message into TEI's field names (`texts[1] gives a sequence of ...`, not the
library's `document 1`), one table per request shape. `tei_model_type` is TEI's `model_type` of the model card's
primary task, in the HTTP form and as the gRPC enum.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from deployments.model_card import ModelCard
from radix_core.errors import RequestError
from radixserve.tei.v1 import tei_pb2 as tei

MODEL_TYPES = {"rerank": "reranker", "embed": "embedding", "classify": "classifier"}  # primary task -> TEI's name
RERANK_LABEL = "relevance"  # the label a reranker whose score head names none gets in TEI's answers
DIRECTIONS = {"Right": "right", "Left": "left",  # HTTP
              tei.TRUNCATION_DIRECTION_RIGHT: "right", tei.TRUNCATION_DIRECTION_LEFT: "left"}  # gRPC


@dataclass(frozen=True)
class Names:
    """How one TEI request shape names the library's arguments in error messages: (regex, TEI's name) pairs."""

    renames: tuple[tuple[str, str | Callable[[re.Match], str]], ...]  # re.sub's pattern and replacement

    def rename(self, message: str) -> str:
        for pattern, name in self.renames:
            message = re.sub(pattern, name, message)
        return message


RERANK_NAMES = Names(((r"\bdocuments\b", "texts"), (r"\bdocument (\d+)", r"texts[\1]")))
RERANK_STREAM_NAMES = Names(((r"\bdocuments\[(\d+)\]", r"message \1 of its query"), (r"\bdocuments\b", "messages"),
                             (r"\bdocument (\d+)", r"message \1 of its query")))
EMBED_NAMES = Names(((r"\btexts\b", "inputs"), (r"\btext (\d+)", r"inputs[\1]")))
ONE_TEXT_EMBED_NAMES = Names(((r"\btexts\[0\]", "inputs"), (r"\btext 0\b", "inputs")))  # gRPC: one text a message
ONE_TEXT_PREDICT_NAMES = Names(((r"\binputs\[0\]", "inputs"), (r"\binput 0\b", "inputs")))


def predict_names(positions: Sequence[int]) -> Names:
    """HTTP /predict's texts, sent as one predict request: its `input n` and `inputs[n]` are
    `inputs[positions[n]]`."""
    def text(match: re.Match) -> str:
        return f"inputs[{positions[int(match[1] or match[2])]}]"
    return Names(((r"\binput (\d+)|\binputs\[(\d+)\]", text),))  # one pass: a renamed index is not renamed again


def pair_names(positions: Sequence[int]) -> Names:
    """HTTP /predict's [text, text_pair] pairs of one first text, sent as one rerank request: its query is the text
    of `inputs[positions[0]]` (`inputs[p][0]`), its `document n` and `documents[n]` the text_pair of
    `inputs[positions[n]]` (`inputs[p][1]`)."""
    def text_pair(match: re.Match) -> str:
        return f"inputs[{positions[int(match[1])]}][1]"
    return Names(((r"\bquery\b", f"inputs[{positions[0]}][0]"), (r"\bdocument (\d+)", text_pair),
                  (r"\bdocuments\[(\d+)\]", text_pair), (r"\bdocuments\b", "inputs")))


def rerank_arguments(query: str, texts: list[str], raw_scores: bool, return_text: bool, truncate: bool | None,
                     truncation_direction: str | int) -> dict[str, Any]:
    """The rerank task's arguments of a TEI rerank."""
    return {"query": query, "documents": texts, "raw_scores": raw_scores, "return_documents": return_text,
            **truncation(truncate, truncation_direction)}


def embed_arguments(inputs: list[str], normalize: bool | None, dimensions: int | None, truncate: bool | None,
                    truncation_direction: str | int, prompt_name: str | None) -> dict[str, Any]:
    """The embed task's arguments of a TEI embed; `normalize` and `dimensions` None (unset) take the library's
    defaults. A `prompt_name` is refused."""
    check_prompt_name(prompt_name)
    optional = {name: value for name, value in (("normalize", normalize), ("dimensions", dimensions))
                if value is not None}
    return {"texts": inputs, **optional, **truncation(truncate, truncation_direction)}


def predict_arguments(inputs: list[str], raw_scores: bool, truncate: bool | None,
                      truncation_direction: str | int) -> dict[str, Any]:
    """The predict task's arguments of a TEI predict of single texts."""
    return {"inputs": inputs, "raw_scores": raw_scores, **truncation(truncate, truncation_direction)}


def check_prompt_name(prompt_name: str | None) -> None:
    """TEI's `prompt_name` (embed, tokenize) is refused: radixserve has no named prompts."""
    if prompt_name is not None:
        raise RequestError(f"prompt_name {prompt_name[:40]!r} is not supported: radixserve has no named prompts",
                           "leave it unset and put the prompt in inputs, or call radixserve.v1 Embed with an "
                           "instruction", field="prompt_name")


def truncation(truncate: bool | None, truncation_direction: str | int) -> dict[str, Any]:
    """TEI's `truncate` (unset: false, as in TEI) and `truncation_direction` as the tasks' arguments."""
    if truncation_direction not in DIRECTIONS:
        raise RequestError(f"truncation_direction {truncation_direction!r} is unknown",
                           "send Right or Left (TRUNCATION_DIRECTION_RIGHT or _LEFT over gRPC)",
                           field="truncation_direction")
    return {"truncate": bool(truncate), "truncation_direction": DIRECTIONS[truncation_direction]}


def tei_model_type(card: ModelCard) -> dict[str, dict[str, Any]]:
    """HTTP `/info`'s `model_type`: `{"reranker": {id2label, label2id}}`, `{"embedding": {"pooling": ...}}` or
    `{"classifier": {id2label, label2id}}`."""
    kind = MODEL_TYPES[card.primary_task]
    if kind == "embedding":
        return {kind: {"pooling": "last_token"}}
    labels = [rerank_label(card)] if kind == "reranker" else list(card.labels)
    return {kind: {"id2label": {str(i): label for i, label in enumerate(labels)},
                   "label2id": {label: i for i, label in enumerate(labels)}}}


def tei_model_type_pb(primary_task: str) -> int:
    """gRPC `InfoResponse.model_type` of the primary task."""
    return tei.ModelType.Value(f"MODEL_TYPE_{MODEL_TYPES[primary_task].upper()}")


def rerank_label(card: ModelCard) -> str:
    """The label of a reranker's one score: its score head's, else `RERANK_LABEL`."""
    return card.labels[0] if len(card.labels) == 1 else RERANK_LABEL
