"""The gRPC status of an error raised while answering a call: what the client did wrong, what it may retry, and
what is the server's fault (logged here, answered with a short message and no stack trace).

    INVALID_ARGUMENT    `radix_core.errors.RequestError`: the client's mistake, raised where the input is checked
                        (any plain ValueError, numpy's or a bug's, is the server's: INTERNAL)
    RESOURCE_EXHAUSTED  Ray Serve's BackPressureError (engine max_queued_requests), the batcher's QueueFullError and
                        the ingress's InFlightFull (limits.max_in_flight_requests), each with a retry hint
                        (`retry_after_s`, sent as the trailing metadata `retry-after-ms`): the request fits once the
                        server has room. A refusal without the hint (a message over
                        max_request_bytes) can never succeed as sent, and clients do not retry it.
    UNAVAILABLE         engine deployment failed, its replica or actor died or is unreachable: retry shortly
    INTERNAL            anything else: logged here once, with its stack trace

An error raised in another Ray process arrives as a `RayTaskError` whose `cause` is the original exception (the
error is also an instance of the cause's class, but its `str` is the remote stack trace), so the cause is
classified and its own message is sent.
"""

from __future__ import annotations

import logging

import grpc
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

from deployments.batcher import QueueFullError
from deployments.in_flight import InFlightFull
from radix_core.errors import RequestError

logger = logging.getLogger("ray.serve")

UNAVAILABLE_ERRORS = (DeploymentUnavailableError, ReplicaUnavailableError, RayActorError)


def root_cause(err: BaseException) -> BaseException:
    """The exception user code raised, through any number of `RayTaskError` wrappers."""
    while isinstance(err, RayTaskError) and err.cause is not None:
        err = err.cause
    return err


BACKPRESSURE_RETRY_S = 1.0  # the hint for Ray's BackPressureError, which carries no estimate of its own


def retry_after_s(err: Exception) -> float | None:
    """Seconds the client should wait before retrying an overload refusal (a full batch queue's drain time); None
    when retrying cannot help or the error is not a refusal."""
    cause = root_cause(err)
    if isinstance(cause, (QueueFullError, InFlightFull)):
        return cause.retry_after_s
    return BACKPRESSURE_RETRY_S if isinstance(cause, BackPressureError) else None


def status_of(err: Exception) -> tuple[grpc.StatusCode, str]:
    """`(code, details)` for the client; an unexpected error (INTERNAL) is logged with its stack trace."""
    cause = root_cause(err)
    if isinstance(cause, RequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(cause)
    if isinstance(cause, BackPressureError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"{cause.message} The engine is overloaded: retry with backoff."
    if isinstance(cause, (QueueFullError, InFlightFull)):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(cause)
    if isinstance(cause, UNAVAILABLE_ERRORS):
        return grpc.StatusCode.UNAVAILABLE, (f"the engine is not available ({type(cause).__name__}): it is starting, "
                                             "restarting or failed to deploy; retry shortly")
    logger.error("call failed unexpectedly", exc_info=err)
    return grpc.StatusCode.INTERNAL, internal_details(cause)


def internal_details(cause: BaseException) -> str:
    """What the client is told of a server fault: its type, never its message or stack trace (they may hold
    paths, data or secrets)."""
    return f"internal error ({type(cause).__name__}); the server logged the details"
