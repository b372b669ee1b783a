"""`Server`: what every transport uses of the ingress replica (`deployments.ingress.Ingress`): its settings, API
keys, model and card, metrics, the gRPC calls in flight, the one request path (`answer`,
`deployments.request_path`) and `info`. The transports (`deployments.grpc_api`, `deployments.http`) are written
against it, so tests drive them with a stand-in."""

from __future__ import annotations

from typing import Any, Protocol

from deployments.auth import ApiKeys
from deployments.config import AppArgs
from deployments.engine_request import Priority
from deployments.in_flight import InFlight
from deployments.metrics import IngressMetrics
from deployments.model_card import ModelCard
from radix_core.tasks import TaskContext, TaskRequest


class Server(Protocol):
    args: AppArgs
    api_keys: ApiKeys
    context: TaskContext
    card: ModelCard
    metrics: IngressMetrics
    grpc_in_flight: InFlight  # the gRPC calls being answered (HTTP's bound is its `Service`'s)

    async def answer(self, request: TaskRequest, priority: Priority) -> Any:
        """The request's result (`RequestPath.answer`); raises a RequestError for bad input."""

    async def info(self) -> dict[str, Any]:
        """The server's and the engine's facts and limits (raises when no engine replica answers)."""
