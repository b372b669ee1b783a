"""What every gRPC call shares, whatever its service: the API key and message size checked first, the answer, an
error turned into a status code, metering and the request id.

    reply = await answer_call(server, request, grpc_context, pb.RerankResponse, answer, "rerank", API_GRPC)

Ray Serve's gRPC proxy invokes the ingress method named after the rpc with the request message (or a stream of
them) and a `RayServegRPCContext`. An error is answered by setting the status code (`deployments.grpc_status`) and
message on the context and returning an empty response: Ray sends that code and message, never a stack trace.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import nullcontext

import grpc
from google.protobuf.message import Message
from ray.serve.grpc_util import RayServegRPCContext

from deployments import request_ids
from deployments.engine_request import PRIORITY_HEADER, Priority
from deployments.grpc_status import retry_after_s, status_of
from deployments.server import Server
from radixserve.client import RETRY_AFTER_KEY

logger = logging.getLogger("ray.serve")


class StreamRefused(Exception):
    """A stream refused while it is read, with a status other than a bad request's: more bytes than one call may
    have (RESOURCE_EXHAUSTED), input that did not come within client_input_timeout_s (DEADLINE_EXCEEDED)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code


def metadata_priority(grpc_context: RayServegRPCContext, field: str | None = None) -> Priority:
    """The call's class: a request's own `priority` field when set, else the `x-radixserve-priority` metadata;
    a RequestError for neither interactive nor batch."""
    return Priority.parse(field or dict(grpc_context.invocation_metadata()).get(PRIORITY_HEADER))


async def answer_call(server: Server, request: Message | None, grpc_context: RayServegRPCContext,
                      response: type[Message], answer: Callable[[], Awaitable[Message]], task: str,
                      api: str) -> Message:
    """`answer()` once the key and the size pass (a stream, `request` None, by its key alone), metered
    (`IngressMetrics`: `task`, `api` and the status code) and answered with the call's request id (`request_ids`:
    the client's `x-request-id`, or Ray's), which every log line about the call carries."""
    request_id = request_ids.adopt(grpc_context)
    with server.metrics.request(task, api, request_id) as meter:
        reply = await _status(server, request, grpc_context, response, answer)
        meter.code = (grpc_context.code() or grpc.StatusCode.OK).name
    request_ids.reply(grpc_context, request_id)
    return reply


async def _status(server: Server, request: Message | None, grpc_context: RayServegRPCContext,
                  response: type[Message], answer: Callable[[], Awaitable[Message]]) -> Message:
    """`answer()` once the key and the size pass, as one of the gRPC calls in flight (`Server.grpc_in_flight`; a
    stream, `request` None, is counted by its `answer` once its messages are in); a refusal or an error becomes the
    status code and message on `grpc_context` and an empty `response`."""
    code, details = refusal(server, request, grpc_context)
    if code is None:
        try:
            with server.grpc_in_flight.admitted() if request is not None else nullcontext():
                return await answer()
        except StreamRefused as refused:
            code, details = refused.code, str(refused)
        except Exception as err:  # every error becomes a status; status_of logs the unexpected ones
            code, details = status_of(err)
            retry = retry_after_s(err)
            if retry is not None:
                grpc_context.set_trailing_metadata([(RETRY_AFTER_KEY, str(round(retry * 1000)))])
    if code != grpc.StatusCode.INTERNAL:  # the client's to fix: one line, no stack trace
        log_refusal(code, details)
    grpc_context.set_code(code)
    grpc_context.set_details(details)
    return response()


def refusal(server: Server, request: Message | None,
            grpc_context: RayServegRPCContext) -> tuple[grpc.StatusCode | None, str | None]:
    """UNAUTHENTICATED without a valid key, RESOURCE_EXHAUSTED for a message over max_request_bytes, else
    (None, None). A stream (None) is checked by its key alone, from the metadata, before any message is read."""
    unauthenticated = server.api_keys.refusal(grpc_context.invocation_metadata())
    if unauthenticated is not None:
        return grpc.StatusCode.UNAUTHENTICATED, unauthenticated
    if request is None:
        return None, None
    size, limit = request.ByteSize(), server.args.limits.max_request_bytes
    if size > limit:
        return grpc.StatusCode.RESOURCE_EXHAUSTED, (f"request message is {size} bytes, over the limit of {limit} "
                                                    "bytes (max_request_bytes): split it into smaller requests")
    return None, None


def log_refusal(code: grpc.StatusCode, details: str) -> None:
    """One WARNING line for a call refused for a reason the client can fix (no stack trace)."""
    logger.warning("request %s refused: %s: %s", request_ids.current(), code.name, details)
