"""`ScoringClient`: a typed Python client of the radixserve gRPC API. Needs grpcio and the stubs, not torch or Ray.

    with ScoringClient("localhost:9000", api_key=os.environ.get("RADIXSERVE_API_KEY")) as client:
        ranked = client.rerank("what is a trie", ["A trie is a prefix tree.", "Bread rises."], top_n=1)
        ranked.results[0].index, ranked.results[0].score, ranked.usage.computed_tokens

The methods take the keyword arguments of the `radix_core.Engine` task methods and return plain dataclasses
shaped like the library's results (lists instead of numpy arrays). Every attempt has the deadline `timeout_s`;
an attempt answered UNAVAILABLE (engine starting, replica restarting) or RESOURCE_EXHAUSTED (overload) is retried
up to `retries` times after `backoff_s`, `2 * backoff_s`, `4 * backoff_s`, ... seconds. Any other error raises the
`grpc.RpcError` at once: its `code()` and `details()` say what was wrong (INVALID_ARGUMENT names the field and the
limit). The client sends what it is given; the server validates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from radixserve.v1 import scoring_pb2 as pb
from radixserve.v1.scoring_pb2_grpc import ScoringStub

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
# gRPC clients accept 4 MiB replies by default; 1024 embeddings of 4096 float32 are 16 MiB.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


@dataclass(frozen=True)
class Usage:
    """Tokens of one call: as sent to the model, and computed after shared prefixes were deduplicated."""

    input_tokens: int
    computed_tokens: int


@dataclass(frozen=True)
class RerankHit:
    index: int  # into the request's documents
    score: float
    document: str | None = None  # with return_documents


@dataclass(frozen=True)
class RerankResult:
    results: list[RerankHit]  # best first
    usage: Usage


@dataclass(frozen=True)
class EmbedResult:
    embeddings: list[list[float]]  # (n, d): row i for text i
    usage: Usage


@dataclass(frozen=True)
class ClassifyResult:
    labels: list[str]
    probabilities: list[list[float]]  # (n_inputs, n_labels), columns in `labels` order
    predictions: list[str]  # the most probable label of each input
    usage: Usage


@dataclass(frozen=True)
class ContinuationScore:
    index: int  # into the request's continuations
    logprob: float  # summed over the continuation's tokens
    mean_logprob: float
    num_tokens: int


@dataclass(frozen=True)
class ScoreResult:
    scores: list[ContinuationScore]  # in request order
    usage: Usage


class ScoringClient:
    """One channel to a radixserve server (`HOST:PORT` of its gRPC proxy, 9000 by default)."""

    def __init__(self, address: str, api_key: str | None = None, timeout_s: float = 30.0, retries: int = 3,
                 backoff_s: float = 0.2):
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._metadata = [("authorization", f"Bearer {api_key}")] if api_key else []
        self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub = ScoringStub(self._channel)

    def rerank(self, query: str, documents: Sequence[str], instruction: str | None = None, top_n: int | None = None,
               return_documents: bool = False, raw_scores: bool = False, truncate: bool = True) -> RerankResult:
        reply = self._call(self._stub.Rerank, pb.RerankRequest(
            query=query, documents=documents, instruction=instruction, top_n=top_n,
            return_documents=return_documents, raw_scores=raw_scores, truncate=truncate))
        hits = [RerankHit(h.index, h.score, h.document if h.HasField("document") else None) for h in reply.results]
        return RerankResult(hits, _usage(reply.usage))

    def embed(self, texts: Sequence[str], instruction: str | None = None, normalize: bool = True,
              dimensions: int | None = None, truncate: bool = True, pooling: str = "last") -> EmbedResult:
        reply = self._call(self._stub.Embed, pb.EmbedRequest(
            texts=texts, instruction=instruction, normalize=normalize, dimensions=dimensions, truncate=truncate,
            pooling=pooling))
        return EmbedResult([list(e.values) for e in reply.embeddings], _usage(reply.usage))

    def classify(self, inputs: Sequence[str], labels: Sequence[str], prefix: str = "",
                 template: str | None = None) -> ClassifyResult:
        reply = self._call(self._stub.Classify, pb.ClassifyRequest(
            inputs=inputs, labels=labels, prefix=prefix, template=template))
        return ClassifyResult(list(reply.labels), [list(r.probabilities) for r in reply.results],
                              [r.label for r in reply.results], _usage(reply.usage))

    def score(self, context: str, continuations: Sequence[str]) -> ScoreResult:
        reply = self._call(self._stub.Score, pb.ScoreRequest(context=context, continuations=continuations))
        scores = [ContinuationScore(s.index, s.logprob, s.mean_logprob, s.num_tokens) for s in reply.scores]
        return ScoreResult(scores, _usage(reply.usage))

    def info(self) -> dict[str, Any]:
        """Model, version, tasks, radix mode and `limits` (a dict), as the server reports them."""
        return _message_dict(self._call(self._stub.Info, pb.InfoRequest()))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ScoringClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: Callable[..., Message], request: Message) -> Message:
        """`method(request)` with the deadline and key; retried with exponential backoff while retryable."""
        attempt = 0
        while True:
            try:
                return method(request, timeout=self.timeout_s, metadata=self._metadata)
            except grpc.RpcError as err:
                if err.code() not in RETRYABLE or attempt >= self.retries:
                    raise
            time.sleep(self.backoff_s * 2 ** attempt)
            attempt += 1


def _message_dict(message: Message) -> dict[str, Any]:
    """Every field of `message` by name (unset ones at their defaults), nested messages as dicts, repeated as lists;
    integers stay integers (protobuf's JSON mapping would make int64 strings)."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and not field.is_repeated:
            out[field.name] = _message_dict(value)
        else:
            out[field.name] = list(value) if field.is_repeated else value
    return out


def _usage(usage: pb.Usage) -> Usage:
    return Usage(usage.input_tokens, usage.computed_tokens)
