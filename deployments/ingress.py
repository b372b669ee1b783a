"""`Ingress`: the CPU front door. Validates, renders and tokenizes each request exactly once, derives its prefix
key from the token ids, cuts it into token-bounded parts that keep that key, sends them to the engine deployment
in one call (`EngineRequest`: admitted, refused and cancelled as one) and merges the answers. Every bad-input error
is raised here, before anything is queued; the CPU work (tokenizing, merging, protobuf conversion) runs in worker
threads, never on the event loop.

Two faces: `call(task, request_dict)` for DeploymentHandle callers, and methods named after the gRPC calls
(`Rerank`, ... for every task in `radix_core.tasks.TASKS`, named by `Task.rpc`; `Info`; `Check`, `List`, `Watch`
of grpc.health.v1) that Ray Serve's gRPC proxy invokes with the request message and a `RayServegRPCContext`.
Those check the API key and the message size, convert with `grpc_codec`, and answer an error by setting the
status code (`grpc_status`) on the context and returning an empty response: Ray sends that code and message,
never a stack trace. (A method missing here that a registered servicer declares would answer INTERNAL with Ray's
stack trace, so every method of grpc.health.v1.Health is defined.)

The prefix key is a hash of the token ids every sequence of the request starts with (`TaskJob.shared_ids`: the
template's system prompt, instruction and query for rerank, the instruction for embed, the few-shot prefix for
classify, the context for score), exactly what the radix trie deduplicates. `PrefixAffinityRouter` sends one key
to one engine replica, where the batcher puts the parts of one prefix into one batch.

A call cancelled by its client (a gRPC deadline or cancel, an HTTP disconnect: Ray Serve cancels the ingress call
and the engine call it awaits) leaves the engine's queue; a call made of several task calls (a tei.v1 stream over
several queries) cancels the others when one fails.

Ray's gRPC proxy gives a tei.v1 stream one of the replica's `ingress_max_ongoing_requests` slots from its start,
before any message arrives. So a stream's key is checked from its metadata before a message is read, and its input
is bounded in time (`client_input_timeout_s`): peers without a key, or idle ones, cannot hold the slots of other
calls.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from ray import serve
from ray.serve.grpc_util import RayServegRPCContext
from ray.serve.handle import DeploymentHandle

from deployments import grpc_codec, request_ids, tei_grpc
from deployments.auth import load_api_keys
from deployments.batcher import QueueFullError
from deployments.config import AppArgs
from deployments.engine_request import PRIORITY_HEADER, EngineRequest, Priority
from deployments.grpc_status import retry_after_s, status_of
from deployments.http import build_app
from deployments.metrics import API_GRPC, API_TEI_GRPC, IngressMetrics, count_usage
from deployments.model_card import model_card
from radix_core.errors import RequestError
from radix_core.tasks import TASKS, Task, TaskJob, load_task_context, task_of
from radixserve import __version__
from radixserve.client import RETRY_AFTER_KEY
from radixserve.tei.v1 import tei_pb2 as tei
from radixserve.v1 import scoring_pb2 as pb

logger = logging.getLogger("ray.serve")

HEALTH_TIMEOUT_S = 5.0  # Check answers NOT_SERVING when no engine replica answers within this
HEALTH_SERVICES = ("", "radixserve.v1.Scoring")  # the server as a whole, and the one service it offers
INFO_REPLIES = {pb.InfoRequest: (pb.InfoResponse, grpc_codec.info_to_pb, API_GRPC),  # Info's answer, api label
                tei.InfoRequest: (tei.InfoResponse, tei_grpc.info_to_pb, API_TEI_GRPC)}
TEI_STREAM_WINDOW = 64  # messages of one bidirectional tei.v1 stream answered at once (the engine batches them)

class TeiStreamEnded(Exception):
    """Ends a bidirectional tei.v1 stream at a message's refusal or error; its status is already on the context."""


class StreamRefused(Exception):
    """A tei.v1 stream refused while it is read, with a status other than a bad request's: more bytes than one call
    may have (RESOURCE_EXHAUSTED), input that did not come within client_input_timeout_s (DEADLINE_EXCEEDED)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code


def prefix_key(job: TaskJob) -> str | None:
    """A stable hash (unlike Python's `hash`) of the ids every sequence of the job starts with; None without
    any, so requests that share nothing are placed by load alone."""
    shared = job.shared_ids
    if shared.size == 0:
        return None
    return hashlib.blake2b(shared.astype("<i4").tobytes(), digest_size=16).hexdigest()


async def gather_or_cancel(calls: list[Awaitable[Any]]) -> list[Any]:
    """`asyncio.gather(*calls)`, except that the first failure cancels the calls still running (gather lets them
    run on, computing for a request that has already failed)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _metadata_priority(grpc_context: RayServegRPCContext) -> str | None:
    """The `x-radixserve-priority` metadata of a gRPC call, if sent."""
    return dict(grpc_context.invocation_metadata()).get(PRIORITY_HEADER)


def _task_rpc_method(task: Task) -> Callable:
    """The gRPC method `task.rpc` (Ray's proxy calls the ingress method named after the rpc); a tei.v1 message
    (`/tei.v1.Rerank/Rerank` reaches the same method) is answered by its TEI call."""
    async def method(self: Ingress, request: Message, grpc_context: RayServegRPCContext) -> Message:
        call = tei_grpc.CALLS.get(type(request))
        if call is not None:
            return await self._tei_rpc(call, request, grpc_context)
        return await self._task_rpc(task, request, grpc_context)

    method.__name__ = method.__qualname__ = task.rpc
    method.__doc__ = f"radixserve.v1.Scoring/{task.rpc}: the {task.name} task."
    return method


async def _each_within(messages: AsyncIterator[Message], timeout_s: float) -> AsyncIterator[Message]:
    """A stream's messages, each within `timeout_s` of the one before (the first of the start); StreamRefused with
    DEADLINE_EXCEEDED for one that does not come in time."""
    stream = aiter(messages)
    while True:
        try:
            message = await asyncio.wait_for(anext(stream), timeout_s)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise StreamRefused(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no message came on the stream for {timeout_s:g} s, the most the server waits: send "
                                "a stream's messages without pauses, and close it when done") from None
        yield message


def _log_refusal(code: grpc.StatusCode, details: str) -> None:
    """One WARNING line for a call refused for a reason the client can fix (no stack trace)."""
    logger.warning("request %s refused: %s: %s", request_ids.current(), code.name, details)


def _end_stream(grpc_context: RayServegRPCContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """End a bidirectional stream with `code` (Ray sends the code set on the context when the method raises)."""
    grpc_context.set_code(code)
    grpc_context.set_details(details)
    raise TeiStreamEnded(details)


def _with_task_rpcs(cls: type) -> type:
    """`cls` with one gRPC method per task in the registry, named after `Task.rpc`."""
    for task in TASKS.values():
        setattr(cls, task.rpc, _task_rpc_method(task))
    return cls


def _tei_rpc_method(rpc: MethodDescriptor) -> Callable:
    """The method of a tei.v1 rpc, by its shape: unary, client stream (answered once, when it ends) or
    bidirectional (one reply per message). Ray's proxy passes a stream as a `gRPCInputStream` of messages."""
    call = tei_grpc.CALLS[message_factory.GetMessageClass(rpc.input_type)]
    if rpc.client_streaming and rpc.server_streaming:
        async def method(self: Ingress, requests: AsyncIterator[Message], grpc_context: RayServegRPCContext):
            async for reply in self._tei_each(call, requests, grpc_context):
                yield reply
    elif rpc.client_streaming:
        async def method(self: Ingress, requests: AsyncIterator[Message], grpc_context: RayServegRPCContext):
            return await self._tei_stream(call, requests, grpc_context)
    else:
        async def method(self: Ingress, request: Message, grpc_context: RayServegRPCContext):
            return await self._tei_rpc(call, request, grpc_context)
    method.__name__ = method.__qualname__ = rpc.name
    method.__doc__ = f"{rpc.full_name}: answered by `tei_grpc`."
    return method


def _with_tei_rpcs(cls: type) -> type:
    """`cls` with a method for each tei.v1 rpc it has none for; those it has (Rerank, Embed, Info) answer tei.v1
    messages by their type."""
    for service in tei.DESCRIPTOR.services_by_name.values():
        for rpc in service.methods:
            if not hasattr(cls, rpc.name):
                setattr(cls, rpc.name, _tei_rpc_method(rpc))
    return cls


@serve.deployment
@serve.ingress()
@_with_tei_rpcs
@_with_task_rpcs
class Ingress:
    """`call(task, request)` with the `Engine` method's keyword arguments as a dict, and the gRPC calls of
    `radixserve.v1.Scoring`, `grpc.health.v1.Health` and TEI's `tei.v1` (`tei_grpc`; a method name both APIs use
    answers by the request's message type)."""

    def __init__(self, engine: DeploymentHandle, args: AppArgs):
        self.engine = engine
        self.args = args
        self.api_keys = load_api_keys(args.api_keys_file, args.api_keys_env)
        self.context = load_task_context(args.model, args.task_config())
        self.card = model_card(args.model, args.served_model_name, args.primary_task, self.context)
        self.submitted_parts = 0  # parts sent to the engine by this replica
        self.metrics = IngressMetrics()

    async def call(self, task: str, request: dict[str, Any], priority: str | None = None) -> Any:
        """The task's result for one request (`priority`: interactive, the default, or batch); a ValueError names
        what is wrong before anything is queued."""
        return await self._answer(task_of(task), request, Priority.parse(priority))

    async def info(self) -> dict[str, Any]:
        engine = await self.engine.info.remote()
        return {**engine, "version": __version__, "tasks": list(TASKS), "max_items": self.args.max_items_per_request,
                "max_tokens_per_item": self.context.token_limit, "max_request_tokens": self.args.max_request_tokens,
                "max_request_bytes": self.args.max_request_bytes, "submitted_parts": self.submitted_parts,
                **self.card.info(), "model": self.card.served_model_name}

    def __serve_build_asgi_app__(self):
        """The HTTP API on port 8000 (`deployments.http`), built by Ray Serve after the constructor."""
        return build_app(self)

    async def Info(self, request: Message, grpc_context: RayServegRPCContext) -> Message:
        """radixserve.v1.Scoring/Info, and tei.v1.Info/Info (the same method name): `info()` in the request's
        dialect."""
        response, convert, api = INFO_REPLIES[type(request)]

        async def answer() -> Message:
            return convert(await self.info())
        return await self._rpc(request, grpc_context, response, answer, "info", api)

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    grpc_context: RayServegRPCContext) -> health_pb2.HealthCheckResponse:
        """grpc.health.v1: SERVING when an engine replica answers, else NOT_SERVING; NOT_FOUND for a service this
        server does not offer. Needs no API key (load balancers and probes call it), nor do List and Watch."""
        if request.service not in HEALTH_SERVICES:
            grpc_context.set_code(grpc.StatusCode.NOT_FOUND)
            grpc_context.set_details(f"unknown service {request.service!r}: ask for one of {list(HEALTH_SERVICES)}")
            return health_pb2.HealthCheckResponse()
        return await self._health()

    async def List(self, request: health_pb2.HealthListRequest,
                   grpc_context: RayServegRPCContext) -> health_pb2.HealthListResponse:
        """grpc.health.v1: the status of each service Check knows (all the same: they share the engine)."""
        health = await self._health()
        return health_pb2.HealthListResponse(statuses={service: health for service in HEALTH_SERVICES})

    async def Watch(self, request: health_pb2.HealthCheckRequest, grpc_context: RayServegRPCContext):
        """grpc.health.v1 streaming: not offered, as each watcher would hold an ingress request slot for as long as
        it watches. UNIMPLEMENTED is the protocol's answer for that (gRPC's client-side health checking then relies
        on the connection); Ray sends the code set here when the method raises."""
        grpc_context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        grpc_context.set_details("grpc.health.v1.Health/Watch is not offered: poll Health/Check")
        raise NotImplementedError("grpc.health.v1.Health/Watch is not offered")

    async def _task_rpc(self, task: Task, request: Message, grpc_context: RayServegRPCContext) -> Message:
        """One Scoring task call: the request message as the task's arguments, the result as its response."""
        async def answer() -> Message:
            priority = Priority.parse(grpc_codec.priority_of(request) or _metadata_priority(grpc_context))
            result = await self._answer(task, grpc_codec.from_pb(request), priority)
            return await asyncio.to_thread(grpc_codec.to_pb, task, result)
        return await self._rpc(request, grpc_context, grpc_codec.response_type(task), answer, task.name, API_GRPC)

    async def _tei_rpc(self, call: tei_grpc.TeiCall, request: Message | None,
                       grpc_context: RayServegRPCContext) -> Message:
        """One tei.v1 call of a message (None: a stream refused by its key, which `_refusal` answers before
        `answer` could run)."""
        async def answer() -> Message:
            return await self._tei_answer(call, request, Priority.parse(_metadata_priority(grpc_context)))
        return await self._rpc(request, grpc_context, call.response, answer, call.task, API_TEI_GRPC)

    async def _tei_stream(self, call: tei_grpc.TeiCall, requests: AsyncIterator[Message],
                          grpc_context: RayServegRPCContext) -> Message:
        """A tei.v1 client stream, answered once as one call of all its messages: its key is checked from the
        metadata before a message is read (`_refusal`), then its messages are read within the limits
        (`_gathered`)."""
        async def answer() -> Message:
            messages = await self._gathered(requests)
            return await self._tei_answer(call, messages, Priority.parse(_metadata_priority(grpc_context)))
        return await self._rpc(None, grpc_context, call.response, answer, call.task, API_TEI_GRPC)

    async def _tei_answer(self, call: tei_grpc.TeiCall, request: Message | list[Message],
                          priority: Priority) -> Message:
        """The task calls of `call` at once (all or none: the first failure cancels the others), then TEI's
        response; a task's error names TEI's fields."""
        started = time.perf_counter_ns()
        try:
            calls = call.arguments(request)
            task = task_of(call.task)
            results = await gather_or_cancel([self._answer(task, arguments, priority) for arguments in calls])
        except Exception as err:
            raise tei_grpc.renamed(call, err)
        return await asyncio.to_thread(call.reply, request, results, time.perf_counter_ns() - started)

    async def _tei_each(self, call: tei_grpc.TeiCall, requests: AsyncIterator[Message],
                        grpc_context: RayServegRPCContext) -> AsyncIterator[Message]:
        """A bidirectional tei.v1 stream: each message answered as its unary call would be (key, size, status), up
        to TEI_STREAM_WINDOW at once, replies in message order. A stream without a valid key is refused before a
        message is read; the first refusal or error, or a next message that does not come within
        `client_input_timeout_s`, ends the stream with its status. However the stream ends, its reader and answers
        are finished (cancelled if still running) before this returns: no task outlives it."""
        if self.api_keys.refusal(grpc_context.invocation_metadata()) is not None:
            await self._tei_rpc(call, None, grpc_context)  # answered and metered as one refused call
            raise TeiStreamEnded(grpc_context.details())
        window = asyncio.Semaphore(TEI_STREAM_WINDOW)
        answers: asyncio.Queue[tuple[RayServegRPCContext, asyncio.Task] | None] = asyncio.Queue()
        running: set[asyncio.Task] = set()  # answers not finished yet

        async def read() -> None:
            try:
                async for message in _each_within(requests, self.args.client_input_timeout_s):
                    await window.acquire()
                    context = copy.copy(grpc_context)  # each message's own status
                    answer = asyncio.create_task(self._tei_rpc(call, message, context))
                    running.add(answer)
                    answer.add_done_callback(running.discard)
                    answers.put_nowait((context, answer))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await answers.get()) is not None:
                context, answer = item
                reply = await answer
                window.release()
                if context.code() not in (None, grpc.StatusCode.OK):
                    _end_stream(grpc_context, context.code(), context.details())
                yield reply
            await reader  # the stream's own error, if reading it failed
        except StreamRefused as refusal:
            _log_refusal(refusal.code, str(refusal))
            _end_stream(grpc_context, refusal.code, str(refusal))
        finally:
            left = [reader, *running]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)

    async def _gathered(self, requests: AsyncIterator[Message]) -> list[Message]:
        """All of a client stream's messages, or StreamRefused before anything is computed, so no message is ever
        dropped: DEADLINE_EXCEEDED when the stream has not ended within client_input_timeout_s of its start, else
        `_read_whole`'s refusals."""
        messages: list[Message] = []
        timeout_s = self.args.client_input_timeout_s
        try:
            await asyncio.wait_for(self._read_whole(requests, messages), timeout_s)
        except asyncio.TimeoutError:
            raise StreamRefused(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"the stream did not end within {timeout_s:g} s, the most the server waits for one "
                                f"({len(messages)} messages came): send its messages without pauses and close it"
                                ) from None
        return messages

    async def _read_whole(self, requests: AsyncIterator[Message], messages: list[Message]) -> None:
        """Append the stream's messages to `messages`: a RequestError at message max_items_per_request + 1 (the
        rest is not read: each message is a round trip to the proxy, and empty ones cost no bytes), StreamRefused
        with RESOURCE_EXHAUSTED once they pass max_request_bytes together."""
        most, limit, size = self.args.max_items_per_request, self.args.max_request_bytes, 0
        async for message in requests:
            if len(messages) == most:
                raise RequestError(f"the stream has more than {most} messages, the limit of one call "
                                   "(max_items_per_request)", f"send at most {most} messages per stream",
                                   field="messages", limit=most)
            size += message.ByteSize()
            if size > limit:
                raise StreamRefused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"the stream's messages are over {limit} bytes together, the limit of one call "
                                    "(max_request_bytes): split them into smaller streams")
            messages.append(message)

    async def _rpc(self, request: Message | None, grpc_context: RayServegRPCContext, response: type[Message],
                   answer: Callable[[], Awaitable[Message]], task: str, api: str) -> Message:
        """`_status(...)`, metered (`IngressMetrics`: `task`, `api` and the status code) and answered with the
        call's request id (`request_ids`: the client's `x-request-id`, or Ray's), which every log line about the
        call carries."""
        request_id = request_ids.adopt(grpc_context)
        with self.metrics.request(task, api, request_id) as meter:
            reply = await self._status(request, grpc_context, response, answer)
            meter.code = (grpc_context.code() or grpc.StatusCode.OK).name
        request_ids.reply(grpc_context, request_id)
        return reply

    async def _status(self, request: Message | None, grpc_context: RayServegRPCContext,
                      response: type[Message], answer: Callable[[], Awaitable[Message]]) -> Message:
        """`answer()` once the key and the size pass; a refusal or an error becomes the status code and message on
        `grpc_context` and an empty `response`."""
        code, details = self._refusal(request, grpc_context)
        if code is None:
            try:
                return await answer()
            except StreamRefused as refusal:
                code, details = refusal.code, str(refusal)
            except Exception as err:  # every error becomes a status; status_of logs the unexpected ones
                code, details = status_of(err)
                retry = retry_after_s(err)
                if retry is not None:
                    grpc_context.set_trailing_metadata([(RETRY_AFTER_KEY, str(round(retry * 1000)))])
        if code != grpc.StatusCode.INTERNAL:  # the client's to fix: one line, no stack trace
            _log_refusal(code, details)
        grpc_context.set_code(code)
        grpc_context.set_details(details)
        return response()

    def _refusal(self, request: Message | None,
                 grpc_context: RayServegRPCContext) -> tuple[grpc.StatusCode | None, str | None]:
        """UNAUTHENTICATED without a valid key, RESOURCE_EXHAUSTED for a message over max_request_bytes, else
        (None, None). A stream (None) is checked by its key alone, from the metadata, before any message is read."""
        unauthenticated = self.api_keys.refusal(grpc_context.invocation_metadata())
        if unauthenticated is not None:
            return grpc.StatusCode.UNAUTHENTICATED, unauthenticated
        if request is None:
            return None, None
        size, limit = request.ByteSize(), self.args.max_request_bytes
        if size > limit:
            return grpc.StatusCode.RESOURCE_EXHAUSTED, (f"request message is {size} bytes, over the limit of {limit} "
                                                        "bytes (max_request_bytes): split it into smaller requests")
        return None, None

    async def _health(self) -> health_pb2.HealthCheckResponse:
        """SERVING when an engine replica answers `info` within HEALTH_TIMEOUT_S, else NOT_SERVING."""
        try:
            await asyncio.wait_for(self.engine.info.remote(), HEALTH_TIMEOUT_S)
        except Exception as err:  # any failure means not serving; the reason goes to the log
            logger.warning("health check: the engine did not answer info: %r", err)
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def _answer(self, task: Task, request: dict[str, Any], priority: Priority) -> Any:
        """Encode (in a worker thread), split, submit all parts in one engine call with the request's key, merge;
        a refusal (the replica's `QueueFullError`, returned as a value) is raised here."""
        job, parts = await asyncio.to_thread(self._encode, task, request)
        self.submitted_parts += len(parts)
        reply = await self.engine.submit.remote(EngineRequest.of(parts, prefix_key(job), priority))
        if isinstance(reply, QueueFullError):
            raise reply
        result = await asyncio.to_thread(task.merge, job, reply)
        count_usage(result.usage)  # into the metered request this call answers (IngressMetrics)
        return result

    def _encode(self, task: Task, request: dict[str, Any]) -> tuple[TaskJob, list[TaskJob]]:
        job = task.encode(self.context, request)
        return job, task.split(job, self.args.max_request_tokens)

