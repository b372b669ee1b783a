"""`Metered`: ASGI middleware that meters the HTTP face's scoring requests (POST) as `answer_call` meters gRPC calls
(`deployments.grpc_api.calls`): `radixserve_requests` and its duration by task, `api` (`http_<dialect>`, the dialect
that owns the path) and outcome as a gRPC status name, and the tokens of what was answered (the request path
counts them into the meter).
The task label is the one the route ran (`Service.run` names it); a request refused before any task is `none`."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments import request_ids
from deployments.http.errors import KIND_OF_CODE, PAYLOAD_TOO_LARGE
from deployments.metrics import IngressMetrics, http_api

NO_TASK = "none"
CODE_OF_STATUS = {200: "OK", PAYLOAD_TOO_LARGE.status: "RESOURCE_EXHAUSTED",
                  **{kind.status: code.name for code, kind in KIND_OF_CODE.items()}}


class Metered:
    def __init__(self, app: ASGIApp, metrics: IngressMetrics, dialect_of: Callable[[str], str]):
        self.app = app
        self.metrics = metrics
        self.dialect_of = dialect_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        status = 500

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        api = http_api(self.dialect_of(scope["path"]))
        with self.metrics.request(NO_TASK, api, request_ids.current()) as meter:
            await self.app(scope, receive, sent)
            meter.code = CODE_OF_STATUS.get(status, f"HTTP_{status}")
