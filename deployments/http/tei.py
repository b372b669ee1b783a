"""Hugging Face text-embeddings-inference's HTTP API (what `tei-client`'s `HttpClient` and TEI's own clients call).

    POST /rerank    {query, texts, raw_scores, return_text, truncate, truncation_direction} -> [{index, score, text?}]
    POST /embed     {inputs, normalize, truncate, truncation_direction, prompt_name, dimensions} -> [[float]]
    POST /predict   {inputs: a text, a [text, text_pair] pair, or a list of them, raw_scores, truncate,
                     truncation_direction} -> [{label, score}] each, best first
    POST /similarity {inputs: {source_sentence, sentences}, parameters: {truncate, truncation_direction}}
                    -> the cosine similarity of each sentence's embedding to the source sentence's
    POST /tokenize  {inputs, add_special_tokens} -> per input [{id, text, special, start, stop}]
    POST /decode    {ids: ids or a list of them, skip_special_tokens} -> [text] (one per list of ids)
    POST /          the route of the model's type: /rerank (reranker), /embed (embedding), /predict (classifier);
    POST /invocations  the same (SageMaker's name for it)
    GET  /info      the model, its `model_type` ({"reranker"|"embedding"|"classifier": metadata}) and limits
    GET  /health    200 when an engine replica answers, else 503; also GET / and GET /ping, as in TEI

`/info` and the health routes need no API key. `model_type` is the model card's primary task (`deployments.tei`):
rerank -> reranker, embed -> embedding, classify -> classifier; it picks what `POST /` does (where Hugging Face's
`InferenceClient(base_url=...)` sends `feature_extraction` and `text_classification`), and every named route works
whatever it says. TEI's fields become the tasks' requests in `deployments.tei`, shared with the gRPC API, as do the
tables naming a task's error in TEI's fields.

`/predict` classifies each text with the predict task (the model's sequence-classification labels, best first) and
scores each [text, text_pair] pair with the rerank task (the pairs of one text are one request, so they share its
prefix): a cross-encoder's single logit (sigmoid unless raw_scores) or a causal-LM reranker's P(yes), labelled with
the score head's one label (else "relevance"). Its texts and pairs together are at most `max_client_batch_size`
(`tasks.max_items`), as are `/tokenize`'s inputs; `/tokenize` has no truncate, as in TEI, so an input over
`max_input_length` tokens is a 422 naming it and the limit. `prompt_name` is refused with 422 (no named prompts;
send an `instruction` through radixserve.v1 instead). `truncate` defaults to false, as in TEI: a text over the
per-item limit is a 422. `/similarity` embeds the source sentence and the sentences in one embed request, so
they are at most `max_items` together, and answers each sentence's cosine similarity to the source, as TEI does.
Errors are TEI's `{"error", "error_type"}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field

from deployments import tei as tei_fields
from deployments.http.dialect import Dialect
from deployments.http.errors import UNHEALTHY, ApiError, ErrorKind
from deployments.http.service import Service
from radix_core.errors import RequestError
from radix_core.tasks import PredictResult, RerankResult, Usage
from radix_core.tasks.request import check_count

HEALTH_TIMEOUT_S = 5.0  # /health answers 503 when no engine replica answers within this


class RerankRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as sent: "2" is no integer, "yes" no boolean
    query: str = Field(description="The query every text is scored against.")
    texts: list[str] = Field(description="The texts to score.")
    raw_scores: bool = Field(False, description="The raw relevance logit instead of a probability.")
    return_text: bool = Field(False, description="Echo each text in the results.")
    truncate: bool | None = Field(False, description="Cut texts over the per-item limit (false: 422).")
    truncation_direction: Literal["Left", "Right"] = Field(
        "Right", description="The side of a text truncation cuts: Right its end, Left its start.")


class RankItem(BaseModel):
    index: int
    score: float
    text: str | None = None


class EmbedRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as sent: "2" is no integer, "yes" no boolean
    inputs: str | list[str] = Field(description="A text or a list of texts.")
    normalize: bool = Field(True, description="Scale each vector to unit L2 norm.")
    truncate: bool | None = Field(False, description="Cut texts over the per-item limit (false: 422).")
    truncation_direction: Literal["Left", "Right"] = Field(
        "Right", description="The side of a text truncation cuts: Right its end, Left its start.")
    prompt_name: str | None = Field(None, description="Not supported: leave it out.")
    dimensions: int | None = Field(None, description="Keep the first d components (1 to the hidden size).")


class PredictRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as sent: "2" is no integer, "yes" no boolean
    inputs: str | list[str] | list[str | list[str]] = Field(
        description="A text, a [text, text_pair] pair, or a list of texts and pairs.")
    raw_scores: bool = Field(False, description="The raw logit instead of a probability.")
    truncate: bool | None = Field(False, description="Cut texts over the per-item limit (false: 422).")
    truncation_direction: Literal["Left", "Right"] = Field(
        "Right", description="The side of a text truncation cuts: Right its end, Left its start.")


class SimilarityInput(BaseModel):
    model_config = ConfigDict(strict=True)
    source_sentence: str = Field(description="The text every sentence is compared with.")
    sentences: list[str] = Field(description="The texts to compare with the source sentence.")


class SimilarityParameters(BaseModel):
    model_config = ConfigDict(strict=True)
    truncate: bool | None = Field(False, description="Cut texts over the per-item limit (false: 422).")
    truncation_direction: Literal["Left", "Right"] = Field(
        "Right", description="The side of a text truncation cuts: Right its end, Left its start.")
    prompt_name: str | None = Field(None, description="Not supported: leave it out.")


class SimilarityRequest(BaseModel):
    model_config = ConfigDict(strict=True)
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class Prediction(BaseModel):
    label: str
    score: float


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as sent: "2" is no integer, "yes" no boolean
    inputs: str | list[str] = Field(description="A text or a list of texts.")
    add_special_tokens: bool = Field(True, description="Add the tokenizer's own special tokens (BOS, EOS).")
    prompt_name: str | None = Field(None, description="Not supported: leave it out.")


class DecodeRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as sent: "2" is no integer, "yes" no boolean
    ids: list[int] | list[list[int]] = Field(description="Token ids, or a list of lists of them.")
    skip_special_tokens: bool = Field(True, description="Leave the tokenizer's special tokens out of the text.")


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
            request = tei_fields.rerank_request(body.query, body.texts, body.raw_scores, body.return_text,
                                                body.truncate, body.truncation_direction)
            result = await service.run(request, tei_fields.RERANK_NAMES)
            return await service.respond(_ranks, result, usage=result.usage)

        @router.post("/embed", responses={200: {"model": list[list[float]]}}, summary="TEI embed", **keyed)
        async def embed(body: EmbedRequest):
            texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
            request = tei_fields.embed_request(texts, body.normalize, body.dimensions, body.truncate,
                                               body.truncation_direction, body.prompt_name)
            result = await service.run(request, tei_fields.EMBED_NAMES)
            return await service.respond(lambda: result.embeddings.tolist(), usage=result.usage)

        @router.post("/predict", responses={200: {"model": list[list[Prediction]]}},
                     summary="TEI predict: texts by the model's labels, [text, text_pair] pairs by the reranker",
                     **keyed)
        async def predict(body: PredictRequest):
            single, items = _predict_inputs(body.inputs, service.scorer.context.config.max_items)
            rows, usage = await _predict(service, items, body)
            return await service.respond(lambda: rows[0] if single else rows, usage=usage)

        @router.post("/similarity", responses={200: {"model": list[float]}},
                     summary="TEI similarity: cosine of each sentence's embedding to the source sentence's", **keyed)
        async def similarity(body: SimilarityRequest):
            if not body.inputs.sentences:
                raise RequestError.about("inputs.sentences", "is empty", "give at least one sentence to compare")
            # the source sentence is embedded with them, in one request of at most max_items texts
            check_count("inputs.sentences", len(body.inputs.sentences), service.scorer.context.config.max_items - 1)
            rows = [body.inputs.source_sentence, *body.inputs.sentences]
            parameters = body.parameters or SimilarityParameters()
            request = tei_fields.embed_request(rows, True, None, parameters.truncate,  # unit vectors: cosine = dot
                                               parameters.truncation_direction, parameters.prompt_name)
            result = await service.run(request, tei_fields.SIMILARITY_NAMES)
            return await service.respond(_cosines, result.embeddings, usage=result.usage)

        @router.post("/tokenize", responses={200: {"model": list[list[Token]]}}, summary="TEI tokenize", **keyed)
        async def tokenize(body: TokenizeRequest):
            texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
            tokens = await asyncio.to_thread(tei_fields.tokens, service.scorer.context, texts,
                                             body.add_special_tokens, body.prompt_name)
            return await service.respond(lambda: tokens)

        @router.post("/decode", responses={200: {"model": list[str]}}, summary="TEI decode", **keyed)
        async def decode(body: DecodeRequest):
            one = not body.ids or isinstance(body.ids[0], int)
            sequences = [body.ids] if one else body.ids
            texts = await asyncio.to_thread(tei_fields.decode, service.scorer.context, sequences,
                                            body.skip_special_tokens, one=one)
            return await service.respond(lambda: texts)

        @router.get("/info", response_model=Info, summary="TEI info: the model, its type and limits", **keyed)
        async def info():
            return _info(service, await service.scorer.info())

        @router.get("/health", summary="200 when an engine replica answers, else 503")
        @router.get("/ping", summary="/health under SageMaker's name")
        @router.get("/", summary="/health, where TEI answers it too")
        async def health():
            try:
                await asyncio.wait_for(service.scorer.info(), HEALTH_TIMEOUT_S)
            except Exception as err:  # any failure means not serving; the reason is in the message
                raise ApiError(UNHEALTHY, f"the engine did not answer within {HEALTH_TIMEOUT_S} s "
                                          f"({type(err).__name__}): it is starting, restarting or failed") from None
            return Response(status_code=200)

        default, answers = {"rerank": (rerank, list[RankItem]), "embed": (embed, list[list[float]]),
                            "classify": (predict, list[list[Prediction]])}[service.card.primary_task]
        kind = tei_fields.MODEL_TYPES[service.card.primary_task]
        for path in ("/", "/invocations"):  # TEI's default route, and SageMaker's name for it
            router.add_api_route(path, default, methods=["POST"], responses={200: {"model": answers}},
                                 summary=f"TEI's default route: /{default.__name__} (the model is a {kind})", **keyed)
        return router

    def error_body(self, kind: ErrorKind, message: str) -> dict[str, Any]:
        return {"error": message, "error_type": kind.name}


def _info(service: Service, info: dict[str, Any]) -> dict[str, Any]:
    args = service.scorer.args
    return {"model_id": service.card.served_model_name, "model_sha": None, "model_dtype": info["dtype"],
            "model_type": tei_fields.tei_model_type(service.card),
            "max_concurrent_requests": args.placement.ingress.max_ongoing_requests,
            "max_input_length": info["max_tokens_per_item"], "max_batch_tokens": info["max_batch_tokens"],
            "max_batch_requests": None, "max_client_batch_size": info["max_items"], "auto_truncate": False,
            "tokenization_workers": None, "version": info["version"], "sha": None, "docker_label": None}


def _ranks(result: RerankResult) -> list[dict[str, Any]]:
    return [{"index": hit.index, "score": hit.score, **({"text": hit.document} if hit.document is not None else {})}
            for hit in result.results]


def _cosines(unit: np.ndarray) -> list[float]:
    """The cosine similarity of each unit vector after the first to the first. (S + 1, D) -> S"""
    unit = unit.astype(np.float64)
    return (unit[1:] @ unit[0]).tolist()


def _predict_inputs(inputs: str | list, max_items: int) -> tuple[bool, list[str | tuple[str, str]]]:
    """(whether one input was sent, the texts and [text, text_pair] pairs). As in TEI, a list of two strings is
    one pair. Texts and pairs together are at most `max_items`: the pairs of each first text are a rerank call
    of their own, so the calls' item limits alone would let many distinct first texts through."""
    if isinstance(inputs, str) or (len(inputs) == 2 and all(isinstance(x, str) for x in inputs)):
        single, items = True, [inputs]
    else:
        single, items = False, inputs
    if not items:
        raise RequestError.about("inputs", "is empty", "give at least one text or [text, text_pair] pair")
    check_count("inputs", len(items), max_items)
    for i, item in enumerate(items):
        if not isinstance(item, str) and len(item) != 2:
            raise RequestError.about("inputs", f"has {len(item)} texts", "give a text or a [text, text_pair] pair",
                                     index=i)
    return single, [item if isinstance(item, str) else tuple(item) for item in items]


async def _predict(service: Service, items: Sequence[str | tuple[str, str]],
                   body: PredictRequest) -> tuple[list[list[dict[str, Any]]], Usage]:
    """Each item's [{label, score}], in order: the pairs in one rerank request per distinct first text and the texts
    in one predict request, all at once; an error names the item the client sent (`pair_names`,
    `predict_names`)."""
    texts = [i for i, item in enumerate(items) if isinstance(item, str)]
    by_query: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        if not isinstance(item, str):
            by_query.setdefault(item[0], []).append(i)
    requests = [tei_fields.rerank_request(query, [items[i][1] for i in indices], body.raw_scores, False,
                                          body.truncate, body.truncation_direction)
                for query, indices in by_query.items()]
    names = [tei_fields.pair_names(indices) for indices in by_query.values()]
    if texts:
        requests.append(tei_fields.predict_request([items[i] for i in texts], body.raw_scores, body.truncate,
                                                   body.truncation_direction))
        names.append(tei_fields.predict_names(texts))
    results = await service.run_all(requests, names)
    rows: list[list[dict[str, Any]]] = [[] for _ in items]
    label = tei_fields.rerank_label(service.card)
    for indices, result in zip(by_query.values(), results):
        for hit in result.results:
            rows[indices[hit.index]] = [{"label": label, "score": hit.score}]
    if texts:
        predicted: PredictResult = results[-1]
        for i, scores in zip(texts, predicted.results):
            rows[i] = [{"label": hit.label, "score": hit.score} for hit in scores]
    return rows, Usage.total([result.usage for result in results])
