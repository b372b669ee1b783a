"""`ScoringClient`: a Python client of the radixserve gRPC API. Needs grpcio and the stubs, not torch or Ray.

    with ScoringClient("localhost:9000", api_key=os.environ.get("RADIXSERVE_API_KEY")) as client:
        ranked = client.rerank("what is a trie", ["A trie is a prefix tree.", "Bread rises."], top_n=1)
        ranked.results[0].index, ranked.results[0].score, ranked.usage.computed_tokens
        client.embed(["some text"], dimensions=256).embeddings[0].values

Every rpc of `radixserve.v1.Scoring` is a method named after it in lower case (`Rerank` -> `rerank`), made from
the service's descriptor, so a task added to the proto is callable without editing this file. A method takes
the request message's fields as arguments (positionally in the proto's field order, which is the library's
argument order, or by name; an argument left out or None leaves the field unset, so the server's default
applies) and returns the response message (`to_dict` makes it plain). A call, retries included, has the deadline
`timeout_s`; an attempt answered UNAVAILABLE (engine starting, replica restarting) or RESOURCE_EXHAUSTED with
the server's retry hint (`retry-after-ms` in the trailing metadata: overload, and when the engine's queue should
have room) is retried up to `retries` times after a pause of `backoff_s * 2**attempt` with equal jitter (between
half and all of it, so clients refused together do not return together), or the hint when longer, unless the
pause would pass the deadline. RESOURCE_EXHAUSTED without the hint (a message over the server's
max_request_bytes) and any other error raise the `grpc.RpcError` at once: retrying cannot help, and its `code()`
and `details()` say what was wrong (INVALID_ARGUMENT names the field and the limit). The client sends what it is
given; the server validates.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message

from radixserve.v1 import scoring_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["Scoring"]
RETRY_AFTER_KEY = "retry-after-ms"  # trailing metadata of a refusal: when the engine expects room (the ingress sets it)
# gRPC clients accept 4 MiB replies by default; 1024 embeddings of 4096 float32 are 16 MiB.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class ScoringClient:
    """One channel to a radixserve server (`HOST:PORT` of its gRPC proxy, 9000 by default)."""

    def __init__(self, address: str, api_key: str | None = None, timeout_s: float = 30.0, retries: int = 3,
                 backoff_s: float = 0.2):
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._metadata = [("authorization", f"Bearer {api_key}")] if api_key else []
        self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)

    def call(self, rpc: str, *args: Any, **kwargs: Any) -> Message:
        """`rpc` (e.g. "Rerank") with the request fields `args` (in field order) and `kwargs`."""
        method = SERVICE.methods_by_name.get(rpc)
        if method is None:
            raise ValueError(f"unknown rpc {rpc!r}: radixserve.v1.Scoring has {', '.join(SERVICE.methods_by_name)}")
        return self._call(method, request_message(method, args, kwargs))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ScoringClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: MethodDescriptor, request: Message) -> Message:
        """The unary call with the key, retried with jittered exponential backoff while retryable and within the
        call's deadline."""
        stub = self._channel.unary_unary(
            f"/{SERVICE.full_name}/{method.name}", request_serializer=type(request).SerializeToString,
            response_deserializer=message_factory.GetMessageClass(method.output_type).FromString)
        deadline = time.monotonic() + self.timeout_s
        for attempt in itertools.count():
            try:
                return stub(request, timeout=max(deadline - time.monotonic(), 0.001), metadata=self._metadata)
            except grpc.RpcError as err:
                pause = max(self.backoff_s * 2 ** attempt * random.uniform(0.5, 1.0), retry_after_s(err) or 0.0)
                if not retryable(err) or attempt >= self.retries or time.monotonic() + pause >= deadline:
                    raise
            time.sleep(pause)


def retryable(err: grpc.RpcError) -> bool:
    """UNAVAILABLE, or RESOURCE_EXHAUSTED with the server's retry hint (without one, retrying cannot help)."""
    code = err.code()
    return code == grpc.StatusCode.UNAVAILABLE or (code == grpc.StatusCode.RESOURCE_EXHAUSTED
                                                   and retry_after_s(err) is not None)


def retry_after_s(err: grpc.RpcError) -> float | None:
    """The server's retry hint (trailing metadata `retry-after-ms`, sent with an overload refusal), else None."""
    value = dict(err.trailing_metadata() or ()).get(RETRY_AFTER_KEY)
    try:
        return None if value is None else max(float(value), 0.0) / 1000
    except ValueError:
        return None


def request_message(method: MethodDescriptor, args: tuple, kwargs: dict[str, Any]) -> Message:
    """The request message of `method` from positional (field order) and keyword field values; None is unset."""
    fields = [f.name for f in method.input_type.fields]
    if len(args) > len(fields):
        raise TypeError(f"{method.name} takes at most {len(fields)} positional arguments ({', '.join(fields)}), "
                        f"got {len(args)}")
    values = dict(zip(fields, args))
    twice = sorted(set(values) & set(kwargs))
    if twice:
        raise TypeError(f"{method.name} got {twice} both positionally and by name")
    values.update(kwargs)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise TypeError(f"{method.name} has no fields {unknown}: it takes {', '.join(fields)}")
    message = message_factory.GetMessageClass(method.input_type)
    return message(**{name: value for name, value in values.items() if value is not None})


def to_dict(message: Message) -> dict[str, Any]:
    """Every field of `message` by name (unset optional ones left out, others at their defaults), nested messages as
    dicts, repeated as lists; integers stay integers (protobuf's JSON mapping would make int64 strings)."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        if field.has_presence and not message.HasField(field.name):
            continue
        value = getattr(message, field.name)
        if field.message_type is not None:
            out[field.name] = [to_dict(v) for v in value] if field.is_repeated else to_dict(value)
        else:
            out[field.name] = list(value) if field.is_repeated else value
    return out


def _rpc_method(method: MethodDescriptor) -> Callable[..., Message]:
    def call(self: ScoringClient, *args: Any, **kwargs: Any) -> Message:
        return self._call(method, request_message(method, args, kwargs))

    fields = ", ".join(f.name for f in method.input_type.fields)
    call.__name__ = call.__qualname__ = method.name.lower()
    call.__doc__ = f"radixserve.v1.Scoring/{method.name}({fields}) -> {method.output_type.name}"
    return call


for _method in SERVICE.methods:
    setattr(ScoringClient, _method.name.lower(), _rpc_method(_method))
