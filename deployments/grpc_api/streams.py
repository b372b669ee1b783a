"""Streams of request messages, read within the server's bounds: a client stream read whole (`read_whole`), a
bidirectional stream answered message by message (`answer_each`).

Ray's gRPC proxy gives a stream one of the replica's `placement.ingress.max_ongoing_requests` slots from its start,
before any message arrives. So a stream's key is checked from its metadata before a message is read, and its input is
bounded in time (`limits.client_input_timeout_s`): peers without a key, or idle ones, cannot hold the slots of other
calls.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NoReturn

import grpc
from google.protobuf.message import Message
from ray.serve.grpc_util import RayServegRPCContext

from deployments.grpc_api.calls import StreamRefused, log_refusal
from radix_core.errors import RequestError

STREAM_WINDOW = 64  # messages of one bidirectional stream answered at once (the engine batches them)


class StreamEnded(Exception):
    """Ends a bidirectional stream at a message's refusal or error; its status is already on the context."""


async def read_whole(requests: AsyncIterator[Message], max_items: int, max_bytes: int,
                     timeout_s: float) -> list[Message]:
    """All of a client stream's messages, or a refusal before anything is computed, so no message is ever dropped:
    a RequestError at message `max_items` + 1 (the rest is not read: each message is a round trip to the proxy, and
    empty ones cost no bytes), StreamRefused with RESOURCE_EXHAUSTED once they pass `max_bytes` together, or with
    DEADLINE_EXCEEDED when the stream has not ended within `timeout_s` of its start."""
    messages: list[Message] = []

    async def read() -> None:
        size = 0
        async for message in requests:
            if len(messages) == max_items:
                raise RequestError(f"the stream has more than {max_items} messages, the limit of one call "
                                   "(tasks.max_items)", f"send at most {max_items} messages per stream",
                                   field="messages", limit=max_items)
            size += message.ByteSize()
            if size > max_bytes:
                raise StreamRefused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"the stream's messages are over {max_bytes} bytes together, the limit of one "
                                    "call (max_request_bytes): split them into smaller streams")
            messages.append(message)

    try:
        await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise StreamRefused(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"the stream did not end within {timeout_s:g} s, the most the server waits for one "
                            f"({len(messages)} messages came): send its messages without pauses and close it"
                            ) from None
    return messages


async def answer_each(requests: AsyncIterator[Message], grpc_context: RayServegRPCContext, timeout_s: float,
                      answer: Callable[[Message, RayServegRPCContext], Awaitable[Message]]) -> AsyncIterator[Message]:
    """A bidirectional stream: each message answered by `answer(message, its own context)` as its unary call would
    be (key, size, status), up to STREAM_WINDOW at once, replies in message order. The first refusal or error, or a
    next message that does not come within `timeout_s`, ends the stream with its status (`StreamEnded`). However
    the stream ends, its reader and answers are finished (cancelled if still running) before this returns: no task
    outlives it. (The caller checks the stream's key before calling this.)"""
    window = asyncio.Semaphore(STREAM_WINDOW)
    answers: asyncio.Queue[tuple[RayServegRPCContext, asyncio.Task] | None] = asyncio.Queue()
    running: set[asyncio.Task] = set()  # answers not finished yet

    async def read() -> None:
        try:
            async for message in each_within(requests, timeout_s):
                await window.acquire()
                context = copy.copy(grpc_context)  # each message's own status
                reply = asyncio.create_task(answer(message, context))
                running.add(reply)
                reply.add_done_callback(running.discard)
                answers.put_nowait((context, reply))
        finally:
            answers.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while (item := await answers.get()) is not None:
            context, reply = item
            message = await reply
            window.release()
            if context.code() not in (None, grpc.StatusCode.OK):
                end_stream(grpc_context, context.code(), context.details())
            yield message
        await reader  # the stream's own error, if reading it failed
    except StreamRefused as refused:
        log_refusal(refused.code, str(refused))
        end_stream(grpc_context, refused.code, str(refused))
    finally:
        left = [reader, *running]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)


async def each_within(messages: AsyncIterator[Message], timeout_s: float) -> AsyncIterator[Message]:
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


def end_stream(grpc_context: RayServegRPCContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """End a bidirectional stream with `code` (Ray sends the code set on the context when the method raises)."""
    grpc_context.set_code(code)
    grpc_context.set_details(details)
    raise StreamEnded(details)
