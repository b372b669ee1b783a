"""`GrpcService`: one gRPC API the application serves (radixserve.v1, tei.v1, grpc.health.v1), as the `Rpc`s it
answers. A service owns its messages' conversion to the library's requests and results, its streams and its
errors' field names; `deployments.grpc_api.registry` makes the ingress's methods from every service's rpcs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from google.protobuf.message import Message

UNARY, CLIENT_STREAM, BIDIRECTIONAL = "unary", "client_stream", "bidirectional"


@dataclass(frozen=True)
class Rpc:
    """One rpc: the ingress method Ray's proxy calls for it (`name`, the rpc's own name: the proxy routes by it
    alone), its request message type (what tells apart the unary rpcs of several services that share a name),
    its shape, and `handler(server, request, grpc_context)`: the reply; for a client stream `request` is the
    stream of messages, for a bidirectional stream `handler` is an async generator of replies."""

    name: str
    request_type: type[Message]
    handler: Callable[..., Any]
    shape: str = UNARY


class GrpcService(ABC):
    name: ClassVar[str]  # the proto package or service, for docs and errors

    @abstractmethod
    def rpcs(self) -> list[Rpc]:
        """Every rpc of the service."""
