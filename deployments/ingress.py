"""`Ingress`: the CPU front door. Validates a request, derives its prefix key, splits it into token-bounded
sub-requests that keep that key, sends them to the engine deployment and merges the answers.

Two faces: library-shaped methods (`rerank(request_dict)`, ...) for DeploymentHandle callers, and methods named
after the gRPC calls (`Rerank`, ..., `Info`; `Check`, `List`, `Watch` of grpc.health.v1) that Ray Serve's gRPC
proxy invokes with the request message and a `RayServegRPCContext`. Those check the API key and the message size,
convert with `grpc_codec`, call the library-shaped method, and answer an error by setting the status code
(`grpc_status`) on the context and returning an empty response: Ray sends that code and message, never a stack
trace. (A method missing here that a registered servicer declares would answer INTERNAL with Ray's stack trace,
so every method of grpc.health.v1.Health is defined.)

The prefix key is a hash of (model, task, the text every sequence of the request starts with): the template's
system prompt, instruction and query for rerank, the instruction for embed, the few-shot prefix for classify,
the context for score. `PrefixAffinityRouter` sends one key to one engine replica, where the batcher puts the
sub-requests of one prefix into one batch, so the prefix is computed once there.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from ray import serve
from ray.serve.grpc_util import RayServegRPCContext
from ray.serve.handle import DeploymentHandle

from deployments import grpc_codec
from deployments.auth import load_api_keys
from deployments.grpc_status import status_of
from radix_core.tasks import TASKS, TaskConfig, load_task_context, merge_results, routing_prefix, split_request
from radixserve import __version__
from radixserve.v1 import scoring_pb2 as pb

logger = logging.getLogger("ray.serve")

HEALTH_TIMEOUT_S = 5.0  # Check answers NOT_SERVING when no engine replica answers within this
HEALTH_SERVICES = ("", "radixserve.v1.Scoring")  # the server as a whole, and the one service it offers


@dataclass(frozen=True)
class IngressSettings:
    model: str
    max_items: int  # items (documents, texts, inputs, continuations) per request
    max_tokens_per_item: int | None
    max_request_tokens: int  # larger requests become several sub-requests with the same prefix key
    max_request_bytes: int  # larger gRPC request messages are refused with RESOURCE_EXHAUSTED
    api_keys_file: str | None  # where the gRPC API keys live (auth.load_api_keys); neither set: auth off
    api_keys_env: str | None


def prefix_key(model: str, task: str, shared_prefix: str) -> str:
    """Stable across processes and restarts (unlike Python's `hash`)."""
    return hashlib.blake2b(f"{model}\0{task}\0{shared_prefix}".encode(), digest_size=16).hexdigest()


@serve.deployment
class Ingress:
    """Library-shaped calls (`rerank(request)` with the `Engine.rerank` keyword arguments as a dict, ...), and the
    gRPC calls of `radixserve.v1.Scoring` and `grpc.health.v1.Health`."""

    def __init__(self, engine: DeploymentHandle, settings: IngressSettings):
        self.engine = engine
        self.settings = settings
        self.api_keys = load_api_keys(settings.api_keys_file, settings.api_keys_env)
        self.context = load_task_context(settings.model, TaskConfig(max_items=settings.max_items,
                                                                    max_tokens=settings.max_tokens_per_item))

    async def rerank(self, request: dict[str, Any]):
        return await self._call("rerank", request)

    async def embed(self, request: dict[str, Any]):
        return await self._call("embed", request)

    async def classify(self, request: dict[str, Any]):
        return await self._call("classify", request)

    async def score(self, request: dict[str, Any]):
        return await self._call("score", request)

    async def info(self) -> dict[str, Any]:
        engine = await self.engine.info.remote()
        return {**engine, "version": __version__, "tasks": list(TASKS), "max_items": self.settings.max_items,
                "max_tokens_per_item": self.context.token_limit,
                "max_request_tokens": self.settings.max_request_tokens,
                "max_request_bytes": self.settings.max_request_bytes}

    async def Rerank(self, request: pb.RerankRequest, grpc_context: RayServegRPCContext) -> pb.RerankResponse:
        return await self._task_rpc("rerank", request, grpc_context)

    async def Embed(self, request: pb.EmbedRequest, grpc_context: RayServegRPCContext) -> pb.EmbedResponse:
        return await self._task_rpc("embed", request, grpc_context)

    async def Classify(self, request: pb.ClassifyRequest, grpc_context: RayServegRPCContext) -> pb.ClassifyResponse:
        return await self._task_rpc("classify", request, grpc_context)

    async def Score(self, request: pb.ScoreRequest, grpc_context: RayServegRPCContext) -> pb.ScoreResponse:
        return await self._task_rpc("score", request, grpc_context)

    async def Info(self, request: pb.InfoRequest, grpc_context: RayServegRPCContext) -> pb.InfoResponse:
        async def answer() -> pb.InfoResponse:
            return grpc_codec.info_to_pb(await self.info())
        return await self._rpc(request, grpc_context, pb.InfoResponse, answer)

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

    async def _task_rpc(self, task: str, request: Message, grpc_context: RayServegRPCContext) -> Message:
        """One Scoring task call: the request message as the library's arguments, the result as its response."""
        async def answer() -> Message:
            return grpc_codec.to_pb(task, await self._call(task, grpc_codec.from_pb(request)))
        return await self._rpc(request, grpc_context, grpc_codec.RESPONSES[task], answer)

    async def _rpc(self, request: Message, grpc_context: RayServegRPCContext, response: type[Message],
                   answer: Callable[[], Awaitable[Message]]) -> Message:
        """`answer()` once the key and the size pass; a refusal or an error becomes the status code and message on
        `grpc_context` and an empty `response`."""
        code, details = self._refusal(request, grpc_context)
        if code is None:
            try:
                return await answer()
            except Exception as err:  # every error becomes a status; status_of logs the unexpected ones
                code, details = status_of(err)
        grpc_context.set_code(code)
        grpc_context.set_details(details)
        return response()

    def _refusal(self, request: Message,
                 grpc_context: RayServegRPCContext) -> tuple[grpc.StatusCode | None, str | None]:
        """UNAUTHENTICATED without a valid key, RESOURCE_EXHAUSTED over max_request_bytes, else (None, None)."""
        unauthenticated = self.api_keys.refusal(grpc_context.invocation_metadata())
        if unauthenticated is not None:
            return grpc.StatusCode.UNAUTHENTICATED, unauthenticated
        size, limit = request.ByteSize(), self.settings.max_request_bytes
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

    async def _call(self, task: str, request: dict[str, Any]):
        key = prefix_key(self.settings.model, task, routing_prefix(self.context, task, request))
        parts = split_request(self.context, task, request, self.settings.max_request_tokens)
        results = await asyncio.gather(*(self.engine.submit.remote(task, sub, prefix_key=key, num_tokens=tokens)
                                         for sub, tokens in parts))
        return merge_results(task, request, results)
