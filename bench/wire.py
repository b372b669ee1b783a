"""The two transports of a rerank request as the host-path benchmark sees them, one object each: what the client
sends (`wire`, untimed), what the ingress does with it before and after the request path (`decode`, `encode`: the
functions the server runs), and a client of the served application (`client`, presenting an API key).

* gRPC (`radixserve.v1.Scoring/Rerank` through Ray's gRPC proxy): the message parsed by its generated class and
  turned into a `RerankRequest` by `deployments.grpc_codec.from_pb`; the result back by `to_pb`, serialized.
* HTTP (Cohere v2, `POST /v2/rerank` through Ray's HTTP proxy): the body validated by the dialect's pydantic model
  (`RerankV2Request`, as FastAPI does) and turned into a `RerankRequest` as the route does; the result rendered by
  the dialect (`CohereDialect._v2`) into a `JSONResponse`, as `Service.respond` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
from fastapi.responses import JSONResponse

from deployments import grpc_codec
from deployments.http.cohere import CohereDialect, RerankV2Request
from radix_core.tasks import TASKS, RerankRequest, RerankResult
from radixserve.client import ScoringClient
from radixserve.v1 import scoring_pb2 as pb

RERANK = TASKS["rerank"]
TIMEOUT_S = 600.0  # a 1,000-document request of the `bench` preset on 2 CPUs takes tens of seconds


class Grpc:
    name = "gRPC"

    def wire(self, request: dict) -> bytes:
        return pb.RerankRequest(**request).SerializeToString()

    def decode(self, data: bytes) -> RerankRequest:
        return grpc_codec.from_pb(pb.RerankRequest.FromString(data))

    def encode(self, result: RerankResult, num_documents: int) -> bytes:
        return grpc_codec.to_pb(RERANK, result).SerializeToString()

    @contextmanager
    def client(self, grpc_port: int, http_port: int, api_key: str) -> Iterator[Callable[[dict], int]]:
        """A call that sends one request and returns its input tokens."""
        with ScoringClient(f"127.0.0.1:{grpc_port}", api_key=api_key, timeout_s=TIMEOUT_S) as client:
            yield lambda request: client.rerank(**request).usage.input_tokens


class Http:
    name = "HTTP"

    def wire(self, request: dict) -> bytes:
        return json.dumps(request).encode()

    def decode(self, data: bytes) -> RerankRequest:
        body = RerankV2Request.model_validate_json(data)
        return RerankRequest(body.query, body.documents, top_n=body.top_n, max_document_tokens=body.max_tokens_per_doc,
                             **body.long_document_fields())

    def encode(self, result: RerankResult, num_documents: int) -> bytes:
        return JSONResponse(CohereDialect._v2(result, num_documents)).body

    @contextmanager
    def client(self, grpc_port: int, http_port: int, api_key: str) -> Iterator[Callable[[dict], int]]:
        with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", headers={"authorization": f"Bearer {api_key}"},
                          timeout=TIMEOUT_S) as client:
            def call(request: dict) -> int:
                response = client.post("/v2/rerank", json=request)
                response.raise_for_status()
                return response.json()["meta"]["tokens"]["input_tokens"]
            yield call


TRANSPORTS = (Grpc(), Http())
