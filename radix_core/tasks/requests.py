"""Whole requests for a serving front door: their routing prefix, their split into token-bounded sub-requests,
and the merge of the sub-requests' results back into one result.

A front door (the Ray Serve ingress) holds a `TaskContext` loaded without weights (`load_task_context`), hashes
`routing_prefix(...)` into the key that sends a request to one engine replica, cuts a large request with
`split_request(...)` into sub-requests that share that prefix, and joins their answers with `merge_results`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from radix_core.architectures import head_of, load_config, max_seq_len
from radix_core.tasks.common import TaskContext, Usage, check_items
from radix_core.tasks.config import TaskConfig
from radix_core.tasks.embed import EmbedResult
from radix_core.tasks.jobs import check_request
from radix_core.tasks.rerank import RerankResult, check_top_n
from radix_core.tasks.scoring import ClassifyResult, ContinuationScore, ScoreResult
from radix_core.tokenization import load_prompt_tokenizer

ITEMS = {"rerank": "documents", "embed": "texts", "classify": "inputs", "score": "continuations"}


def load_task_context(model: str, config: TaskConfig) -> TaskContext:
    """The `TaskContext` of `model` from its config and tokenizer alone: no weights are read."""
    hf_config = load_config(model)
    return TaskContext(model, hf_config.model_type, head_of(hf_config), hf_config.hidden_size, max_seq_len(hf_config),
                       load_prompt_tokenizer(model), config)


def routing_prefix(context: TaskContext, task: str, request: Mapping[str, Any]) -> str:
    """The text every sequence of the request starts with: template, instruction and query for rerank, the
    instruction for embed, the few-shot prefix for classify, the context for score."""
    check_request(task, request)
    if task == "rerank":
        return context.template("rerank").shared_prefix(request["query"], request.get("instruction"))
    if task == "embed":
        return context.template("embed").shared_prefix(request.get("instruction"))
    if task == "classify":
        return request.get("prefix", "")
    return request["context"]


def split_request(context: TaskContext, task: str, request: Mapping[str, Any],
                  max_tokens: int) -> list[tuple[dict[str, Any], int]]:
    """`(sub-request, estimated tokens)` pairs, each at most `max_tokens` unless a single item is larger; items
    keep their order. Token counts are estimates (item tokens plus the shared prefix per sequence); the engine
    enforces the exact per-sequence limit."""
    check_request(task, request)
    key = ITEMS[task]
    check_items(key, request[key], context.config.max_items)
    if task == "classify":  # tokenized for the estimate below, so checked first
        check_items("labels", request["labels"], context.config.max_items)
    if task == "rerank":  # lifted from the sub-requests below, so checked here
        check_top_n(request.get("top_n"))
    costs = _item_tokens(context, task, request)
    parts, chunk, chunk_tokens = [], [], 0
    for item, cost in zip(request[key], costs):
        if chunk and chunk_tokens + cost > max_tokens:
            parts.append((chunk, chunk_tokens))
            chunk, chunk_tokens = [], 0
        chunk.append(item)
        chunk_tokens += cost
    parts.append((chunk, chunk_tokens))
    unranked = {"top_n": None} if task == "rerank" else {}  # top_n applies to the merged ranking
    return [({**request, key: items, **unranked}, tokens) for items, tokens in parts]


def _item_tokens(context: TaskContext, task: str, request: Mapping[str, Any]) -> list[int]:
    """Estimated tokens each item brings: its own tokens plus the shared prefix, per sequence it makes."""
    tokenizer = context.prompt_tokenizer().tokenizer
    items = request[ITEMS[task]]
    prefix = len(tokenizer(routing_prefix(context, task, request), add_special_tokens=False).input_ids)
    lengths = [len(ids) for ids in tokenizer(list(items), add_special_tokens=False).input_ids]
    if task == "classify":
        labels = request["labels"]
        label_tokens = sum(len(ids) for ids in tokenizer(list(labels), add_special_tokens=False).input_ids)
        return [(prefix + n) * len(labels) + label_tokens for n in lengths]
    return [prefix + n for n in lengths]


def merge_results(task: str, request: Mapping[str, Any], results: Sequence[Any]):
    """One result from the sub-requests' results, as if the request had run whole."""
    usage = Usage(sum(r.usage.input_tokens for r in results), sum(r.usage.computed_tokens for r in results))
    if task == "rerank":
        return _merge_rerank(request, results, usage)
    if task == "embed":
        return EmbedResult(np.concatenate([r.embeddings for r in results]), usage)
    if task == "classify":
        return ClassifyResult(results[0].labels, np.concatenate([r.probabilities for r in results]), usage)
    return ScoreResult(_offset_scores(results), usage)


def _merge_rerank(request: Mapping[str, Any], results: Sequence[RerankResult], usage: Usage) -> RerankResult:
    hits, offset = [], 0
    for result in results:  # each sub-request ranks all its documents (top_n was lifted)
        hits += [replace(hit, index=hit.index + offset) for hit in result.results]
        offset += len(result.results)
    hits.sort(key=lambda hit: (-hit.score, hit.index))
    return RerankResult(hits[:request.get("top_n")], usage)


def _offset_scores(results: Sequence[ScoreResult]) -> list[ContinuationScore]:
    scores, offset = [], 0
    for result in results:
        scores += [replace(score, index=score.index + offset) for score in result.scores]
        offset += len(result.scores)
    return scores
