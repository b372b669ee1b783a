"""`build_app(ingress)`: the FastAPI application Ray Serve's HTTP proxy (port 8000) sends to the `Ingress`
replica (`@serve.ingress` builds it per replica, after the constructor, from `Ingress.__serve_build_asgi_app__`).

Every dialect's routes (`DIALECTS`) call the ingress's `call(task, request)`, the path gRPC requests take, so
HTTP and gRPC share validation, tokenizing, prefix keys, routing and batching. What the application adds:

* a body limit: a request body over `max_request_bytes` is refused with 413 before it is parsed (by its
  Content-Length, else as it streams in);
* errors in the body of the dialect that owns the path (`Dialect.error_body`): request-model validation (422,
  naming each field), the task's own validation (422), API keys (401), model names (404), overload (429 with
  Retry-After), an engine that is not ready (503) and server faults (500, without a stack trace);
* the OpenAPI schema at /openapi.json and its pages at /docs and /redoc.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from deployments.http.dialect import Dialect
from deployments.http.errors import PAYLOAD_TOO_LARGE, VALIDATION, ApiError, api_error
from deployments.http.metering import Metered
from deployments.http.registry import DEFAULT_DIALECT, DIALECTS
from deployments.http.service import PriorityHeader, Scorer, Service
from radixserve import __version__

DESCRIPTION = ("Drop-in HTTP APIs of Cohere (rerank v1/v2, Jina's rerank on /v1/rerank), OpenAI (embeddings) and "
               "Hugging Face text-embeddings-inference, served by radixserve: shared prefixes computed once per "
               "batch. `x-radixserve-computed-tokens` on each answer counts the tokens computed after that.")


def build_app(scorer: Scorer) -> FastAPI:
    service = Service(scorer)
    app = FastAPI(title="radixserve", version=__version__, description=DESCRIPTION)
    owners: dict[str, Dialect] = {}
    for dialect in DIALECTS:
        router = dialect.router(service)
        app.include_router(router)
        owners.update({route.path: dialect for route in router.routes})

    async def answer_error(request: Request, err: Exception) -> JSONResponse:
        error = api_error(err)
        dialect = owners.get(getattr(request.scope.get("route"), "path", None), DEFAULT_DIALECT)
        return JSONResponse(dialect.error_body(error.kind, error.detail), status_code=error.status_code,
                            headers=error.headers)

    async def answer_validation(request: Request, err: RequestValidationError) -> JSONResponse:
        return await answer_error(request, ApiError(VALIDATION, validation_message(err)))

    app.add_exception_handler(RequestValidationError, answer_validation)
    app.add_exception_handler(HTTPException, answer_error)
    app.add_exception_handler(Exception, answer_error)
    app.add_middleware(BodyLimit, limit=scorer.args.max_request_bytes)
    app.add_middleware(PriorityHeader)
    app.add_middleware(Metered, metrics=scorer.metrics,
                       dialect_of=lambda path: owners.get(path, DEFAULT_DIALECT).name)
    return app


def validation_message(err: RequestValidationError) -> str:
    """Each problem as `field: what is wrong`, without the values sent (they may be large or secret)."""
    problems = []
    for error in err.errors():
        field = ".".join(str(part) for part in error["loc"] if part != "body") or "body"
        problems.append(f"{field}: {error['msg']}")
    return "; ".join(problems) + " (the request schema is at /openapi.json)"


class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, by its Content-Length or as it is received; raised
    while the route reads the body, so the route's dialect writes the error."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        received = 0

        async def limited_receive():
            nonlocal received
            if declared.isdigit() and int(declared) > self.limit:
                raise self.too_large(f"{int(declared)} bytes")
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise self.too_large(f"over {self.limit} bytes")
            return message

        await self.app(scope, limited_receive, send)

    def too_large(self, size: str) -> ApiError:
        return ApiError(PAYLOAD_TOO_LARGE, f"request body is {size}, over the limit of {self.limit} bytes "
                                           "(max_request_bytes): split it into smaller requests")
