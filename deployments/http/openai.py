"""OpenAI's embeddings API: `POST /v1/embeddings`, and `POST /embeddings` for a client whose base URL has no
`/v1` (as TEI serves both).

`input` is a string or a list of strings (token-id lists are refused: the server renders the model's prompt and
tokenizes text itself, so the ids would not be the sequence the model sees). `dimensions` keeps the first d
components, renormalised (Matryoshka, as the library's `embed(dimensions=...)`). `encoding_format: "base64"` (what
the `openai` SDK asks for unless told otherwise) is each vector's little-endian float32 bytes in base64, which the
SDK decodes; `"float"` is a JSON list. An input longer than the model's limit is refused (422 naming it and the
limit), as OpenAI refuses one over its context length, never silently cut. `usage.computed_tokens` adds the
tokens left after shared prefixes were computed once, `usage.cached_tokens` those read from the prefix cache.
Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`, which its SDK raises as
`BadRequestError`/`UnprocessableEntityError`, `AuthenticationError`, `NotFoundError`, `RateLimitError`, ...

Long documents: radixserve's own fields `long_documents` ("truncate", which here refuses an over-long input, or
"chunk"), `chunk_tokens`, `chunk_overlap_tokens`, `max_chunks_per_document` and `chunks` (README, "Long
documents"; unset, the server's defaults apply). With `chunks: "pooled"` an input still gets one embedding; with
`"each"`, `data` holds one item per chunk, its `index` the input's, and `span: [start, end]`, the chunk's character
offsets in it.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from deployments.http.dialect import Dialect
from deployments.http.errors import VALIDATION, ApiError, ErrorKind
from deployments.http.service import Service
from radix_core.errors import FieldNames
from radix_core.tasks import EmbedRequest, EmbedResult

NAMES: FieldNames = {"texts": "input"}  # the library's fields as OpenAI names them


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as sent: "2" is no integer, "yes" no boolean
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="A text or a list of texts (token-id lists are refused: send text).")
    model: str | None = Field(None, description="The served model's name (/info model_id); omitted: the served one.")
    dimensions: int | None = Field(None, description="Keep the first d components (1 to the hidden size).")
    encoding_format: Literal["float", "base64"] = Field("float", description="JSON floats or base64 float32 bytes.")
    user: str | None = Field(None, description="Accepted for compatibility; not used.")
    long_documents: str | None = Field(
        None, description="radixserve: \"truncate\" (refuse an input over the limit) or \"chunk\" (embed it by "
                          "chunks); unset: the server's default.")
    chunk_tokens: int | None = Field(None, description="radixserve: most tokens of an input per chunk.")
    chunk_overlap_tokens: int | None = Field(None, description="radixserve: tokens neighbouring chunks share.")
    max_chunks_per_document: int | None = Field(None, description="radixserve: most chunks per input.")
    chunks: str | None = Field(None, description="radixserve: \"pooled\" (one embedding per input) or \"each\" "
                                                 "(one per chunk, with its span).")


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str
    span: list[int] | None = Field(None, description="With chunks \"each\": the chunk's [start, end) offsets.")


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    computed_tokens: int
    cached_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class OpenAIDialect(Dialect):
    name = "openai"

    def router(self, service: Service) -> APIRouter:
        router = APIRouter(tags=["OpenAI"], dependencies=[Depends(service.authorize)])

        @router.post("/v1/embeddings", responses={200: {"model": EmbeddingsResponse}}, summary="OpenAI embeddings")
        @router.post("/embeddings", responses={200: {"model": EmbeddingsResponse}},
                     summary="OpenAI embeddings, for a base URL without /v1")
        async def embeddings(body: EmbeddingsRequest):
            service.check_model(body.model)
            texts = _texts(body.input)
            result = await service.run(EmbedRequest(
                texts, dimensions=body.dimensions, truncate=False, long_documents=body.long_documents,
                chunk_tokens=body.chunk_tokens, chunk_overlap_tokens=body.chunk_overlap_tokens,
                max_chunks_per_document=body.max_chunks_per_document, chunks=body.chunks), NAMES)
            return await service.respond(_response, result, body.encoding_format, service.card.served_model_name,
                                         usage=result.usage)

        return router

    def error_body(self, kind: ErrorKind, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind.name, "param": None, "code": kind.status}}


def _texts(value: str | list[str] | list[int] | list[list[int]]) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if any(not isinstance(text, str) for text in texts):
        raise ApiError(VALIDATION, "input holds token ids; this server tokenizes text itself (with the model's "
                                   "prompt template): send the texts as strings")
    return texts


def _response(result: EmbedResult, encoding_format: str, model: str) -> dict[str, Any]:
    vectors = result.embeddings  # (n, d) float32
    if encoding_format == "base64":
        rows = [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in vectors]
    else:
        rows = vectors.tolist()
    indices = range(len(rows)) if result.indices is None else result.indices.tolist()
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in zip(indices, rows)]
    if result.spans is not None:
        data = [{**item, "span": span} for item, span in zip(data, result.spans.tolist())]
    usage = result.usage
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": usage.input_tokens, "total_tokens": usage.input_tokens,
                      "computed_tokens": usage.computed_tokens, "cached_tokens": usage.cached_tokens}}
