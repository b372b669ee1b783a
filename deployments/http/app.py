"""`build_app(ingress)`: the FastAPI application Ray Serve's HTTP proxy (port 8000) sends to the `Ingress`
replica (`@serve.ingress` builds it per replica, after the constructor, from `Ingress.__serve_build_asgi_app__`).

Every dialect's routes (`DIALECTS`) call the ingress's `answer(request)`, the path gRPC requests take, so
HTTP and gRPC share validation, tokenizing, prefix keys, routing and batching. What the application adds:

* the API key checked from the headers alone, before any of the body is read (`KeyFirst`): Ray's proxy gives a
  request one of the ingress's request slots from its headers on, so a peer without a key must not hold one while
  it sends a body slowly, or never;
* body limits: a request body over `max_request_bytes` is refused with 413 before it is parsed (by its
  Content-Length, else as it streams in), and one that has not all arrived within `client_input_timeout_s` with 408;
* errors in the body of the dialect that owns the path (`Dialect.error_body`): request-model validation (422,
  naming each field), the task's own validation (422, a `RequestError` wherever a route raises it), API keys
  (401), model names (404), overload (429 with Retry-After), an engine that is not ready (503) and server faults
  (500, without a stack trace). Client errors are answered by Starlette's ordinary exception handlers, so the
  request is metered with its code and nothing logs a traceback; a fault no route converted reaches Starlette's
  last-resort handler, which answers 500 and re-raises it for the server to log (once: not logged here);
* the OpenAPI schema at /openapi.json and its pages at /docs and /redoc.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.grpc_status import internal_details
from deployments.http.dialect import Dialect
from deployments.http.errors import BACKEND, PAYLOAD_TOO_LARGE, REQUEST_TIMEOUT, VALIDATION, ApiError, api_error
from deployments.http.metering import Metered
from deployments.http.registry import DEFAULT_DIALECT, DIALECTS
from deployments.http.service import PriorityHeader, Service
from deployments.server import Server
from radix_core.errors import RequestError
from radixserve import __version__


DESCRIPTION = ("Drop-in HTTP APIs of Cohere (rerank v1/v2, Jina's rerank on /v1/rerank), OpenAI (embeddings) and "
               "Hugging Face text-embeddings-inference, served by radixserve: shared prefixes computed once per "
               "batch. `x-radixserve-computed-tokens` on each answer counts the tokens computed after that, "
               "`x-radixserve-cached-tokens` those read from the prefix cache.")


def build_app(scorer: Server) -> FastAPI:
    service = Service(scorer)
    app = FastAPI(title="radixserve", version=__version__, description=DESCRIPTION)
    owners: dict[str, Dialect] = {}
    keyed: list[tuple[BaseRoute, Dialect]] = []
    for dialect in DIALECTS:
        router = dialect.router(service)
        app.include_router(router)
        owners.update({route.path: dialect for route in router.routes})
        keyed += [(route, dialect) for route in router.routes if needs_key(route, service)]

    async def answer_error(request: Request, err: Exception) -> JSONResponse:
        dialect = owners.get(getattr(request.scope.get("route"), "path", None), DEFAULT_DIALECT)
        return error_response(dialect, api_error(err))

    async def answer_validation(request: Request, err: RequestValidationError) -> JSONResponse:
        return await answer_error(request, ApiError(VALIDATION, validation_message(err)))

    async def answer_fault(request: Request, err: Exception) -> JSONResponse:
        """A server fault no route converted: 500 naming its type only. Not logged here: Starlette re-raises it
        after this answer, and the server logs it with its stack trace (Ray's replica: `Request failed.`)."""
        return await answer_error(request, ApiError(BACKEND, internal_details(err)))

    app.add_exception_handler(RequestValidationError, answer_validation)
    app.add_exception_handler(HTTPException, answer_error)
    app.add_exception_handler(RequestError, answer_error)
    app.add_exception_handler(Exception, answer_fault)
    app.add_middleware(BodyLimit, limit=scorer.args.limits.max_request_bytes,
                       timeout_s=scorer.args.limits.client_input_timeout_s)
    app.add_middleware(KeyFirst, service=service, keyed=keyed)
    app.add_middleware(PriorityHeader)
    app.add_middleware(Metered, metrics=scorer.metrics,
                       dialect_of=lambda path: owners.get(path, DEFAULT_DIALECT).name)
    return app


def needs_key(route: BaseRoute, service: Service) -> bool:
    """Whether `route` depends on `service.authorize` (how a dialect marks the routes that need the API key)."""
    return isinstance(route, APIRoute) and any(dependency.call == service.authorize
                                               for dependency in route.dependant.dependencies)


def error_response(dialect: Dialect, error: ApiError) -> JSONResponse:
    """`error` in `dialect`'s body, with its status and headers."""
    return JSONResponse(dialect.error_body(error.kind, error.detail), status_code=error.status_code,
                        headers=error.headers)


def validation_message(err: RequestValidationError) -> str:
    """Each problem as `field: what is wrong`, without the values sent (they may be large or secret)."""
    problems = []
    for error in err.errors():
        field = ".".join(str(part) for part in error["loc"] if part != "body") or "body"
        problems.append(f"{field}: {error['msg']}")
    return "; ".join(problems) + " (the request schema is at /openapi.json)"


class KeyFirst:
    """ASGI middleware: a request for a keyed route without a valid key is answered 401, in the route's dialect,
    from its headers alone, before any of its body is read. (FastAPI reads a body before a route's dependencies run,
    so `Service.authorize` alone would check the key only after the whole body came; it stays on the routes as the
    mark of the keyed ones.)"""

    def __init__(self, app: ASGIApp, service: Service, keyed: Sequence[tuple[BaseRoute, Dialect]]):
        self.app = app
        self.service = service
        self.keyed = keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        dialect = self.keyed_dialect(scope) if scope["type"] == "http" else None
        if dialect is not None:
            try:
                self.service.authorize(Request(scope))
            except ApiError as refusal:
                await error_response(dialect, refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def keyed_dialect(self, scope: Scope) -> Dialect | None:
        """The dialect of the keyed route the request is for, or None when it is for no keyed route."""
        return next((dialect for route, dialect in self.keyed if route.matches(scope)[0] is Match.FULL), None)


class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, by its Content-Length or as it is received, and 408 for
    a body not all received `timeout_s` after the request came; raised while the route reads the body, so the
    route's dialect writes the error."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float):
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        received, complete = 0, False

        async def limited_receive() -> Message:
            nonlocal received, complete
            if declared.isdigit() and int(declared) > self.limit:
                raise self.too_large(f"{int(declared)} bytes")
            if complete:  # after the body only a disconnect can come, and the route may wait for it
                return await receive()
            message = await self.in_time(receive, deadline)
            complete = not message.get("more_body", False)
            received += len(message.get("body", b""))
            if received > self.limit:
                raise self.too_large(f"over {self.limit} bytes")
            return message

        await self.app(scope, limited_receive, send)

    async def in_time(self, receive: Receive, deadline: float) -> Message:
        """The body's next message, or 408 once the deadline has passed."""
        try:
            return await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
        except asyncio.TimeoutError:
            raise ApiError(REQUEST_TIMEOUT, f"the request body did not all arrive within {self.timeout_s:g} s, the "
                                            "most the server waits for one: send the body right after the "
                                            "headers") from None

    def too_large(self, size: str) -> ApiError:
        return ApiError(PAYLOAD_TOO_LARGE, f"request body is {size}, over the limit of {self.limit} bytes "
                                           "(max_request_bytes): split it into smaller requests")
