"""`SERVICES`: every gRPC API the application serves, the one place the ingress's gRPC methods come from
(`with_rpcs`). Adding a service is one module defining a `GrpcService` and one entry here (and its servicer
function in `serve_config.yaml`'s `grpc_servicer_functions`).

Ray's gRPC proxy calls the ingress method named after the rpc, whichever service it belongs to: a name must have a
method (one a registered servicer declares but the ingress lacks answers INTERNAL with Ray's stack trace), and the
rpcs of several services that share a name (`/tei.v1.Rerank/Rerank` and `/radixserve.v1.Scoring/Rerank`; `Embed`,
`Predict`, `Info`) reach the same method. Those must be unary; the method answers each by its request message's
type, a lookup in the table of their rpcs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ray.serve.grpc_util import RayServegRPCContext

from deployments.grpc_api.health import HealthService
from deployments.grpc_api.scoring import ScoringService
from deployments.grpc_api.service import BIDIRECTIONAL, UNARY, GrpcService, Rpc
from deployments.grpc_api.tei import TeiService

SERVICES: tuple[GrpcService, ...] = (ScoringService(), TeiService(), HealthService())


def with_rpcs(cls: type) -> type:
    """`cls` with one method per rpc name of `SERVICES`."""
    by_name: dict[str, list[Rpc]] = {}
    for service in SERVICES:
        for rpc in service.rpcs():
            by_name.setdefault(rpc.name, []).append(rpc)
    for name, rpcs in by_name.items():
        setattr(cls, name, _method(name, rpcs))
    return cls


def _method(name: str, rpcs: Sequence[Rpc]):
    """The ingress method of the rpcs called `name`: one rpc's handler, or a lookup by message type."""
    if len(rpcs) > 1:
        if any(rpc.shape != UNARY for rpc in rpcs):
            raise TypeError(f"rpcs {name} of several services must all be unary: Ray's proxy routes by name alone")
        by_type = {rpc.request_type: rpc.handler for rpc in rpcs}

        async def method(self, request: Any, grpc_context: RayServegRPCContext) -> Any:
            return await by_type[type(request)](self, request, grpc_context)
    elif rpcs[0].shape == BIDIRECTIONAL:
        handler = rpcs[0].handler

        async def method(self, requests: Any, grpc_context: RayServegRPCContext) -> Any:
            async for reply in handler(self, requests, grpc_context):
                yield reply
    else:
        handler = rpcs[0].handler

        async def method(self, request: Any, grpc_context: RayServegRPCContext) -> Any:
            return await handler(self, request, grpc_context)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"gRPC {name} ({', '.join(rpc.request_type.DESCRIPTOR.full_name for rpc in rpcs)})."
    return method
