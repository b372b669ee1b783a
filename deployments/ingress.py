"""`Ingress`: the CPU front door, as the Ray Serve deployment: the replica's state and the methods the transports
register on it. The path a request takes is `deployments.request_path` (encode -> key -> submit -> merge); the
transports in front of it are `deployments.grpc_api` (radixserve.v1, tei.v1, grpc.health.v1: one method per rpc
name, which Ray's gRPC proxy calls by name) and `deployments.http` (the FastAPI application of the HTTP dialects,
on port 8000). A DeploymentHandle caller uses `call(task, request_dict)`. The engine is the engine deployment, or
with `placement.topology: combined` an engine replica this replica runs itself (`deployments.engine_link`).

    client ─▶ transport (wire format ─▶ TaskRequest, key and size checks, metering)
           ─▶ RequestPath.answer: [thread] encode, split ─▶ prefix key ─▶ engine.submit ─▶ [thread] merge
           ─▶ transport (result ─▶ wire format; RequestError ─▶ its code, in its field names) ─▶ client

Every bad-input error is raised on the path, before anything is queued; the CPU work (tokenizing, merging,
protobuf and JSON conversion) runs in worker threads, never on the event loop.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.auth import load_api_keys
from deployments.config import AppArgs
from deployments.engine_link import LocalEngine, RemoteEngine
from deployments.engine_request import Priority
from deployments.grpc_api import with_rpcs
from deployments.http import build_app
from deployments.in_flight import InFlight
from deployments.metrics import IngressMetrics
from deployments.model_card import model_card
from deployments.request_path import RequestPath
from radix_core import EngineConfig
from radix_core.tasks import TASKS, TaskRequest, load_task_context, task_of
from radixserve import __version__


@serve.deployment
@serve.ingress()
@with_rpcs
class Ingress:
    """The replica's state (settings, API keys, the model's `TaskContext` and card, metrics, the gRPC calls in
    flight, the request path) and its faces: `call(task, request)` for handle callers, `info()`, the HTTP
    application, and one method per gRPC rpc name (`with_rpcs`)."""

    def __init__(self, engine: DeploymentHandle | EngineConfig, args: AppArgs):
        """`engine`: the engine deployment's handle, or (combined topology) the config of the engine to run here."""
        self.args = args
        self.api_keys = load_api_keys(args.auth.api_keys_file, args.auth.api_keys_env,
                                      prefix_cache_scope=args.auth.prefix_cache_scope)
        self.context = load_task_context(args.model, args.tasks)
        self.card = model_card(args.model, args.served_model_name, args.primary_task, self.context)
        self.metrics = IngressMetrics()
        self.grpc_in_flight = InFlight("gRPC", args.limits.max_in_flight_requests)
        self.engine = LocalEngine(args, engine) if isinstance(engine, EngineConfig) else RemoteEngine(engine)
        self.path = RequestPath(self.engine, self.context, args.limits.max_request_tokens, self.metrics.stages)

    async def answer(self, request: TaskRequest, priority: Priority = Priority.INTERACTIVE) -> Any:
        """The request's result, by the one request path (what every transport calls)."""
        return await self.path.answer(request, priority)

    async def call(self, task: str, request: dict[str, Any], priority: str | None = None) -> Any:
        """The task's result for one request given as a dict of its fields (`priority`: interactive, the default,
        or batch); a RequestError names what is wrong before anything is queued."""
        found = task_of(task)
        return await self.answer(found.request_type.of(request, found.name), Priority.parse(priority))

    async def info(self) -> dict[str, Any]:
        engine = await self.engine.info()
        limits = self.args.limits
        return {**engine, "version": __version__, "tasks": list(TASKS), "max_items": self.args.tasks.max_items,
                "max_tokens_per_item": self.context.token_limit, "max_request_tokens": limits.max_request_tokens,
                "max_request_bytes": limits.max_request_bytes, "submitted_parts": self.path.submitted_parts,
                "request_stages": self.metrics.stages.totals,
                **self.card.info(), "model": self.card.served_model_name}

    async def check_health(self) -> None:
        """Serve's health probe: the engine this replica runs must still compute (combined topology)."""
        await self.engine.check_health()

    def __serve_build_asgi_app__(self):
        """The HTTP API on port 8000 (`deployments.http`), built by Ray Serve after the constructor."""
        return build_app(self)
