"""Hugging Face text-embeddings-inference (TEI) requests as the library's task requests, for both TEI transports: the
HTTP routes (`deployments.http.tei`) and the gRPC `tei.v1` calls (`deployments.grpc_api.tei`) read their messages
and hand TEI's fields to the functions here, so each TEI field is converted in one place:

    TEI                                            library
    rerank  query, texts, raw_scores, return_text  RerankRequest query, documents, raw_scores, return_documents
    embed   inputs, normalize, dimensions          EmbedRequest texts, normalize, dimensions
    predict inputs, raw_scores                     PredictRequest inputs, raw_scores
    truncate (TEI's default false)                 truncate; long_documents "truncate" (TEI never chunks)
    truncation_direction Right / Left (HTTP), TRUNCATION_DIRECTION_RIGHT / _LEFT (gRPC)   "right" / "left"
    prompt_name                                    refused by name: no named prompts (radixserve.v1 has instruction)
    tokenize inputs, add_special_tokens            `tokens`: as the tasks encode user text, bounded as their items
    decode  ids, skip_special_tokens               `decode`: the tokenizer's decode, of ids it has, bounded the same

The tables `*_NAMES` name the library's fields as each TEI request shape names them, for a task's error
(`RequestError.renamed`: `texts[1] is empty`, not the library's `documents[1]`). `tei_model_type` is TEI's
`model_type` of the model card's primary task, in the HTTP form and as the gRPC enum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deployments.model_card import ModelCard
from radix_core.errors import FieldName, FieldNames, RequestError
from radix_core.tasks import EmbedRequest, PredictRequest, RerankRequest, TaskContext
from radix_core.tasks.request import check_count, check_items
from radixserve.tei.v1 import tei_pb2 as tei

MODEL_TYPES = {"rerank": "reranker", "embed": "embedding", "classify": "classifier"}  # primary task -> TEI's name
RERANK_LABEL = "relevance"  # the label a reranker whose score head names none gets in TEI's answers
DIRECTIONS = {"Right": "right", "Left": "left",  # HTTP
              tei.TRUNCATION_DIRECTION_RIGHT: "right", tei.TRUNCATION_DIRECTION_LEFT: "left"}  # gRPC

RERANK_NAMES: FieldNames = {"documents": "texts"}
RERANK_STREAM_NAMES: FieldNames = {  # one (query, text) per message; a query's messages are one rerank
    "documents": FieldName("messages", item=lambda i: f"message {i} of its query")}
EMBED_NAMES: FieldNames = {"texts": "inputs"}
ONE_TEXT_EMBED_NAMES: FieldNames = {"texts": FieldName("inputs", item=lambda i: "inputs")}  # gRPC: one a message
ONE_INPUT_NAMES: FieldNames = {"inputs": FieldName("inputs", item=lambda i: "inputs")}  # gRPC Predict, Tokenize
ONE_PAIR_NAMES: FieldNames = {"query": FieldName("inputs", whole="inputs[0]"),  # gRPC PredictPair: [text, text_pair]
                              "documents": FieldName("inputs", item=lambda i: "inputs[1]")}
SIMILARITY_NAMES: FieldNames = {  # HTTP /similarity: the source sentence, then the sentences, in one embed
    "texts": FieldName("inputs", whole="inputs.sentences",
                       item=lambda i: "inputs.source_sentence" if i == 0 else f"inputs.sentences[{i - 1}]")}


def predict_names(positions: Sequence[int]) -> FieldNames:
    """HTTP /predict's texts, sent as one predict request: its `inputs[n]` is the client's `inputs[positions[n]]`."""
    return {"inputs": FieldName("inputs", item=lambda n: f"inputs[{positions[n]}]")}


def pair_names(positions: Sequence[int]) -> FieldNames:
    """HTTP /predict's [text, text_pair] pairs of one first text, sent as one rerank request: its query is the text
    of `inputs[positions[0]]` (`inputs[p][0]`), its `documents[n]` the text_pair of `inputs[positions[n]]`
    (`inputs[p][1]`)."""
    return {"query": FieldName("inputs", whole=f"inputs[{positions[0]}][0]"),
            "documents": FieldName("inputs", item=lambda n: f"inputs[{positions[n]}][1]")}


def rerank_request(query: str, texts: list[str], raw_scores: bool, return_text: bool, truncate: bool | None,
                   truncation_direction: str | int) -> RerankRequest:
    """The rerank request of a TEI rerank."""
    return RerankRequest(query, texts, raw_scores=raw_scores, return_documents=return_text,
                         **truncation(truncate, truncation_direction), long_documents="truncate")


def embed_request(inputs: list[str], normalize: bool | None, dimensions: int | None, truncate: bool | None,
                  truncation_direction: str | int, prompt_name: str | None) -> EmbedRequest:
    """The embed request of a TEI embed; `normalize` and `dimensions` None (unset) take the request's defaults. A
    `prompt_name` is refused."""
    check_prompt_name(prompt_name)
    optional = {name: value for name, value in (("normalize", normalize), ("dimensions", dimensions))
                if value is not None}
    return EmbedRequest(inputs, **optional, **truncation(truncate, truncation_direction), long_documents="truncate")


def predict_request(inputs: list[str], raw_scores: bool, truncate: bool | None,
                    truncation_direction: str | int) -> PredictRequest:
    """The predict request of a TEI predict of single texts."""
    return PredictRequest(inputs, raw_scores=raw_scores, **truncation(truncate, truncation_direction))


def check_prompt_name(prompt_name: str | None) -> None:
    """TEI's `prompt_name` (embed, tokenize) is refused: radixserve has no named prompts."""
    if prompt_name is not None:
        raise RequestError.about("prompt_name", f"{prompt_name[:40]!r} is not supported: radixserve has no named "
                                 "prompts", "leave it unset and put the prompt in inputs, or call radixserve.v1 "
                                 "Embed with an instruction")


def truncation(truncate: bool | None, truncation_direction: str | int) -> dict[str, Any]:
    """TEI's `truncate` (unset: false, as in TEI) and `truncation_direction` as the tasks' request fields."""
    if truncation_direction not in DIRECTIONS:
        raise RequestError.about("truncation_direction", f"{truncation_direction!r} is unknown",
                                 "send Right or Left (TRUNCATION_DIRECTION_RIGHT or _LEFT over gRPC)")
    return {"truncate": bool(truncate), "truncation_direction": DIRECTIONS[truncation_direction]}


def tei_model_type(card: ModelCard) -> dict[str, dict[str, Any]]:
    """HTTP `/info`'s `model_type`: `{"reranker": {id2label, label2id}}`, `{"embedding": {"pooling": ...}}` or
    `{"classifier": {id2label, label2id}}`."""
    kind = MODEL_TYPES[card.primary_task]
    if kind == "embedding":
        return {kind: {"pooling": "last_token"}}
    labels = [rerank_label(card)] if kind == "reranker" else list(card.labels)
    return {kind: {"id2label": {str(i): label for i, label in enumerate(labels)},
                   "label2id": {label: i for i, label in enumerate(labels)}}}


def tei_model_type_pb(primary_task: str) -> int:
    """gRPC `InfoResponse.model_type` of the primary task."""
    return tei.ModelType.Value(f"MODEL_TYPE_{MODEL_TYPES[primary_task].upper()}")


def rerank_label(card: ModelCard) -> str:
    """The label of a reranker's one score: its score head's, else `RERANK_LABEL`."""
    return card.labels[0] if len(card.labels) == 1 else RERANK_LABEL


def tokens(context: TaskContext, texts: list[str], add_special_tokens: bool,
           prompt_name: str | None) -> list[list[dict[str, Any]]]:
    """Each text's tokens `{id, text, special, start, stop}` as the tasks encode user text (special-token literals
    plain unless the config trusts them), bounded as the tasks bound their items: at most max_items texts of at most
    the per-item token limit (a RequestError names the text and the limit)."""
    check_prompt_name(prompt_name)
    check_items("inputs", texts, context.config.max_items)
    prompts = context.prompt_tokenizer()
    encodings = prompts.encode_user(texts, add_special_tokens, context.token_limit, field="inputs",
                                    trust=context.config.special_tokens_in_user_text)
    special = set(prompts.tokenizer.all_special_ids)
    out = []
    for text, encoding in zip(texts, encodings):
        out.append([{"id": i, "text": piece if i in special else text[start:stop], "special": i in special,
                     "start": None if i in special else start, "stop": None if i in special else stop}
                    for i, piece, (start, stop) in zip(encoding.ids, encoding.tokens, encoding.offsets)])
    return out


def decode(context: TaskContext, sequences: list[list[int]], skip_special_tokens: bool,
           one: bool = False) -> list[str]:
    """Each sequence of token ids as the tokenizer decodes it: at most max_items sequences of at most the per-item
    token limit, every id one the tokenizer has (a RequestError names the sequence: `ids[i]`, or `ids` when `one`
    was sent)."""
    check_count("ids", len(sequences), context.config.max_items)
    tokenizer = context.prompt_tokenizer().tokenizer
    vocabulary, limit = len(tokenizer), context.token_limit
    for i, ids in enumerate(sequences):
        index = None if one else i
        if len(ids) > limit:
            raise RequestError.about("ids", f"has {len(ids)} ids, over the limit of {limit} per item",
                                     "decode fewer at once", index=index, limit=limit)
        unknown = next((token for token in ids if not 0 <= token < vocabulary), None)
        if unknown is not None:
            raise RequestError.about("ids", f"holds {unknown}, which is no token id of the model's tokenizer "
                                     f"(0 to {vocabulary - 1})", "send ids /tokenize gave", index=index)
    return tokenizer.batch_decode(sequences, skip_special_tokens=skip_special_tokens)
