"""Text Embeddings Inference's gRPC API (`tei.v1`, proto/tei/v1/tei.proto) as calls of the library's tasks: each
TEI request message type is one object in `CALLS` (keyed by the message class): a `TeiCall` reads a message's
fields into task calls (through `deployments.tei`, which converts TEI's fields for both TEI transports) and their
results into TEI's response. TEI's `Info` is `info_to_pb`.

Ray's gRPC proxy routes by method name only, so `/tei.v1.Rerank/Rerank` and `/radixserve.v1.Scoring/Rerank` (and
`Embed`, `Predict`) reach the same ingress method, which looks the request's type up here first. A client stream
(RerankStream) arrives as the list of its messages; a bidirectional stream (EmbedStream, PredictStream) is answered
message by message by the call of its message type.

No validation beyond what TEI has and the library lacks: the tasks check the values; `renamed` makes a task's error
name TEI's fields (`texts`, not the library's `documents`). Metadata reports the characters, the input tokens and
the total time of the call; radixserve does not time tokenizing, queueing and inference separately, so those stay 0.

A process cannot import both these stubs and `tei-client`'s (both define `tei.v1` in protobuf's default pool):
the server never needs tei-client, and tests run it in a subprocess.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from google.protobuf.message import Message

from deployments import tei as tei_fields
from deployments.grpc_status import root_cause
from radix_core.errors import RequestError
from radix_core.tasks import EmbedResult, PredictResult, RerankHit, RerankResult
from radixserve.tei.v1 import tei_pb2 as tei


class TeiCall(ABC):
    """One TEI request message answered by calls of one library task: `arguments` gives one keyword-argument
    dict per task call, `reply` the response from their results in the same order."""

    task: ClassVar[str]
    response: ClassVar[type[Message]]
    names: ClassVar[tei_fields.Names]  # the library's argument names in errors, as TEI's

    @abstractmethod
    def arguments(self, request: Any) -> list[dict[str, Any]]:
        """The task calls that answer `request`; a RequestError names a TEI field radixserve does not serve."""

    @abstractmethod
    def reply(self, request: Any, results: Sequence[Any], elapsed_ns: int) -> Message:
        """TEI's response to `request` from the task's results."""


class RerankCall(TeiCall):
    """`Rerank`: one rerank of `texts` against `query`, ranks best first (the library's order)."""

    task = "rerank"
    response = tei.RerankResponse
    names = tei_fields.RERANK_NAMES

    def arguments(self, request: tei.RerankRequest) -> list[dict[str, Any]]:
        return [tei_fields.rerank_arguments(request.query, list(request.texts), request.raw_scores,
                                            request.return_text, request.truncate, request.truncation_direction)]

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
    names = tei_fields.RERANK_STREAM_NAMES

    def arguments(self, messages: Sequence[tei.RerankStreamRequest]) -> list[dict[str, Any]]:
        if not messages:
            raise RequestError("RerankStream received no messages", "send at least one (query, text)")
        first = messages[0]
        return [tei_fields.rerank_arguments(query, [messages[i].text for i in indices], first.raw_scores,
                                            first.return_text, truncate, direction)
                for (query, truncate, direction), indices in self._groups(messages).items()]

    def reply(self, messages: Sequence[tei.RerankStreamRequest], results: Sequence[RerankResult],
              elapsed_ns: int) -> Message:
        hits = [RerankHit(indices[hit.index], hit.score, hit.document)
                for indices, result in zip(self._groups(messages).values(), results) for hit in result.results]
        hits.sort(key=lambda hit: (-hit.score, hit.index))
        chars = sum(len(m.query) + len(m.text) for m in messages)
        tokens = sum(result.usage.input_tokens for result in results)
        return tei.RerankResponse(ranks=[rank(hit) for hit in hits], metadata=metadata(chars, tokens, elapsed_ns))

    @staticmethod
    def _groups(messages: Sequence[tei.RerankStreamRequest]) -> dict[tuple[str, bool, int], list[int]]:
        """Message indices by (query, truncate, truncation_direction), in order of first appearance."""
        groups: dict[tuple[str, bool, int], list[int]] = {}
        for i, message in enumerate(messages):
            groups.setdefault((message.query, message.truncate, message.truncation_direction), []).append(i)
        return groups


class EmbedCall(TeiCall):
    """`Embed` (and each message of `EmbedStream`): one text's vector, normalised unless `normalize` is false."""

    task = "embed"
    response = tei.EmbedResponse
    names = tei_fields.ONE_TEXT_EMBED_NAMES

    def arguments(self, request: tei.EmbedRequest) -> list[dict[str, Any]]:
        optional = {name: getattr(request, name) if request.HasField(name) else None
                    for name in ("normalize", "dimensions", "prompt_name")}
        return [tei_fields.embed_arguments([request.inputs], truncate=request.truncate,
                                           truncation_direction=request.truncation_direction, **optional)]

    def reply(self, request: tei.EmbedRequest, results: Sequence[EmbedResult], elapsed_ns: int) -> Message:
        (result,) = results
        return tei.EmbedResponse(embeddings=result.embeddings[0].tolist(),
                                 metadata=metadata(len(request.inputs), result.usage.input_tokens, elapsed_ns))


class PredictCall(TeiCall):
    """`Predict` (and each message of `PredictStream`): one text's labels, by the model's sequence-classification
    head, best first."""

    task = "predict"
    response = tei.PredictResponse
    names = tei_fields.ONE_TEXT_PREDICT_NAMES

    def arguments(self, request: tei.PredictRequest) -> list[dict[str, Any]]:
        return [tei_fields.predict_arguments([request.inputs], request.raw_scores, request.truncate,
                                             request.truncation_direction)]

    def reply(self, request: tei.PredictRequest, results: Sequence[PredictResult], elapsed_ns: int) -> Message:
        (result,) = results
        return tei.PredictResponse(predictions=[tei.Prediction(score=hit.score, label=hit.label)
                                                for hit in result.results[0]],
                                   metadata=metadata(len(request.inputs), result.usage.input_tokens, elapsed_ns))


CALLS: dict[type[Message], TeiCall] = {
    tei.RerankRequest: RerankCall(), tei.RerankStreamRequest: RerankStreamCall(), tei.EmbedRequest: EmbedCall(),
    tei.PredictRequest: PredictCall()}


def renamed(call: TeiCall, err: Exception) -> Exception:
    """A task's RequestError with the library's argument names replaced by TEI's (`call.names`); other errors as
    they are."""
    cause = root_cause(err)
    return cause.renamed(call.names.rename) if isinstance(cause, RequestError) else err


def rank(hit: RerankHit) -> tei.Rank:
    return tei.Rank(index=hit.index, score=hit.score, text=hit.document)


def metadata(chars: int, tokens: int, elapsed_ns: int) -> tei.Metadata:
    return tei.Metadata(compute_chars=chars, compute_tokens=tokens, total_time_ns=elapsed_ns)


def info_to_pb(info: dict[str, Any]) -> tei.InfoResponse:
    """`Ingress.info()` as TEI's `InfoResponse`; `model_type` is the primary task (what tei-client checks)."""
    return tei.InfoResponse(version=info["version"], model_id=info["served_model_name"], model_dtype=info["dtype"],
                            model_type=tei_fields.tei_model_type_pb(info["primary_task"]),
                            max_input_length=info["max_tokens_per_item"],
                            max_batch_tokens=info["max_batch_tokens"], max_client_batch_size=info["max_items"])
