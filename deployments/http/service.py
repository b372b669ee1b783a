"""`Service`: what every HTTP route shares, over the one `Ingress` replica it runs in: the API key, the model
name, the call into the ingress (the same validation, tokenizing, prefix key, router and batcher as gRPC), and the
response rendered in a worker thread with the call's token usage in headers.

Routes convert their dialect's request into the task's keyword arguments and the task's result back; they do no
work of their own on the event loop beyond that. A request's class comes from its `x-radixserve-priority` header
(`interactive`, the default, or `batch`), which the `PriorityHeader` middleware hands to `run`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from deployments.auth import ApiKeys
from deployments.config import AppArgs
from deployments.engine_request import PRIORITY_HEADER
from deployments.grpc_status import retry_after_s
from deployments.http.errors import NOT_FOUND, UNAUTHORIZED, ApiError, api_error
from deployments.metrics import IngressMetrics, name_task
from deployments.model_card import ModelCard
from radix_core.tasks import TaskContext, Usage

COMPUTED_TOKENS_HEADER = "x-radixserve-computed-tokens"  # tokens computed after shared prefixes were deduplicated
INPUT_TOKENS_HEADER = "x-radixserve-input-tokens"  # tokens of the call's sequences as sent to the model
_PRIORITY: ContextVar[str | None] = ContextVar("radixserve_http_priority", default=None)


class Scorer(Protocol):
    """The parts of `deployments.ingress.Ingress` the routes use."""

    args: AppArgs
    api_keys: ApiKeys
    context: TaskContext
    card: ModelCard
    metrics: IngressMetrics

    async def call(self, task: str, request: dict[str, Any], priority: str | None = None) -> Any: ...

    async def info(self) -> dict[str, Any]: ...


class Service:
    def __init__(self, scorer: Scorer):
        self.scorer = scorer

    @property
    def card(self) -> ModelCard:
        return self.scorer.card

    def authorize(self, request: Request) -> None:
        """FastAPI dependency: 401 without a valid `Authorization: Bearer <key>` when the server has API keys."""
        refusal = self.scorer.api_keys.refusal(request.headers.items())
        if refusal is not None:
            raise ApiError(UNAUTHORIZED, refusal.replace("the metadata", "the header"))

    def check_model(self, name: str | None) -> None:
        """404 unless `name` is None or names the served model."""
        if not self.card.accepts(name):
            raise ApiError(NOT_FOUND, f"model {name!r} is not served here: this server serves "
                                      f"{self.card.served_model_name!r}; send that as model, or leave model out")

    async def run(self, task: str, request: dict[str, Any], rename: Callable[[str], str] | None = None) -> Any:
        """The task's result; any error as an ApiError. `rename` rewrites an error message's argument names into
        the dialect's field names, so a validation message names the field the client sent."""
        name_task(task)
        try:
            return await self.scorer.call(task, request, _PRIORITY.get())
        except Exception as err:  # every error becomes an ApiError; status_of logs the unexpected ones
            error = api_error(err)
            detail = error.detail if rename is None else rename(error.detail)
            raise ApiError(error.kind, detail, retry_after_s(err)) from None

    async def respond(self, render: Callable[..., Any], *args: Any, usage: Usage | None = None) -> JSONResponse:
        """`render(*args)` as a JSON response, rendered and encoded in a worker thread; the usage in headers."""
        response = await asyncio.to_thread(lambda: JSONResponse(render(*args)))
        if usage is not None:
            response.headers[COMPUTED_TOKENS_HEADER] = str(usage.computed_tokens)
            response.headers[INPUT_TOKENS_HEADER] = str(usage.input_tokens)
        return response



class PriorityHeader:
    """ASGI middleware: the request's `x-radixserve-priority` header, for `Service.run` (the routes see only their
    dialect's body); a bad value is refused there, in the route's dialect."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            value = dict(scope["headers"]).get(PRIORITY_HEADER.encode())
            _PRIORITY.set(value.decode("latin-1") if value is not None else None)
        await self.app(scope, receive, send)
