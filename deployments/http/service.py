"""`Service`: what every HTTP route shares, over the one `Ingress` replica it runs in: the API key, the model
name, the one request path (`Server.answer`: the same validation, tokenizing, prefix key, router and batcher as
gRPC), and the response rendered in a worker thread with the call's token usage in headers.

Routes convert their dialect's body into the task's request (`RerankRequest`, ...) and the task's result back; they
do no work of their own on the event loop beyond that. The HTTP requests being answered at once are bounded by
`limits.max_in_flight_requests` (`InFlight`), counted once the body is in: a body still arriving holds none. A
task's error names the dialect's fields through the dialect's table (`run(..., names=...)`, applied to the
structured `RequestError`). A request's class comes from its `x-radixserve-priority` header (`interactive`, the
default, or `batch`), which the `PriorityHeader` middleware hands to `run`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import pydantic_core
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from deployments.engine_request import PRIORITY_HEADER, Priority
from deployments.grpc_status import root_cause
from deployments.http.errors import NOT_FOUND, UNAUTHORIZED, ApiError, api_error
from deployments.in_flight import InFlight, InFlightFull
from deployments.metrics import name_task
from deployments.model_card import ModelCard
from deployments.request_path import gather_or_cancel
from deployments.server import Server
from radix_core.errors import FieldNames, RequestError
from radix_core.tasks import TaskRequest, Usage, task_for

COMPUTED_TOKENS_HEADER = "x-radixserve-computed-tokens"  # tokens computed after shared prefixes were deduplicated
INPUT_TOKENS_HEADER = "x-radixserve-input-tokens"  # tokens of the call's sequences as sent to the model
CACHED_TOKENS_HEADER = "x-radixserve-cached-tokens"  # tokens read from the prefix cache instead of computed
_PRIORITY: ContextVar[str | None] = ContextVar("radixserve_http_priority", default=None)


class Service:
    def __init__(self, scorer: Server):
        self.scorer = scorer
        self.in_flight = InFlight("HTTP", scorer.args.limits.max_in_flight_requests)

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

    async def run(self, request: TaskRequest, names: FieldNames | None = None) -> Any:
        """The request's result; any error as an ApiError, a task's error in the dialect's field names (`names`:
        the library's field -> the dialect's, `RequestError.renamed`)."""
        (result,) = await self.run_all([request], [names])
        return result

    async def run_all(self, requests: Sequence[TaskRequest], names: Sequence[FieldNames | None]) -> list[Any]:
        """The results of several requests that answer one HTTP request, all at once (the first failure cancels
        the others), admitted together as one of the HTTP requests in flight (the body is in); request i's errors
        in the field names `names[i]`. The metered task is the last one's."""
        name_task(task_for(requests[-1]).name)
        priority = Priority.parse(_PRIORITY.get())

        async def one(request: TaskRequest, table: FieldNames | None) -> Any:
            try:
                return await self.scorer.answer(request, priority)
            except Exception as err:  # every error becomes an ApiError; status_of logs the unexpected ones
                cause = root_cause(err)
                if table and isinstance(cause, RequestError):
                    err = cause.renamed(table)
                raise api_error(err) from None

        try:
            with self.in_flight.admitted():
                return await gather_or_cancel([one(request, table) for request, table in zip(requests, names)])
        except InFlightFull as refusal:
            raise api_error(refusal) from None

    async def respond(self, render: Callable[..., Any], *args: Any, usage: Usage | None = None) -> JSONResponse:
        """`render(*args)` as a JSON response, rendered and encoded in a worker thread; the usage in headers."""
        response = await asyncio.to_thread(lambda: FastJSONResponse(render(*args)))
        if usage is not None:
            response.headers[COMPUTED_TOKENS_HEADER] = str(usage.computed_tokens)
            response.headers[INPUT_TOKENS_HEADER] = str(usage.input_tokens)
            response.headers[CACHED_TOKENS_HEADER] = str(usage.cached_tokens)
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


class FastJSONResponse(JSONResponse):
    """`JSONResponse` encoded by pydantic-core's Rust encoder: the same JSON, faster on embedding vectors, the part of
    a response that grows with the hidden size and the texts a request embeds (an OpenAI body, `tolist` included, on
    2 CPUs: 16 x 512 floats 0.65 against 3.67 ms, 1,000 x 1,024 126 against 489). Non-finite numbers are refused as
    the standard library refuses them: a body with a bare `NaN` or `Infinity` (or a string holding those letters) is
    encoded again by the standard library, which raises on the number and writes the string."""

    def render(self, content: Any) -> bytes:
        body = pydantic_core.to_json(content, inf_nan_mode="constants")
        return super().render(content) if b"NaN" in body or b"Infinity" in body else body
