"""Text Embeddings Inference's gRPC API (`tei.v1`, proto/tei/v1/tei.proto) as calls of the library's tasks, in one
place: each TEI request message type is one object in `CALLS` (keyed by the message class): a `TeiCall` turns a
message into the keyword arguments of task calls and their results into TEI's response; `Refused` answers a call
radixserve does not serve (Predict: classification by the model's own labels) with INVALID_ARGUMENT saying why.
TEI's `Info` is `info_to_pb`.

Ray's gRPC proxy routes by method name only, so `/tei.v1.Rerank/Rerank` and `/radixserve.v1.Scoring/Rerank` reach
the same ingress method, which looks the request's type up here first. A client stream (RerankStream) arrives as
the list of its messages; a bidirectional stream (EmbedStream, PredictStream) is answered message by message by
the call of its message type.

No validation beyond what TEI has and the library lacks: the tasks check the values; a TEI field radixserve does not
serve (`truncation_direction` LEFT, `prompt_name`) is refused by name, and `renamed` makes a task's error name
TEI's fields (`texts`, not the library's `documents`). Metadata reports the characters, the input tokens and the
total time of the call; radixserve does not time tokenizing, queueing and inference separately, so those stay 0.

A process cannot import both these stubs and `tei-client`'s (both define `tei.v1` in protobuf's default pool):
the server never needs tei-client, and tests run it in a subprocess.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

from google.protobuf.message import Message
from ray.exceptions import RayError

from deployments.grpc_status import root_cause
from radix_core.tasks import EmbedResult, RerankHit, RerankResult
from radixserve.tei.v1 import tei_pb2 as tei

MODEL_TYPES = {"rerank": tei.MODEL_TYPE_RERANKER, "embed": tei.MODEL_TYPE_EMBEDDING,
               "classify": tei.MODEL_TYPE_CLASSIFIER}  # Info.model_type of the model card's primary task


class TeiCall(ABC):
    """One TEI request message answered by calls of one library task: `arguments` gives one keyword-argument
    dict per task call, `reply` the response from their results in the same order."""

    task: ClassVar[str]
    response: ClassVar[type[Message]]
    fields: ClassVar[tuple[tuple[str, str], ...]]  # (pattern naming a library argument, TEI's name for it)

    @abstractmethod
    def arguments(self, request: Any) -> list[dict[str, Any]]:
        """The task calls that answer `request`; a ValueError names a TEI field radixserve does not serve."""

    @abstractmethod
    def reply(self, request: Any, results: Sequence[Any], elapsed_ns: int) -> Message:
        """TEI's response to `request` from the task's results."""


class RerankCall(TeiCall):
    """`Rerank`: one rerank of `texts` against `query`, ranks best first (the library's order)."""

    task = "rerank"
    response = tei.RerankResponse
    fields = ((r"\bdocuments\b", "texts"), (r"\bdocument (\d+)", r"texts[\1]"))

    def arguments(self, request: tei.RerankRequest) -> list[dict[str, Any]]:
        check_direction(request.truncation_direction)
        return [{"query": request.query, "documents": list(request.texts), "raw_scores": request.raw_scores,
                 "return_documents": request.return_text, "truncate": request.truncate}]

    def reply(self, request: tei.RerankRequest, results: Sequence[RerankResult], elapsed_ns: int) -> Message:
        (result,) = results
        chars = len(request.texts) * len(request.query) + sum(len(text) for text in request.texts)
        return tei.RerankResponse(ranks=[rank(hit) for hit in result.results],
                                  metadata=metadata(chars, result.usage.input_tokens, elapsed_ns))


class RerankStreamCall(TeiCall):
    """`RerankStream`: one (query, text) pair per message, ranks indexed by message. The messages of one query (and
    truncation) are one rerank, so their query is computed once; `raw_scores` and `return_text` are the first
    message's, as in TEI."""

    task = "rerank"
    response = tei.RerankResponse
    fields = ((r"\bdocuments\b", "messages"), (r"\bdocument (\d+)", r"message \1 of its query"))

    def arguments(self, messages: Sequence[tei.RerankStreamRequest]) -> list[dict[str, Any]]:
        if not messages:
            raise ValueError("RerankStream received no messages: send at least one (query, text)")
        for message in messages:
            check_direction(message.truncation_direction)
        first = messages[0]
        return [{"query": query, "documents": [messages[i].text for i in indices], "truncate": truncate,
                 "raw_scores": first.raw_scores, "return_documents": first.return_text}
                for (query, truncate), indices in self._groups(messages).items()]

    def reply(self, messages: Sequence[tei.RerankStreamRequest], results: Sequence[RerankResult],
              elapsed_ns: int) -> Message:
        hits = [RerankHit(indices[hit.index], hit.score, hit.document)
                for indices, result in zip(self._groups(messages).values(), results) for hit in result.results]
        hits.sort(key=lambda hit: (-hit.score, hit.index))
        chars = sum(len(m.query) + len(m.text) for m in messages)
        tokens = sum(result.usage.input_tokens for result in results)
        return tei.RerankResponse(ranks=[rank(hit) for hit in hits], metadata=metadata(chars, tokens, elapsed_ns))

    @staticmethod
    def _groups(messages: Sequence[tei.RerankStreamRequest]) -> dict[tuple[str, bool], list[int]]:
        """Message indices by (query, truncate), in order of first appearance."""
        groups: dict[tuple[str, bool], list[int]] = {}
        for i, message in enumerate(messages):
            groups.setdefault((message.query, message.truncate), []).append(i)
        return groups


class EmbedCall(TeiCall):
    """`Embed` (and each message of `EmbedStream`): one text's vector, normalised unless `normalize` is false."""

    task = "embed"
    response = tei.EmbedResponse
    fields = ((r"\btexts\[0\]", "inputs"), (r"\btext 0\b", "inputs"))

    def arguments(self, request: tei.EmbedRequest) -> list[dict[str, Any]]:
        check_direction(request.truncation_direction)
        if request.HasField("prompt_name"):
            raise ValueError(f"prompt_name {request.prompt_name!r} is not supported: radixserve has no named "
                             "prompts; leave it unset and put the prompt in inputs, or call radixserve.v1.Scoring/"
                             "Embed with an instruction")
        optional = {name: getattr(request, name) for name in ("normalize", "dimensions") if request.HasField(name)}
        return [{"texts": [request.inputs], "truncate": request.truncate, **optional}]

    def reply(self, request: tei.EmbedRequest, results: Sequence[EmbedResult], elapsed_ns: int) -> Message:
        (result,) = results
        return tei.EmbedResponse(embeddings=result.embeddings[0].tolist(),
                                 metadata=metadata(len(request.inputs), result.usage.input_tokens, elapsed_ns))


@dataclass(frozen=True)
class Refused:
    """A TEI call radixserve does not serve: `arguments` refuses it (INVALID_ARGUMENT) with `reason`."""

    response: type[Message]
    reason: str
    fields: tuple[tuple[str, str], ...] = ()

    def arguments(self, request: Any) -> NoReturn:
        raise ValueError(self.reason)


PREDICT_REFUSAL = ("tei.v1 Predict classifies a text with the model's own sequence-classification labels, which "
                   "radixserve does not compute: classify against labels you give with radixserve.v1.Scoring/"
                   "Classify, or score (query, text) pairs with Rerank")

CALLS: dict[type[Message], TeiCall | Refused] = {
    tei.RerankRequest: RerankCall(), tei.RerankStreamRequest: RerankStreamCall(), tei.EmbedRequest: EmbedCall(),
    tei.PredictRequest: Refused(tei.PredictResponse, PREDICT_REFUSAL)}


def check_direction(direction: int) -> None:
    """TEI's truncation_direction: radixserve cuts the end of a text (RIGHT) only."""
    if direction != tei.TRUNCATION_DIRECTION_RIGHT:
        raise ValueError(f"truncation_direction {tei.TruncationDirection.Name(direction)} is not supported: "
                         "radixserve truncates the end of each text; send TRUNCATION_DIRECTION_RIGHT (the default)")


def renamed(call: TeiCall | Refused, err: Exception) -> Exception:
    """A task's ValueError with the library's argument names replaced by TEI's (`call.fields`); other errors as
    they are."""
    cause = root_cause(err)
    if not isinstance(cause, ValueError) or isinstance(cause, RayError):
        return err
    message = str(cause)
    for pattern, name in call.fields:
        message = re.sub(pattern, name, message)
    return ValueError(message)


def rank(hit: RerankHit) -> tei.Rank:
    return tei.Rank(index=hit.index, score=hit.score, text=hit.document)


def metadata(chars: int, tokens: int, elapsed_ns: int) -> tei.Metadata:
    return tei.Metadata(compute_chars=chars, compute_tokens=tokens, total_time_ns=elapsed_ns)


def info_to_pb(info: dict[str, Any]) -> tei.InfoResponse:
    """`Ingress.info()` as TEI's `InfoResponse`; `model_type` is the primary task (what tei-client checks)."""
    return tei.InfoResponse(version=info["version"], model_id=info["served_model_name"], model_dtype=info["dtype"],
                            model_type=MODEL_TYPES[info["primary_task"]],
                            max_input_length=info["max_tokens_per_item"],
                            max_batch_tokens=info["max_batch_tokens"], max_client_batch_size=info["max_items"])
