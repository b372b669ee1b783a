"""HTTP errors: one `ErrorKind` per way a call can fail, its status, and the gRPC status each one answers for, so
the HTTP face classifies errors with the gRPC face's `status_of` rather than a second classifier.

    kind              status  gRPC code             when
    validation        422     INVALID_ARGUMENT      bad input (a `RequestError`, or the request model's own check):
                                                    the message names the field and the limit
    unauthorized      401     UNAUTHENTICATED       missing or wrong API key
    not_found         404     NOT_FOUND             a model other than the served one, an unknown path
    payload_too_large 413     -                     a body over max_request_bytes
    request_timeout   408     DEADLINE_EXCEEDED     a body that did not all arrive within client_input_timeout_s
    overloaded        429     RESOURCE_EXHAUSTED    engine queue full, or limits.max_in_flight_requests HTTP requests
                                                    in flight: retry after `Retry-After` seconds (the queue's drain
                                                    time when the batcher knows it, else 1)
    unhealthy         503     UNAVAILABLE           the engine is starting, restarting or failed
    backend           500     INTERNAL              a server fault (any other exception, a plain ValueError too);
                                                    its type only, the details in the server log, logged once

The names are TEI's `error_type` values where TEI has one (validation, overloaded, unhealthy, backend). Each
dialect writes the body its clients parse (`Dialect.error_body`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from http import HTTPStatus

import grpc
from starlette.exceptions import HTTPException

from deployments.grpc_status import retry_after_s, status_of

RETRY_AFTER_S = 1  # what a 429 tells the client to wait when the server has no estimate of its own


@dataclass(frozen=True)
class ErrorKind:
    status: int
    name: str


VALIDATION = ErrorKind(422, "validation")
UNAUTHORIZED = ErrorKind(401, "unauthorized")
NOT_FOUND = ErrorKind(404, "not_found")
PAYLOAD_TOO_LARGE = ErrorKind(413, "payload_too_large")
REQUEST_TIMEOUT = ErrorKind(408, "request_timeout")
OVERLOADED = ErrorKind(429, "overloaded")
UNHEALTHY = ErrorKind(503, "unhealthy")
BACKEND = ErrorKind(500, "backend")

KINDS_BY_STATUS = {kind.status: kind for kind in (VALIDATION, UNAUTHORIZED, NOT_FOUND, PAYLOAD_TOO_LARGE,
                                                  REQUEST_TIMEOUT, OVERLOADED, UNHEALTHY, BACKEND)}
KIND_OF_CODE = {grpc.StatusCode.INVALID_ARGUMENT: VALIDATION, grpc.StatusCode.UNAUTHENTICATED: UNAUTHORIZED,
                grpc.StatusCode.NOT_FOUND: NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED: OVERLOADED,
                grpc.StatusCode.DEADLINE_EXCEEDED: REQUEST_TIMEOUT, grpc.StatusCode.UNAVAILABLE: UNHEALTHY,
                grpc.StatusCode.INTERNAL: BACKEND}


class ApiError(HTTPException):
    """An error answered with `kind`'s status and the dialect's body (an HTTPException, so FastAPI passes it through
    unchanged even when it is raised while the body is read)."""

    def __init__(self, kind: ErrorKind, message: str, retry_after: float | None = None):
        wait = max(RETRY_AFTER_S, math.ceil(retry_after or 0))  # Retry-After counts whole seconds
        headers = {"Retry-After": str(wait)} if kind is OVERLOADED else None
        super().__init__(kind.status, message, headers)
        self.kind = kind


def api_error(err: Exception) -> ApiError:
    """`err` as an ApiError: an HTTPException (Starlette's 404, 405, ...) keeps its status, anything else is
    classified by `status_of` (a `RequestError` is a 422; the server faults are logged there, with their stack
    trace)."""
    if isinstance(err, ApiError):
        return err
    if isinstance(err, HTTPException):
        kind = KINDS_BY_STATUS.get(err.status_code) or ErrorKind(err.status_code, _status_name(err.status_code))
        return ApiError(kind, str(err.detail))
    code, details = status_of(err)
    return ApiError(KIND_OF_CODE[code], details, retry_after_s(err))


def _status_name(status: int) -> str:
    """`method_not_allowed` for 405."""
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_")
    except ValueError:
        return "http_error"
