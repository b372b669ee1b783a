"""radixserve.v1 (`proto/radixserve/v1/scoring.proto`): one rpc per task (`Task.rpc`), and `Info`. A request
message becomes its task's typed request (`deployments.grpc_codec.from_pb`), takes the one request path
(`Server.answer`), and its result becomes the rpc's response (`to_pb`); errors keep the library's field names,
which are the proto's.
"""

from __future__ import annotations

import asyncio
from functools import partial

from google.protobuf.message import Message
from ray.serve.grpc_util import RayServegRPCContext

from deployments import grpc_codec
from deployments.grpc_api.calls import answer_call, metadata_priority
from deployments.grpc_api.service import GrpcService, Rpc
from deployments.metrics import API_GRPC
from deployments.server import Server
from radix_core.tasks import ALL_TASKS, Task
from radixserve.v1 import scoring_pb2 as pb


class ScoringService(GrpcService):
    name = "radixserve.v1.Scoring"

    def rpcs(self) -> list[Rpc]:
        tasks = [Rpc(task.rpc, grpc_codec.request_type(task), partial(answer_task, task)) for task in ALL_TASKS]
        return [*tasks, Rpc("Info", pb.InfoRequest, answer_info)]


async def answer_task(task: Task, server: Server, request: Message, grpc_context: RayServegRPCContext) -> Message:
    """One task call: the request message as the task's request, the result as its response."""
    async def answer() -> Message:
        priority = metadata_priority(grpc_context, grpc_codec.priority_of(request))
        result = await server.answer(grpc_codec.from_pb(request), priority)
        return await asyncio.to_thread(grpc_codec.to_pb, task, result)
    return await answer_call(server, request, grpc_context, grpc_codec.response_type(task), answer, task.name,
                             API_GRPC)


async def answer_info(server: Server, request: pb.InfoRequest, grpc_context: RayServegRPCContext) -> Message:
    """`Server.info()` as an `InfoResponse`."""
    async def answer() -> Message:
        return grpc_codec.info_to_pb(await server.info())
    return await answer_call(server, request, grpc_context, pb.InfoResponse, answer, "info", API_GRPC)
