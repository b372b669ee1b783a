"""Protobuf <-> library values for the gRPC API, in one place: request messages become the keyword-argument dicts of
the `radix_core.Engine` task methods (`from_pb`), task results and the info dict become response messages
(`to_pb`, `info_to_pb`). No validation here: the library checks the values and says what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from radixserve.v1 import scoring_pb2 as pb

RESPONSES: dict[str, type[Message]] = {
    "rerank": pb.RerankResponse, "embed": pb.EmbedResponse, "classify": pb.ClassifyResponse,
    "score": pb.ScoreResponse,
}


def from_pb(request: Message) -> dict[str, Any]:
    """The task method's keyword arguments: each field under its own name (the proto names them after the library's
    arguments), repeated fields as lists; an unset `optional` field is left out so the library default applies."""
    kwargs = {}
    for field in request.DESCRIPTOR.fields:
        if field.has_presence and not request.HasField(field.name):
            continue
        value = getattr(request, field.name)
        kwargs[field.name] = list(value) if field.is_repeated else value
    return kwargs


def to_pb(task: str, result: Any) -> Message:
    """The response message of `task` for its result (`RerankResult`, `EmbedResult`, ...)."""
    return _ENCODERS[task](result)


def usage_to_pb(usage: Any) -> pb.Usage:
    return pb.Usage(input_tokens=usage.input_tokens, computed_tokens=usage.computed_tokens)


def info_to_pb(info: dict[str, Any]) -> pb.InfoResponse:
    """`Ingress.info()` as an `InfoResponse`; keys the message has no field for (e.g. index_builder) stay out."""
    limits = pb.Limits(**{name: info[name] for name in pb.Limits.DESCRIPTOR.fields_by_name})
    fields = {name: info[name] for name in pb.InfoResponse.DESCRIPTOR.fields_by_name if name != "limits"}
    return pb.InfoResponse(**fields, limits=limits)


def _rerank_to_pb(result: Any) -> pb.RerankResponse:
    hits = [pb.RerankHit(index=hit.index, score=hit.score, document=hit.document) for hit in result.results]
    return pb.RerankResponse(results=hits, usage=usage_to_pb(result.usage))


def _embed_to_pb(result: Any) -> pb.EmbedResponse:
    vectors = [pb.Embedding(values=row) for row in result.embeddings.tolist()]  # (n, d) -> n messages
    return pb.EmbedResponse(embeddings=vectors, usage=usage_to_pb(result.usage))


def _classify_to_pb(result: Any) -> pb.ClassifyResponse:
    rows = [pb.Classification(probabilities=row, label=label)
            for row, label in zip(result.probabilities.tolist(), result.predictions)]  # (n, L) -> n messages
    return pb.ClassifyResponse(labels=result.labels, results=rows, usage=usage_to_pb(result.usage))


def _score_to_pb(result: Any) -> pb.ScoreResponse:
    scores = [pb.ContinuationScore(index=s.index, logprob=s.logprob, mean_logprob=s.mean_logprob,
                                   num_tokens=s.num_tokens) for s in result.scores]
    return pb.ScoreResponse(scores=scores, usage=usage_to_pb(result.usage))


_ENCODERS: dict[str, Callable[[Any], Message]] = {
    "rerank": _rerank_to_pb, "embed": _embed_to_pb, "classify": _classify_to_pb, "score": _score_to_pb,
}
