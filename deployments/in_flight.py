"""`InFlight`: radixserve's own bound on the complete requests one transport has in flight at an ingress replica.

    with in_flight.admitted():  # once the body, or the stream's messages, are all in
        return await server.answer(request, priority)

Ray Serve's proxies give a request one of the ingress replica's `placement.ingress.max_ongoing_requests` slots
from its HTTP headers or its gRPC stream's start, before any input arrives; so those slots are sized for
connections (each waiting one is a coroutine, cheap), and this bound, `limits.max_in_flight_requests` per transport,
counts a request only once its input is in (as TEI's concurrency limit does). Each transport has its own, so
stalled HTTP bodies cannot take what gRPC calls need, nor idle gRPC streams HTTP's. A complete request over the bound
is refused at once (`InFlightFull`: RESOURCE_EXHAUSTED, HTTP 429, with a retry hint), never queued.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

RETRY_AFTER_S = 1.0  # the retry hint of a refusal: requests in flight take milliseconds to seconds


class InFlightFull(RuntimeError):
    """A complete request found its transport's in-flight bound reached; retry after about `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InFlight:
    """The requests of one transport (`name`) being answered at this replica, at most `limit` at once."""

    def __init__(self, name: str, limit: int):
        self.name = name
        self.limit = limit
        self.count = 0

    @contextmanager
    def admitted(self) -> Iterator[None]:
        """Counts the request while the block runs; InFlightFull, at once, when `limit` are already counted."""
        if self.count >= self.limit:
            raise InFlightFull(f"this server is answering {self.limit} {self.name} requests, the most it takes at "
                               "once (limits.max_in_flight_requests): retry with backoff, or add ingress replicas",
                               RETRY_AFTER_S)
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
