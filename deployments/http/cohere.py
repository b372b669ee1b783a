"""Cohere's rerank API, v1 and v2, and Jina's, which shares the v1 path.

    POST /v1/rerank   Cohere v1 and Jina: documents as strings or {"text": ...}; return_documents
    POST /v2/rerank   Cohere v2: documents as strings; max_tokens_per_doc

Both answer `{id, results: [{index, relevance_score, document?: {text}}], meta}`, best first; v1 adds Jina's
`model` and `usage: {total_tokens, prompt_tokens}`. `meta.tokens` and `usage` also carry `computed_tokens`, the
tokens left after shared prefixes were computed once, and `cached_tokens`, those read from the prefix cache.
Errors are Cohere's `{"message": ...}`, which its SDK raises as `BadRequestError`/`UnprocessableEntityError`,
`UnauthorizedError`, `NotFoundError`, ... with the message.

`search_units` counts one unit per 100 documents, as Cohere bills. `max_tokens_per_doc` cuts each document to that
many of its own tokens (the library's `max_document_tokens`, keeping its start); a document whose prompt is still
over the server's per-item limit (`/info` `max_input_length`, template included) is cut further, as Cohere does.

Long documents: Cohere v1's `max_chunks_per_doc` scores each document by chunks (at most that many; the library's
`max_chunks_per_document`), as Cohere v1 did, and both versions take radixserve's own fields `long_documents`
("truncate" or "chunk"), `chunk_tokens`, `chunk_overlap_tokens` and `pool` (README, "Long documents"); unset, the
server's defaults apply. A document scored by chunks has `best_span: [start, end]` in its result, the character
offsets of its best chunk.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from deployments.http.dialect import Dialect
from deployments.http.errors import ErrorKind
from deployments.http.service import Service
from radix_core.errors import FieldNames
from radix_core.tasks import RerankRequest, RerankResult

DOCUMENTS_PER_SEARCH_UNIT = 100
V1_NAMES: FieldNames = {"max_chunks_per_document": "max_chunks_per_doc"}  # the library's fields as v1 names them
V2_NAMES: FieldNames = {**V1_NAMES, "max_document_tokens": "max_tokens_per_doc"}  # and as v2 names them


class Document(BaseModel):
    text: str = Field(description="The document's text.")


class LongDocuments(BaseModel):
    """Cohere v1's `max_chunks_per_doc` and radixserve's fields for long documents, on both versions."""

    model_config = ConfigDict(strict=True)  # JSON types as sent: "2" is no integer, "yes" no boolean
    max_chunks_per_doc: int | None = Field(
        None, description="Score each document by chunks, at most this many (at least 1); unset: the server's "
                          "default.")
    long_documents: str | None = Field(
        None, description="radixserve: \"truncate\" or \"chunk\" (score long documents by chunks; implied by "
                          "max_chunks_per_doc); unset: the server's default.")
    chunk_tokens: int | None = Field(None, description="radixserve: most tokens of a document per chunk.")
    chunk_overlap_tokens: int | None = Field(None, description="radixserve: tokens neighbouring chunks share.")
    pool: str | None = Field(None, description="radixserve: a document's score from its chunks': max, mean, first.")

    def long_document_fields(self) -> dict[str, Any]:
        """The library's long-document fields; `max_chunks_per_doc` alone asks for chunks."""
        chunked = "chunk" if self.long_documents is None and self.max_chunks_per_doc is not None else None
        return {"long_documents": self.long_documents or chunked, "chunk_tokens": self.chunk_tokens,
                "chunk_overlap_tokens": self.chunk_overlap_tokens, "max_chunks_per_document": self.max_chunks_per_doc,
                "pool": self.pool}


class RerankV1Request(LongDocuments):
    model: str | None = Field(None, description="The served model's name (/info model_id); omitted: the served one.")
    query: str = Field(description="The query every document is scored against.")
    documents: list[str | Document] = Field(description="Documents as strings or {\"text\": ...} objects.")
    top_n: int | None = Field(None, description="Return only the best top_n documents (at least 1).")
    return_documents: bool = Field(False, description="Echo each document in the results.")


class RerankV2Request(LongDocuments):
    model: str | None = Field(None, description="The served model's name (/info model_id); omitted: the served one.")
    query: str = Field(description="The query every document is scored against.")
    documents: list[str] = Field(description="The documents to score.")
    top_n: int | None = Field(None, description="Return only the best top_n documents (at least 1).")
    max_tokens_per_doc: int | None = Field(
        None, description="Cut each document to this many of its own tokens (at least 1); unset: only to the "
                          "server's per-item limit.")


class ResultDocument(BaseModel):
    text: str


class RerankResultItem(BaseModel):
    index: int
    relevance_score: float
    document: ResultDocument | None = None
    best_span: list[int] | None = Field(None, description="[start, end) character offsets of the best chunk.")


class Tokens(BaseModel):
    input_tokens: int
    output_tokens: int
    computed_tokens: int
    cached_tokens: int


class BilledUnits(BaseModel):
    search_units: int


class ApiVersion(BaseModel):
    version: str


class Meta(BaseModel):
    api_version: ApiVersion
    billed_units: BilledUnits
    tokens: Tokens


class RerankV2Response(BaseModel):
    id: str
    results: list[RerankResultItem]
    meta: Meta


class JinaUsage(BaseModel):
    total_tokens: int
    prompt_tokens: int
    computed_tokens: int
    cached_tokens: int


class RerankV1Response(RerankV2Response):
    model: str
    usage: JinaUsage


class CohereDialect(Dialect):
    name = "cohere"

    def router(self, service: Service) -> APIRouter:
        router = APIRouter(tags=["Cohere / Jina"], dependencies=[Depends(service.authorize)])

        @router.post("/v1/rerank", responses={200: {"model": RerankV1Response}},
                     summary="Cohere v1 rerank (also Jina's rerank API)")
        async def rerank_v1(body: RerankV1Request):
            service.check_model(body.model)
            documents = [d if isinstance(d, str) else d.text for d in body.documents]
            result = await service.run(RerankRequest(body.query, documents, top_n=body.top_n,
                                                     return_documents=body.return_documents,
                                                     **body.long_document_fields()), V1_NAMES)
            return await service.respond(self._v1, result, len(documents), service.card.served_model_name,
                                         usage=result.usage)

        @router.post("/v2/rerank", responses={200: {"model": RerankV2Response}}, summary="Cohere v2 rerank")
        async def rerank_v2(body: RerankV2Request):
            service.check_model(body.model)
            result = await service.run(RerankRequest(body.query, body.documents, top_n=body.top_n,
                                                     max_document_tokens=body.max_tokens_per_doc,
                                                     **body.long_document_fields()), V2_NAMES)
            return await service.respond(self._v2, result, len(body.documents), usage=result.usage)

        return router

    def error_body(self, kind: ErrorKind, message: str) -> dict[str, Any]:
        return {"message": message}

    @staticmethod
    def _v2(result: RerankResult, num_documents: int, version: str = "2") -> dict[str, Any]:
        usage = result.usage
        results = [{"index": hit.index, "relevance_score": hit.score,
                    **({"document": {"text": hit.document}} if hit.document is not None else {}),
                    **({"best_span": list(hit.best_span)} if hit.best_span is not None else {})}
                   for hit in result.results]
        meta = {"api_version": {"version": version},
                "billed_units": {"search_units": -(-num_documents // DOCUMENTS_PER_SEARCH_UNIT)},
                "tokens": {"input_tokens": usage.input_tokens, "output_tokens": 0,
                           "computed_tokens": usage.computed_tokens, "cached_tokens": usage.cached_tokens}}
        return {"id": str(uuid.uuid4()), "results": results, "meta": meta}

    @classmethod
    def _v1(cls, result: RerankResult, num_documents: int, model: str) -> dict[str, Any]:
        usage = result.usage
        return {**cls._v2(result, num_documents, version="1"), "model": model,
                "usage": {"total_tokens": usage.input_tokens, "prompt_tokens": usage.input_tokens,
                          "computed_tokens": usage.computed_tokens, "cached_tokens": usage.cached_tokens}}
