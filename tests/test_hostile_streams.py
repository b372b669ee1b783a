"""Streams and bodies that arrive slowly, never, or larger than a call may be, against the ingress alone (no Ray
cluster): the ingress replica's tei.v1 stream methods driven with a fake message stream, and the HTTP application
driven as an ASGI app with a `receive` that never delivers. A peer without a key is refused before any of its input
is read; input that does not come in time ends the call; a client stream over the item limit is refused whole, never
answered in part; and no task of a bidirectional stream outlives it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import grpc
import numpy as np
import pytest
from ray.serve.grpc_util import RayServegRPCContext

import deployments.http.app as http_app
from deployments.auth import ApiKeys
from deployments.config import AppArgs
from deployments.grpc_api.streams import STREAM_WINDOW, StreamEnded
from deployments.in_flight import InFlight, InFlightFull
from deployments.ingress import Ingress
from deployments.metrics import IngressMetrics
from deployments.model_card import ModelCard
from radix_core.tasks import EmbedRequest, EmbedResult, RerankRequest, RerankResult, Usage
from radixserve.tei.v1 import tei_pb2 as tei

KEY = "stream-key"
MAX_ITEMS = 16
MAX_REQUEST_BYTES = 4096
SHORT_TIMEOUT_S = 0.2  # client_input_timeout_s in these tests, in place of the server's 30 s


class ServicerContext:
    """What `RayServegRPCContext` copies from grpc's servicer context: the call's metadata."""

    def __init__(self, metadata: list[tuple[str, str]]):
        self.metadata = metadata

    def invocation_metadata(self):
        return self.metadata

    def auth_context(self):
        return {}

    def code(self):
        return None

    def details(self):
        return None

    def peer(self):
        return "ipv4:127.0.0.1:5555"

    def peer_identities(self):
        return None

    def peer_identity_key(self):
        return None

    def trailing_metadata(self):
        return []


def grpc_context(key: str | None = KEY) -> RayServegRPCContext:
    return RayServegRPCContext(ServicerContext([] if key is None else [("authorization", f"Bearer {key}")]))


class Counted:
    """A count others can wait for (`until(n)`), instead of sleeping until it is likely reached."""

    def __init__(self):
        self.count, self.waiting = 0, {}

    def reached(self, count: int) -> None:
        self.count = count
        for n in [n for n in self.waiting if n <= count]:
            self.waiting.pop(n).set()

    async def until(self, count: int) -> None:
        if self.count < count:
            await self.waiting.setdefault(count, asyncio.Event()).wait()


class Stream:
    """A client's message stream as Ray's proxy hands it to the replica: `messages`, then the end, or (`idle`)
    nothing more, ever. `read` counts the messages the server took."""

    def __init__(self, messages: list, idle: bool = False):
        self.messages, self.idle, self.read = messages, idle, 0
        self.reads = Counted()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.read < len(self.messages):
            self.read += 1
            self.reads.reached(self.read)
            return self.messages[self.read - 1]
        if self.idle:
            await asyncio.Event().wait()
        raise StopAsyncIteration


EMPTY = {RerankRequest: RerankResult([], Usage(0, 0)), EmbedRequest: EmbedResult(np.zeros((1, 1)), Usage(0, 0))}


class Answers:
    """Stands in for `Ingress.answer` (the one request path): records each task request, and answers at once with
    an empty result, or (`block`) never."""

    def __init__(self, block: bool = False):
        self.block, self.calls, self.cancelled = block, [], 0
        self.called = Counted()

    async def __call__(self, request, priority):
        self.calls.append(request)
        self.called.reached(len(self.calls))
        if self.block:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return EMPTY[type(request)]


class Replica(Ingress.func_or_class):
    """The ingress replica's class, made without its constructor (no model, no engine)."""

    def __del__(self):
        """Ray's ASGI wrapper shuts its HTTP application down here; this replica never built one."""


def replica(answers: Answers, **settings) -> Ingress:
    """An ingress replica without its model (the task calls are `answers`), keyed with KEY, with the request
    limits `settings`."""
    ingress = object.__new__(Replica)
    ingress.args = AppArgs(model="no-model", tasks={"max_items": MAX_ITEMS},
                           limits={"max_request_bytes": MAX_REQUEST_BYTES, **settings})
    ingress.api_keys = ApiKeys([KEY])
    ingress.metrics = IngressMetrics()
    ingress.grpc_in_flight = InFlight("gRPC", ingress.args.limits.max_in_flight_requests)
    ingress.answer = answers
    return ingress


def run(work, timeout_s: float = 10):
    """`work` on a new event loop, bounded: a call that waits for input it was never going to get fails here."""
    async def bounded():
        return await asyncio.wait_for(work, timeout_s)
    return asyncio.run(bounded())


def pairs(queries: list[str], count: int) -> list[tei.RerankStreamRequest]:
    """`count` RerankStream messages, their queries taken in turn from `queries`."""
    return [tei.RerankStreamRequest(query=queries[i % len(queries)], text=f"text {i}") for i in range(count)]


async def bidirectional(ingress: Ingress, stream: Stream, context: RayServegRPCContext) -> list:
    """The replies of an EmbedStream call, until it ends (returns) or is ended (StreamEnded propagates)."""
    return [reply async for reply in ingress.EmbedStream(stream, context)]


@pytest.mark.parametrize("method", ["RerankStream", "EmbedStream"])
def test_a_stream_without_a_key_is_refused_before_a_message_is_read(method):
    answers = Answers()
    ingress, context = replica(answers), grpc_context(key=None)
    message = tei.RerankStreamRequest(query="q", text="t") if method == "RerankStream" else tei.EmbedRequest(inputs="t")
    stream = Stream([message] * 3, idle=True)  # a client that then sends nothing
    if method == "RerankStream":
        run(ingress.RerankStream(stream, context))
    else:
        with pytest.raises(StreamEnded):
            run(bidirectional(ingress, stream, context))
    assert context.code() == grpc.StatusCode.UNAUTHENTICATED and "missing API key" in context.details()
    assert stream.read == 0 and answers.calls == []


@pytest.mark.parametrize("queries, count", [(["q1", "q2"], 116), (["q1", "q2", "q3"], 2048), (["q"], 1100),
                                            (["q1", "q2"], MAX_ITEMS + 1)])
def test_a_client_stream_over_the_item_limit_is_refused_whole(queries, count):
    """However its messages split by query, a stream over tasks.max_items answers no message at all (each
    query's messages were within the task's limit, and the rest of the stream was dropped)."""
    answers = Answers()
    ingress, context = replica(answers), grpc_context()
    stream = Stream(pairs(queries, count))
    run(ingress.RerankStream(stream, context))
    assert context.code() == grpc.StatusCode.INVALID_ARGUMENT, context.details()
    assert context.details() == (f"the stream has more than {MAX_ITEMS} messages, the limit of one call "
                                 f"(tasks.max_items): send at most {MAX_ITEMS} messages per stream")
    assert answers.calls == [] and stream.read == MAX_ITEMS + 1  # read no further than the refusal needs


def test_a_client_stream_within_the_limits_is_answered_whole():
    answers = Answers()
    ingress, context = replica(answers), grpc_context()
    messages = pairs(["q1", "q2", "q3"], MAX_ITEMS)
    run(ingress.RerankStream(Stream(messages), context))
    assert context.code() in (None, grpc.StatusCode.OK), context.details()
    assert [(r.query, list(r.documents)) for r in answers.calls] == [  # one rerank per query, all at once
        (query, [m.text for m in messages if m.query == query]) for query in ("q1", "q2", "q3")]


def test_a_client_stream_over_the_byte_limit_is_refused():
    answers = Answers()
    ingress, context = replica(answers), grpc_context()
    big = [tei.RerankStreamRequest(query="q", text="x" * (MAX_REQUEST_BYTES // 3)) for _ in range(4)]
    run(ingress.RerankStream(Stream(big), context))
    assert context.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"over {MAX_REQUEST_BYTES} bytes together" in context.details() and "(max_request_bytes)" in \
        context.details()
    assert answers.calls == []


def test_a_client_stream_that_does_not_end_in_time_is_dropped():
    answers = Answers()
    ingress, context = replica(answers, client_input_timeout_s=SHORT_TIMEOUT_S), grpc_context()
    run(ingress.RerankStream(Stream(pairs(["q"], 3), idle=True), context))
    assert context.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert context.details() == (f"the stream did not end within {SHORT_TIMEOUT_S:g} s, the most the server waits "
                                 "for one (3 messages came): send its messages without pauses and close it")
    assert answers.calls == []


def test_a_bidirectional_stream_that_goes_idle_is_ended_after_its_answers():
    answers = Answers()
    ingress, context = replica(answers, client_input_timeout_s=SHORT_TIMEOUT_S), grpc_context()
    replies = []

    async def consume():
        async for reply in ingress.EmbedStream(Stream([tei.EmbedRequest(inputs="a"), tei.EmbedRequest(inputs="b")],
                                                      idle=True), context):
            replies.append(reply)

    with pytest.raises(StreamEnded):
        run(consume())
    assert len(replies) == 2 and context.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert context.details().startswith(f"no message came on the stream for {SHORT_TIMEOUT_S:g} s")


def test_no_task_outlives_a_cancelled_bidirectional_stream():
    """Cancelled while its window of answers is full and its reader waits for room: every answer is cancelled and
    finished, and the reader too, by the time the cancellation has gone through the method."""
    answers = Answers(block=True)
    ingress, context = replica(answers), grpc_context()
    stream = Stream([tei.EmbedRequest(inputs=f"text {i}") for i in range(3 * STREAM_WINDOW)])

    async def main():
        before = asyncio.all_tasks()
        call = asyncio.create_task(bidirectional(ingress, stream, context))
        await answers.called.until(STREAM_WINDOW)  # the window is full of answers that never finish
        await stream.reads.until(STREAM_WINDOW + 1)  # the reader has the next message, and no room for it
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return [task for task in asyncio.all_tasks() - before if not task.done()]

    left = run(main())
    assert left == []
    assert len(answers.calls) == STREAM_WINDOW == answers.cancelled


# The HTTP face: the application as Ray's proxy drives it, one ASGI call per request.

class Scorer:
    """What `build_app` and the refusals tested here use of the ingress: limits, keys, metrics, the model card (its
    primary task picks TEI's default route)."""

    def __init__(self, **settings):
        self.args = AppArgs(model="no-model", tasks={"max_items": MAX_ITEMS},
                            limits={"max_request_bytes": MAX_REQUEST_BYTES, **settings})
        self.api_keys = ApiKeys([KEY])
        self.metrics = IngressMetrics()
        self.card = ModelCard("no-model", "no-model", "rerank", ())


def never_receive(reads: list) -> Callable:
    """An ASGI `receive` for a client that sent its headers and then nothing; `reads` counts the calls."""
    async def receive():
        reads.append(1)
        await asyncio.Event().wait()
    return receive


async def asgi_post(app, path: str, headers: dict[str, str], receive: Callable) -> tuple[int, dict]:
    """(status, JSON body) of a POST to `path` with `headers`, declaring a 2,000-byte JSON body that `receive`
    delivers, or not."""
    raw = [(name.lower().encode(), value.encode()) for name, value in
           {"content-type": "application/json", "content-length": "2000", **headers}.items()]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": raw,
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5555)}
    sent = []

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(message for message in sent if message["type"] == "http.response.start")
    body = b"".join(message.get("body", b"") for message in sent if message["type"] == "http.response.body")
    return start["status"], json.loads(body)


ERROR_MESSAGES = {"/v2/rerank": lambda body: body["message"], "/v1/embeddings": lambda body: body["error"]["message"],
                  "/rerank": lambda body: body["error"], "/embed": lambda body: body["error"]}


@pytest.mark.parametrize("path", ERROR_MESSAGES)
def test_http_without_a_key_is_refused_from_the_headers_in_the_routes_dialect(path):
    app, reads = http_app.build_app(Scorer()), []
    status, body = run(asgi_post(app, path, {}, never_receive(reads)))
    assert status == 401 and reads == []  # not a byte of the body was waited for
    assert ERROR_MESSAGES[path](body).startswith("missing API key: send the header 'authorization: Bearer <key>'")
    status, body = run(asgi_post(app, path, {"authorization": "Bearer wrong"}, never_receive(reads)))
    assert (status, ERROR_MESSAGES[path](body), reads) == (401, "invalid API key", [])


@pytest.mark.parametrize("path", ERROR_MESSAGES)
def test_http_body_that_does_not_arrive_in_time_is_dropped_with_408(path):
    app = http_app.build_app(Scorer(client_input_timeout_s=SHORT_TIMEOUT_S))
    status, body = run(asgi_post(app, path, {"authorization": f"Bearer {KEY}"}, never_receive([])))
    assert status == 408
    assert ERROR_MESSAGES[path](body) == (f"the request body did not all arrive within {SHORT_TIMEOUT_S:g} s, the "
                                          "most the server waits for one: send the body right after the headers")


# What each transport admits: a complete request, counted against its own transport's bound.

def test_in_flight_counts_while_admitted_and_refuses_over_its_limit():
    in_flight = InFlight("gRPC", 2)
    with in_flight.admitted(), in_flight.admitted():
        assert in_flight.count == 2
        with pytest.raises(InFlightFull) as refused, in_flight.admitted():
            pass
        assert in_flight.count == 2
    assert in_flight.count == 0
    assert refused.value.retry_after_s > 0 and str(refused.value).startswith(
        "this server is answering 2 gRPC requests, the most it takes at once (limits.max_in_flight_requests)")


def deliver(body: bytes) -> Callable:
    """An ASGI `receive` for a client that sent its whole body, and then waits for the answer."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.Event().wait()
    return receive


def test_each_transport_counts_its_requests_once_their_input_is_in():
    """limits.max_in_flight_requests 1: an HTTP body and a gRPC client stream still arriving hold no place; a
    complete call on each transport is admitted beside them; one more complete call on either is refused at once
    with a retry hint (while the first two are still being answered)."""
    answers = Answers(block=True)
    ingress = replica(answers, max_in_flight_requests=1)
    ingress.card = ModelCard("no-model", "no-model", "rerank", ())
    app = http_app.build_app(ingress)
    body = json.dumps({"query": "q", "texts": ["a"]}).encode()
    auth, complete = {"authorization": f"Bearer {KEY}"}, {"authorization": f"Bearer {KEY}",
                                                          "content-length": str(len(body))}
    rerank = tei.RerankRequest(query="q", texts=["a"])

    async def main():
        waiting = [asyncio.create_task(asgi_post(app, "/rerank", auth, never_receive([]))),
                   asyncio.create_task(ingress.RerankStream(Stream([], idle=True), grpc_context())),
                   asyncio.create_task(asgi_post(app, "/rerank", complete, deliver(body))),
                   asyncio.create_task(ingress.Rerank(rerank, grpc_context()))]
        await answers.called.until(2)  # both complete calls are being answered
        refused_http = await asgi_post(app, "/rerank", complete, deliver(body))
        context = grpc_context()
        await ingress.Rerank(rerank, context)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return refused_http, context

    (status, error), context = run(main())
    assert status == 429 and "(limits.max_in_flight_requests)" in error["error"]
    assert context.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert context.details().startswith("this server is answering 1 gRPC requests")
    assert ("retry-after-ms", "1000") in context.trailing_metadata()
    assert len(answers.calls) == 2
