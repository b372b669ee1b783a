"""Calls whose ingress replica was lost answer UNAVAILABLE, not INTERNAL, on Ray Serve's gRPC proxy.

Ray's gRPC proxy answers INTERNAL when the replica it forwarded a call to dies before answering (a `RayActorError`:
a killed or crashed ingress replica, a lost node, a pod rolled under load). The call never got an answer and is
safe to send again, which is what UNAVAILABLE tells a client (and what the gRPC retry policies of clients and
meshes retry); INTERNAL tells it the server is broken and not to retry.

The ingress answers every call it receives itself, with `x-request-id` in its trailing metadata
(`deployments.request_ids`; `deployments.grpc_api.calls` turns every error into a status, so nothing escapes it as
an exception). So an INTERNAL status without that key was not the ingress's answer but the proxy's own: the call
was lost on its way. `install` is listed first in `grpc_options.grpc_servicer_functions`: the proxy calls it with
its gRPC server before the services register, and it wraps the server's handler factory (the one every service
method's handler comes from) so that such a status becomes UNAVAILABLE.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grpc

from deployments.request_ids import REQUEST_ID_KEY

LOST = ("the replica answering this call was lost before it answered (restarted, rolled or its node failed); "
        "nothing was returned: retry the call")


def install(servicer: Any, server: Any) -> None:
    """Wrap `server.service_handler_factory` (Ray's gRPC proxy server) once; registers no service of its own."""
    factory = server.service_handler_factory
    if getattr(factory, "answers_lost_calls", False):
        return

    def lost_calls_unavailable(service_method: str, streaming_type: Any) -> Callable:
        return _wrapped(factory(service_method=service_method, streaming_type=streaming_type))

    lost_calls_unavailable.answers_lost_calls = True
    server.service_handler_factory = lost_calls_unavailable


def _wrapped(handler: Callable) -> Callable:
    """`handler` (a coroutine function or an async generator function of `(request, context)`) with `answer_lost`
    applied to its context once it has answered."""
    if inspect.isasyncgenfunction(handler):
        async def streamed(request: Any, context: grpc.aio.ServicerContext):
            async for message in handler(request, context):
                yield message
            answer_lost(context)
        return streamed

    async def unary(request: Any, context: grpc.aio.ServicerContext):
        reply = await handler(request, context)
        answer_lost(context)
        return reply
    return unary


def answer_lost(context: grpc.aio.ServicerContext) -> None:
    """UNAVAILABLE for an INTERNAL status the ingress did not set (no `x-request-id` in the trailing metadata)."""
    if _code(context) != grpc.StatusCode.INTERNAL:
        return
    if any(key == REQUEST_ID_KEY for key, _ in context.trailing_metadata() or ()):
        return
    context.set_code(grpc.StatusCode.UNAVAILABLE)
    context.set_details(LOST)


def _code(context: grpc.aio.ServicerContext) -> grpc.StatusCode | None:
    """The status code set on `context`: grpc's aio context returns the enum, or its integer value."""
    code = context.code()
    if isinstance(code, int):
        return next((c for c in grpc.StatusCode if c.value[0] == code), None)
    return code
