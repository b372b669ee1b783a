"""Request ids on gRPC: one id per client request, from the client or made by Ray, in every log line about it.

Ray Serve's HTTP proxy already takes `x-request-id` from the request (or makes one), answers with it, and puts
it in the request context that Ray's log records read. Its gRPC proxy reads only the `request_id` metadata and
answers `request_id` in the trailing metadata. `adopt` makes a gRPC call that sent `x-request-id` (what HTTP
gateways and meshes such as Envoy set) carry that id the same way: it becomes the request context's id for the
rest of the call, so Ray adds it to every log record the ingress writes about the call (`request_id` in its log
format) and carries it with each engine call (where the batcher names it in its batch's log lines). `reply`
returns the id as `x-request-id` in the trailing metadata.
"""

from __future__ import annotations

import dataclasses
import re

from ray import serve
from ray.serve.grpc_util import RayServegRPCContext

REQUEST_ID_KEY = "x-request-id"
VALID_ID = re.compile(r"[!-~]{1,128}")  # printable ASCII without spaces, so it cannot forge a log line


def current() -> str:
    """The request id of the call this code runs for ("" outside a request)."""
    return serve.context._get_serve_request_context().request_id


def adopt(grpc_context: RayServegRPCContext) -> str:
    """The call's id: the client's `x-request-id` when it sent a valid one (1 to 128 printable ASCII characters,
    no spaces; else it is ignored), made the request context's id; otherwise the id Ray gave the call."""
    sent = dict(grpc_context.invocation_metadata()).get(REQUEST_ID_KEY)
    context = serve.context._get_serve_request_context()
    if sent is None or not VALID_ID.fullmatch(sent) or sent == context.request_id:
        return context.request_id
    # Private Ray API (Ray is pinned exactly in pyproject): the context var the proxy sets for each request.
    serve.context._serve_request_context.set(dataclasses.replace(context, request_id=sent))
    return sent


def reply(grpc_context: RayServegRPCContext, request_id: str) -> None:
    """Add `x-request-id` to the trailing metadata set so far (Ray keeps its own `request_id` entry apart)."""
    kept = [(key, value) for key, value in grpc_context.trailing_metadata()
            if key not in ("request_id", REQUEST_ID_KEY)]
    grpc_context.set_trailing_metadata(kept + [(REQUEST_ID_KEY, request_id)])
