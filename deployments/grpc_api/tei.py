"""Text Embeddings Inference's gRPC API (`tei.v1`, proto/tei/v1/tei.proto) as requests of the library's tasks: each
TEI request message type is one `TeiCall` (`CALLS`, keyed by the message class). Most are `TaskCall`s, which read a
message's fields into task requests (through `deployments.tei`, which converts TEI's fields for both TEI
transports) and their results into TEI's response; their errors name TEI's fields (`TaskCall.names`, a table
applied to the structured error). Tokenize and Decode need no engine: the ingress's tokenizer answers them.

    Rerank, Embed, Predict,    unary: the call's requests take the one request path together (`answer_all`)
    PredictPair
    RerankStream               client stream: read whole within the limits, then answered as one call
    EmbedStream, PredictStream, bidirectional: each message answered as its unary call, up to STREAM_WINDOW at once
    PredictPairStream, TokenizeStream, DecodeStream
    Tokenize, Decode           unary: the tokenizer at the ingress (in a worker thread), as HTTP /tokenize, /decode
    Info                       `Server.info()` as TEI's InfoResponse

Rerank, Embed, Predict and Info share their names with radixserve.v1's rpcs, so they reach the same ingress
methods, which tell them apart by the request's message type (`deployments.grpc_api.registry`).

No validation beyond what TEI has and the library lacks: the tasks check the values. Metadata reports the
characters, the input tokens and the total time of the call; radixserve does not time tokenizing, queueing and
inference separately, so those stay 0.

A process cannot import both these stubs and `tei-client`'s (both define `tei.v1` in protobuf's default pool):
the server never needs tei-client, and tests run it in a subprocess.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any, ClassVar

from google.protobuf import message_factory
from google.protobuf.message import Message
from ray.serve.grpc_util import RayServegRPCContext

from deployments import tei as tei_fields
from deployments.engine_request import Priority
from deployments.grpc_api.calls import answer_call, metadata_priority
from deployments.grpc_api.service import BIDIRECTIONAL, CLIENT_STREAM, UNARY, GrpcService, Rpc
from deployments.grpc_api.streams import StreamEnded, answer_each, read_whole
from deployments.grpc_status import root_cause
from deployments.metrics import API_TEI_GRPC
from deployments.request_path import answer_all
from deployments.server import Server
from radix_core.errors import FieldNames, RequestError
from radix_core.tasks import EmbedResult, PredictResult, RerankHit, RerankResult, TaskRequest
from radixserve.tei.v1 import tei_pb2 as tei


class TeiCall(ABC):
    """One TEI request message type and how the ingress answers it."""

    task: ClassVar[str]  # the metrics' task label
    response: ClassVar[type[Message]]

    @abstractmethod
    async def answer(self, server: Server, request: Any, priority: Priority) -> Message:
        """TEI's response to `request` (a message, or a client stream's messages)."""


class TaskCall(TeiCall):
    """A call answered by requests of one library task: `requests` gives the task requests, `reply` the response
    from their results in the same order; a task's error names TEI's fields (`names`)."""

    names: ClassVar[FieldNames]  # the library's field names in errors, as TEI's

    @abstractmethod
    def requests(self, request: Any) -> list[TaskRequest]:
        """The task requests that answer `request`; a RequestError names a TEI field radixserve does not serve."""

    @abstractmethod
    def reply(self, server: Server, request: Any, results: Sequence[Any], elapsed_ns: int) -> Message:
        """TEI's response to `request` from the task's results."""

    async def answer(self, server: Server, request: Any, priority: Priority) -> Message:
        """The task requests at once (all or none: the first failure cancels the others), then TEI's response."""
        started = time.perf_counter_ns()
        try:
            results = await answer_all(server.answer, self.requests(request), priority)
        except Exception as err:
            raise renamed(self.names, err)
        return await asyncio.to_thread(self.reply, server, request, results, time.perf_counter_ns() - started)


class RerankCall(TaskCall):
    """`Rerank`: one rerank of `texts` against `query`, ranks best first (the library's order)."""

    task = "rerank"
    response = tei.RerankResponse
    names = tei_fields.RERANK_NAMES

    def requests(self, request: tei.RerankRequest) -> list[TaskRequest]:
        return [tei_fields.rerank_request(request.query, list(request.texts), request.raw_scores,
                                          request.return_text, request.truncate, request.truncation_direction)]

    def reply(self, server: Server, request: tei.RerankRequest, results: Sequence[RerankResult],
              elapsed_ns: int) -> Message:
        (result,) = results
        chars = len(request.texts) * len(request.query) + sum(len(text) for text in request.texts)
        return tei.RerankResponse(ranks=[rank(hit) for hit in result.results],
                                  metadata=metadata(chars, result.usage.input_tokens, elapsed_ns))


class RerankStreamCall(TaskCall):
    """`RerankStream`: one (query, text) pair per message, ranks indexed by message. The messages of one query (and
    truncation) are one rerank, so their query is computed once; `raw_scores` and `return_text` are the first
    message's, as in TEI."""

    task = "rerank"
    response = tei.RerankResponse
    names = tei_fields.RERANK_STREAM_NAMES

    def requests(self, messages: Sequence[tei.RerankStreamRequest]) -> list[TaskRequest]:
        if not messages:
            raise RequestError("RerankStream received no messages", "send at least one (query, text)")
        first = messages[0]
        return [tei_fields.rerank_request(query, [messages[i].text for i in indices], first.raw_scores,
                                          first.return_text, truncate, direction)
                for (query, truncate, direction), indices in self._groups(messages).items()]

    def reply(self, server: Server, messages: Sequence[tei.RerankStreamRequest], results: Sequence[RerankResult],
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


class EmbedCall(TaskCall):
    """`Embed` (and each message of `EmbedStream`): one text's vector, normalised unless `normalize` is false."""

    task = "embed"
    response = tei.EmbedResponse
    names = tei_fields.ONE_TEXT_EMBED_NAMES

    def requests(self, request: tei.EmbedRequest) -> list[TaskRequest]:
        optional = {name: getattr(request, name) if request.HasField(name) else None
                    for name in ("normalize", "dimensions", "prompt_name")}
        return [tei_fields.embed_request([request.inputs], truncate=request.truncate,
                                         truncation_direction=request.truncation_direction, **optional)]

    def reply(self, server: Server, request: tei.EmbedRequest, results: Sequence[EmbedResult],
              elapsed_ns: int) -> Message:
        (result,) = results
        return tei.EmbedResponse(embeddings=result.embeddings[0].tolist(),
                                 metadata=metadata(len(request.inputs), result.usage.input_tokens, elapsed_ns))


class PredictCall(TaskCall):
    """`Predict` (and each message of `PredictStream`): one text's labels, by the model's sequence-classification
    head, best first."""

    task = "predict"
    response = tei.PredictResponse
    names = tei_fields.ONE_INPUT_NAMES

    def requests(self, request: tei.PredictRequest) -> list[TaskRequest]:
        return [tei_fields.predict_request([request.inputs], request.raw_scores, request.truncate,
                                           request.truncation_direction)]

    def reply(self, server: Server, request: tei.PredictRequest, results: Sequence[PredictResult],
              elapsed_ns: int) -> Message:
        (result,) = results
        return tei.PredictResponse(predictions=[tei.Prediction(score=hit.score, label=hit.label)
                                                for hit in result.results[0]],
                                   metadata=metadata(len(request.inputs), result.usage.input_tokens, elapsed_ns))


class PredictPairCall(TaskCall):
    """`PredictPair` (and each message of `PredictPairStream`): a [text, text_pair] pair scored by the rerank task,
    as HTTP /predict scores one, labelled with the score head's one label (else "relevance")."""

    task = "rerank"
    response = tei.PredictResponse
    names = tei_fields.ONE_PAIR_NAMES

    def requests(self, request: tei.PredictPairRequest) -> list[TaskRequest]:
        if len(request.inputs) != 2:
            raise RequestError.about("inputs", f"has {len(request.inputs)} texts", "send a [text, text_pair] pair")
        text, pair = request.inputs
        return [tei_fields.rerank_request(text, [pair], request.raw_scores, False, request.truncate,
                                          request.truncation_direction)]

    def reply(self, server: Server, request: tei.PredictPairRequest, results: Sequence[RerankResult],
              elapsed_ns: int) -> Message:
        (result,) = results
        (hit,) = result.results
        return tei.PredictResponse(predictions=[tei.Prediction(score=hit.score,
                                                               label=tei_fields.rerank_label(server.card))],
                                   metadata=metadata(sum(map(len, request.inputs)), result.usage.input_tokens,
                                                     elapsed_ns))


class TokenizeCall(TeiCall):
    """`Tokenize` (and each message of `TokenizeStream`): one text's tokens, as HTTP /tokenize gives them."""

    task = "tokenize"
    response = tei.EncodeResponse

    async def answer(self, server: Server, request: tei.EncodeRequest, priority: Priority) -> Message:
        prompt_name = request.prompt_name if request.HasField("prompt_name") else None
        try:
            (tokens,) = await asyncio.to_thread(tei_fields.tokens, server.context, [request.inputs],
                                                request.add_special_tokens, prompt_name)
        except Exception as err:
            raise renamed(tei_fields.ONE_INPUT_NAMES, err)
        return tei.EncodeResponse(tokens=[tei.SimpleToken(**token) for token in tokens])


class DecodeCall(TeiCall):
    """`Decode` (and each message of `DecodeStream`): one sequence of ids as text, as HTTP /decode gives it."""

    task = "decode"
    response = tei.DecodeResponse

    async def answer(self, server: Server, request: tei.DecodeRequest, priority: Priority) -> Message:
        (text,) = await asyncio.to_thread(tei_fields.decode, server.context, [list(request.ids)],
                                          request.skip_special_tokens, one=True)
        return tei.DecodeResponse(text=text)


CALLS: dict[type[Message], TeiCall] = {
    tei.RerankRequest: RerankCall(), tei.RerankStreamRequest: RerankStreamCall(), tei.EmbedRequest: EmbedCall(),
    tei.PredictRequest: PredictCall(), tei.PredictPairRequest: PredictPairCall(), tei.EncodeRequest: TokenizeCall(),
    tei.DecodeRequest: DecodeCall()}


class TeiService(GrpcService):
    name = "tei.v1"

    def rpcs(self) -> list[Rpc]:
        """Every rpc of tei.v1's services, by its shape (`Info` by its own handler)."""
        rpcs = []
        for service in tei.DESCRIPTOR.services_by_name.values():
            for rpc in service.methods:
                request_type = message_factory.GetMessageClass(rpc.input_type)
                if request_type is tei.InfoRequest:
                    rpcs.append(Rpc(rpc.name, request_type, answer_info))
                    continue
                call = CALLS[request_type]
                if rpc.client_streaming and rpc.server_streaming:
                    rpcs.append(Rpc(rpc.name, request_type, partial(answer_bidirectional, call), BIDIRECTIONAL))
                elif rpc.client_streaming:
                    rpcs.append(Rpc(rpc.name, request_type, partial(answer_client_stream, call), CLIENT_STREAM))
                else:
                    rpcs.append(Rpc(rpc.name, request_type, partial(answer_unary, call), UNARY))
        return rpcs


async def answer_unary(call: TeiCall, server: Server, request: Message | None,
                       grpc_context: RayServegRPCContext) -> Message:
    """One tei.v1 call of a message (None: a stream refused by its key, which `answer_call` answers before
    `answer` could run)."""
    async def answer() -> Message:
        return await call.answer(server, request, metadata_priority(grpc_context))
    return await answer_call(server, request, grpc_context, call.response, answer, call.task, API_TEI_GRPC)


async def answer_client_stream(call: TeiCall, server: Server, requests: AsyncIterator[Message],
                               grpc_context: RayServegRPCContext) -> Message:
    """A client stream, answered once as one call of all its messages: its key is checked from the metadata before
    a message is read (`answer_call`), then its messages are read within the limits (`read_whole`), and only then
    is it counted as a gRPC call in flight."""
    async def answer() -> Message:
        args = server.args
        messages = await read_whole(requests, args.tasks.max_items, args.limits.max_request_bytes,
                                    args.limits.client_input_timeout_s)
        with server.grpc_in_flight.admitted():
            return await call.answer(server, messages, metadata_priority(grpc_context))
    return await answer_call(server, None, grpc_context, call.response, answer, call.task, API_TEI_GRPC)


async def answer_bidirectional(call: TeiCall, server: Server, requests: AsyncIterator[Message],
                               grpc_context: RayServegRPCContext) -> AsyncIterator[Message]:
    """A bidirectional stream: refused before a message is read without a valid key (answered and metered as one
    refused call), else each message answered as its unary call (`answer_each`)."""
    if server.api_keys.refusal(grpc_context.invocation_metadata()) is not None:
        await answer_unary(call, server, None, grpc_context)
        raise StreamEnded(grpc_context.details())
    async for reply in answer_each(requests, grpc_context, server.args.limits.client_input_timeout_s,
                                   partial(answer_unary, call, server)):
        yield reply


async def answer_info(server: Server, request: tei.InfoRequest, grpc_context: RayServegRPCContext) -> Message:
    """`Server.info()` as TEI's `InfoResponse`."""
    async def answer() -> Message:
        return info_to_pb(await server.info())
    return await answer_call(server, request, grpc_context, tei.InfoResponse, answer, "info", API_TEI_GRPC)


def renamed(names: FieldNames, err: Exception) -> Exception:
    """A task's RequestError in TEI's field names (`names`); other errors as they are."""
    cause = root_cause(err)
    return cause.renamed(names) if isinstance(cause, RequestError) else err


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
