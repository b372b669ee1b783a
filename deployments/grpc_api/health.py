"""grpc.health.v1 (`Check`, `List`, `Watch`): SERVING while an engine replica answers. Needs no API key: load
balancers and probes call it. Every method of the service is defined, as Ray answers one it lacks with INTERNAL
and its stack trace.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2
from ray.serve.grpc_util import RayServegRPCContext

from deployments.grpc_api.service import GrpcService, Rpc
from deployments.server import Server

logger = logging.getLogger("ray.serve")

HEALTH_TIMEOUT_S = 5.0  # Check answers NOT_SERVING when no engine replica answers within this
HEALTH_SERVICES = ("", "radixserve.v1.Scoring")  # the server as a whole, and the one service it offers


class HealthService(GrpcService):
    name = "grpc.health.v1.Health"

    def rpcs(self) -> list[Rpc]:
        return [Rpc("Check", health_pb2.HealthCheckRequest, check), Rpc("List", health_pb2.HealthListRequest, list_),
                Rpc("Watch", health_pb2.HealthCheckRequest, watch)]


async def check(server: Server, request: health_pb2.HealthCheckRequest,
                grpc_context: RayServegRPCContext) -> health_pb2.HealthCheckResponse:
    """SERVING when an engine replica answers, else NOT_SERVING; NOT_FOUND for a service this server does not
    offer."""
    if request.service not in HEALTH_SERVICES:
        grpc_context.set_code(grpc.StatusCode.NOT_FOUND)
        grpc_context.set_details(f"unknown service {request.service!r}: ask for one of {list(HEALTH_SERVICES)}")
        return health_pb2.HealthCheckResponse()
    return await _health(server)


async def list_(server: Server, request: health_pb2.HealthListRequest,
                grpc_context: RayServegRPCContext) -> health_pb2.HealthListResponse:
    """The status of each service Check knows (all the same: they share the engine)."""
    health = await _health(server)
    return health_pb2.HealthListResponse(statuses={service: health for service in HEALTH_SERVICES})


async def watch(server: Server, request: health_pb2.HealthCheckRequest, grpc_context: RayServegRPCContext):
    """Streaming health is not offered, as each watcher would hold an ingress request slot for as long as it
    watches. UNIMPLEMENTED is the protocol's answer for that (gRPC's client-side health checking then relies on
    the connection); Ray sends the code set here when the method raises."""
    grpc_context.set_code(grpc.StatusCode.UNIMPLEMENTED)
    grpc_context.set_details("grpc.health.v1.Health/Watch is not offered: poll Health/Check")
    raise NotImplementedError("grpc.health.v1.Health/Watch is not offered")


async def _health(server: Server) -> health_pb2.HealthCheckResponse:
    """SERVING when `info` (the engine's with it) answers within HEALTH_TIMEOUT_S, else NOT_SERVING."""
    try:
        await asyncio.wait_for(server.info(), HEALTH_TIMEOUT_S)
    except Exception as err:  # any failure means not serving; the reason goes to the log
        logger.warning("health check: the engine did not answer info: %r", err)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
    return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
