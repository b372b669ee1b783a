"""Hugging Face text-embeddings-inference's HTTP API (what `tei-client`'s `HttpClient` and TEI's own clients call).

    POST /rerank    {query, texts, raw_scores, return_text, truncate, truncation_direction} -> [{index, score, text?}]
    POST /embed     {inputs, normalize, truncate, truncation_direction, prompt_name, dimensions} -> [[float]]
    POST /predict   {inputs: [text, text_pair] or a list of them, raw_scores, truncate} -> [{label, score}] each
    POST /tokenize  {inputs, add_special_tokens} -> per input [{id, text, special, start, stop}]
    GET  /info      the model, its `model_type` ({"reranker"|"embedding"|"classifier": metadata}) and limits
    GET  /health    200 when an engine replica answers, else 503

`/info` and `/health` need no API key. `model_type` is the model card's primary task (`deployments.model_card`):
rerank -> reranker, embed -> embedding, classify -> classifier; every route works whatever it says.

`/predict` scores [text, text_pair] pairs with the rerank task (the pairs of one text are one request, so they share
its prefix): a cross-encoder's single logit (sigmoid unless raw_scores) or a causal-LM reranker's P(yes), labelled
with the score head's one label (else "relevance"). A single text, or a model whose score head has several labels,
is refused with 422: radixserve computes no multi-label classification head; few-shot classification over labels
is radixserve.v1's Classify. `truncation_direction: "Left"` and `prompt_name` are refused with 422 (the library
cuts the end of a text and has no named prompts; send an `instruction` through radixserve.v1 instead). `truncate`
defaults to false, as in TEI: a text over the per-item limit is a 422. Errors are TEI's `{"error", "error_type"}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, Field

from deployments.http.dialect import Dialect
from deployments.http.errors import UNHEALTHY, VALIDATION, ApiError, ErrorKind
from deployments.http.service import Service
from deployments.model_card import ModelCard
from radix_core.tasks import RerankResult, Usage
from radix_core.tasks.base import check_items

HEALTH_TIMEOUT_S = 5.0  # /health answers 503 when no engine replica answers within this
MODEL_TYPES = {"rerank": "reranker", "embed": "embedding", "classify": "classifier"}
RERANK_LABEL = "relevance"  # the label /predict gives a reranker whose score head names none


class RerankRequest(BaseModel):
    query: str = Field(description="The query every text is scored against.")
    texts: list[str] = Field(description="The texts to score.")
    raw_scores: bool = Field(False, description="The raw relevance logit instead of a probability.")
    return_text: bool = Field(False, description="Echo each text in the results.")
    truncate: bool | None = Field(False, description="Cut texts over the per-item limit (false: 422).")
    truncation_direction: Literal["Left", "Right"] = Field("Right", description="Only Right: cut the end.")


class RankItem(BaseModel):
    index: int
    score: float
    text: str | None = None


class EmbedRequest(BaseModel):
    inputs: str | list[str] = Field(description="A text or a list of texts.")
    normalize: bool = Field(True, description="Scale each vector to unit L2 norm.")
    truncate: bool | None = Field(False, description="Cut texts over the per-item limit (false: 422).")
    truncation_direction: Literal["Left", "Right"] = Field("Right", description="Only Right: cut the end.")
    prompt_name: str | None = Field(None, description="Not supported: leave it out.")
    dimensions: int | None = Field(None, description="Keep the first d components (1 to the hidden size).")


class PredictRequest(BaseModel):
    inputs: str | list[str] | list[str | list[str]] = Field(
        description="A [text, text_pair] pair, or a list of pairs.")
    raw_scores: bool = Field(False, description="The raw logit instead of a probability.")
    truncate: bool | None = Field(False, description="Cut texts over the per-item limit (false: 422).")
    truncation_direction: Literal["Left", "Right"] = Field("Right", description="Only Right: cut the end.")


class Prediction(BaseModel):
    label: str
    score: float


class TokenizeRequest(BaseModel):
    inputs: str | list[str] = Field(description="A text or a list of texts.")
    add_special_tokens: bool = Field(True, description="Add the tokenizer's own special tokens (BOS, EOS).")
    prompt_name: str | None = Field(None, description="Not supported: leave it out.")


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class Info(BaseModel):
    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict[str, dict[str, Any]]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int | None
    version: str
    sha: str | None
    docker_label: str | None


class TeiDialect(Dialect):
    name = "tei"

    def router(self, service: Service) -> APIRouter:
        router = APIRouter(tags=["Text Embeddings Inference"])
        keyed = {"dependencies": [Depends(service.authorize)]}

        @router.post("/rerank", responses={200: {"model": list[RankItem]}}, summary="TEI rerank", **keyed)
        async def rerank(body: RerankRequest):
            _check_unsupported(body.truncation_direction)
            result = await service.run("rerank", {"query": body.query, "documents": body.texts,
                                                  "raw_scores": body.raw_scores, "return_documents": body.return_text,
                                                  "truncate": bool(body.truncate)},
                                       renames={"documents": "texts", "document": "text"})
            return await service.respond(_ranks, result, usage=result.usage)

        @router.post("/embed", responses={200: {"model": list[list[float]]}}, summary="TEI embed", **keyed)
        async def embed(body: EmbedRequest):
            _check_unsupported(body.truncation_direction, body.prompt_name)
            texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
            result = await service.run("embed", {"texts": texts, "normalize": body.normalize,
                                                 "dimensions": body.dimensions, "truncate": bool(body.truncate)},
                                       renames={"texts": "inputs", "text": "input"})
            return await service.respond(lambda: result.embeddings.tolist(), usage=result.usage)

        @router.post("/predict", responses={200: {"model": list[list[Prediction]]}},
                     summary="TEI predict: [text, text_pair] pairs scored by the reranker", **keyed)
        async def predict(body: PredictRequest):
            _check_unsupported(body.truncation_direction)
            single, pairs = _pairs(body.inputs)
            results = await _score_pairs(service, pairs, body.raw_scores, bool(body.truncate))
            label = _rerank_label(service.card)
            scores = [[{"label": label, "score": score}] for score in results[0]]
            return await service.respond(lambda: scores[0] if single else scores, usage=results[1])

        @router.post("/tokenize", responses={200: {"model": list[list[Token]]}}, summary="TEI tokenize", **keyed)
        async def tokenize(body: TokenizeRequest):
            _check_unsupported("Right", body.prompt_name)
            texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
            try:
                check_items("inputs", texts, service.scorer.context.config.max_items)
            except ValueError as err:
                raise ApiError(VALIDATION, str(err)) from None
            tokenizer = service.scorer.context.prompt_tokenizer().tokenizer
            return await service.respond(_tokens, tokenizer, texts, body.add_special_tokens)

        @router.get("/info", response_model=Info, summary="TEI info: the model, its type and limits")
        async def info():
            return _info(service, await service.scorer.info())

        @router.get("/health", summary="200 when an engine replica answers, else 503")
        async def health():
            try:
                await asyncio.wait_for(service.scorer.info(), HEALTH_TIMEOUT_S)
            except Exception as err:  # any failure means not serving; the reason is in the message
                raise ApiError(UNHEALTHY, f"the engine did not answer within {HEALTH_TIMEOUT_S} s "
                                          f"({type(err).__name__}): it is starting, restarting or failed") from None
            return Response(status_code=200)

        return router

    def error_body(self, kind: ErrorKind, message: str) -> dict[str, Any]:
        return {"error": message, "error_type": kind.name}


def tei_model_type(card: ModelCard) -> dict[str, dict[str, Any]]:
    """TEI's `model_type`: `{"reranker": {id2label, label2id}}`, `{"embedding": {"pooling": ...}}` or
    `{"classifier": {id2label, label2id}}`."""
    kind = MODEL_TYPES[card.primary_task]
    if kind == "embedding":
        return {kind: {"pooling": "last_token"}}
    labels = [_rerank_label(card)] if kind == "reranker" else list(card.labels)
    return {kind: {"id2label": {str(i): label for i, label in enumerate(labels)},
                   "label2id": {label: i for i, label in enumerate(labels)}}}


def _info(service: Service, info: dict[str, Any]) -> dict[str, Any]:
    args = service.scorer.args
    return {"model_id": service.card.served_model_name, "model_sha": None, "model_dtype": info["dtype"],
            "model_type": tei_model_type(service.card), "max_concurrent_requests": args.ingress_max_ongoing_requests,
            "max_input_length": info["max_tokens_per_item"], "max_batch_tokens": info["max_batch_tokens"],
            "max_batch_requests": None, "max_client_batch_size": info["max_items"], "auto_truncate": False,
            "tokenization_workers": None, "version": info["version"], "sha": None, "docker_label": None}


def _check_unsupported(truncation_direction: str, prompt_name: str | None = None) -> None:
    if truncation_direction != "Right":
        raise ApiError(VALIDATION, f"truncation_direction {truncation_direction!r} is not supported: this server "
                                   "cuts the end of a text; send \"Right\" or leave it out")
    if prompt_name is not None:
        raise ApiError(VALIDATION, "prompt_name is not supported: this server has no named prompts; leave it out "
                                   "(radixserve.v1 Embed takes an instruction)")


def _ranks(result: RerankResult) -> list[dict[str, Any]]:
    return [{"index": hit.index, "score": hit.score, **({"text": hit.document} if hit.document is not None else {})}
            for hit in result.results]


def _pairs(inputs: str | list) -> tuple[bool, list[tuple[str, str]]]:
    """(whether one input was sent, the [text, text_pair] pairs); a lone text is refused."""
    if isinstance(inputs, str) or (len(inputs) == 2 and all(isinstance(x, str) for x in inputs)):
        single, items = True, [inputs]
    else:
        single, items = False, inputs
    if not items:
        raise ApiError(VALIDATION, "inputs is empty: give at least one [text, text_pair] pair")
    for i, item in enumerate(items):
        if isinstance(item, str) or len(item) != 2:
            raise ApiError(VALIDATION, f"inputs[{i}] is not a [text, text_pair] pair: /predict scores pairs with "
                                       "the reranker; this server has no single-text classification head")
    return single, [tuple(item) for item in items]


async def _score_pairs(service: Service, pairs: Sequence[tuple[str, str]], raw_scores: bool,
                       truncate: bool) -> tuple[list[float], Usage]:
    """The score of each pair, in order: one rerank request per distinct first text, all at once."""
    by_query: dict[str, list[int]] = {}
    for i, (query, _) in enumerate(pairs):
        by_query.setdefault(query, []).append(i)
    results = await asyncio.gather(*(
        service.run("rerank", {"query": query, "documents": [pairs[i][1] for i in indices],
                               "raw_scores": raw_scores, "truncate": truncate},
                    renames={"query": "inputs text", "documents": "inputs text_pair"})
        for query, indices in by_query.items()))
    scores = [0.0] * len(pairs)
    for indices, result in zip(by_query.values(), results):
        for hit in result.results:
            scores[indices[hit.index]] = hit.score
    return scores, Usage.total([r.usage for r in results])


def _rerank_label(card: ModelCard) -> str:
    return card.labels[0] if len(card.labels) == 1 else RERANK_LABEL


def _tokens(tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
    encoded = tokenizer(texts, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    special = set(tokenizer.all_special_ids)
    out = []
    for text, ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"]):
        pieces = tokenizer.convert_ids_to_tokens(ids)
        out.append([{"id": i, "text": piece if i in special else text[start:stop], "special": i in special,
                     "start": None if i in special else start, "stop": None if i in special else stop}
                    for i, piece, (start, stop) in zip(ids, pieces, offsets)])
    return out
