"""Whole requests for the front door: routing prefix, token-bounded split, and merging back to one result."""

import numpy as np
import pytest

from radix_core import Engine
from radix_core.tasks import load_task_context, merge_results, routing_prefix, split_request

DOCS = [f"document {i} says {'many words ' * (i % 4)}about tries" for i in range(9)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Engine.from_pretrained(str(tiny_model_dir("qwen3", "causal_lm")), device="cpu")


def run_split(engine, task, request, max_tokens):
    parts = split_request(engine.context, task, request, max_tokens)
    method = getattr(engine, task)
    return parts, merge_results(task, request, [method(**sub) for sub, _ in parts])


def test_context_without_weights_matches_the_engine(engine):
    light = load_task_context(engine.model, engine.task_config)
    full = engine.context
    assert (light.family, light.head, light.hidden_size, light.max_seq_len) == \
           (full.family, full.head, full.hidden_size, full.max_seq_len)


def test_routing_prefix_is_shared_by_one_query_only(engine):
    a = routing_prefix(engine.context, "rerank", {"query": "q1", "documents": ["x"]})
    b = routing_prefix(engine.context, "rerank", {"query": "q1", "documents": ["y", "z"]})
    c = routing_prefix(engine.context, "rerank", {"query": "q2", "documents": ["x"]})
    assert a == b != c and "q1" in a
    assert routing_prefix(engine.context, "score", {"context": "ctx", "continuations": ["a"]}) == "ctx"
    assert routing_prefix(engine.context, "classify", {"inputs": ["i"], "labels": ["l"], "prefix": "P"}) == "P"


def test_split_rerank_merges_to_the_whole_ranking(engine):
    request = {"query": "what is a trie", "documents": DOCS, "top_n": 4}
    parts, merged = run_split(engine, "rerank", request, max_tokens=150)
    assert len(parts) > 2 and all(tokens <= 150 or len(sub["documents"]) == 1 for sub, tokens in parts)
    assert [d for sub, _ in parts for d in sub["documents"]] == DOCS  # order kept, nothing dropped
    whole = engine.rerank(**request)
    assert [h.index for h in merged.results] == [h.index for h in whole.results]
    np.testing.assert_allclose([h.score for h in merged.results], [h.score for h in whole.results], atol=1e-5)
    assert merged.usage.input_tokens == whole.usage.input_tokens


def test_split_embed_classify_score_merge_to_the_whole(engine):
    _, embedded = run_split(engine, "embed", {"texts": DOCS}, max_tokens=40)
    np.testing.assert_allclose(embedded.embeddings, engine.embed(DOCS).embeddings, atol=1e-5)
    request = {"inputs": DOCS[:5], "labels": ["yes", "no"], "prefix": "Relevant? "}
    _, classified = run_split(engine, "classify", request, max_tokens=60)
    np.testing.assert_allclose(classified.probabilities, engine.classify(**request).probabilities, atol=1e-5)
    _, scored = run_split(engine, "score", {"context": "A trie is", "continuations": DOCS[:4]}, max_tokens=30)
    whole = engine.score("A trie is", DOCS[:4]).scores
    assert [s.index for s in scored.scores] == [0, 1, 2, 3]
    np.testing.assert_allclose([s.logprob for s in scored.scores], [s.logprob for s in whole], atol=1e-5)


def test_split_checks_the_request_first(engine):
    with pytest.raises(ValueError, match="documents is empty"):
        split_request(engine.context, "rerank", {"query": "q", "documents": []}, 100)
    with pytest.raises(ValueError, match="unknown task 'summarize'"):
        split_request(engine.context, "summarize", {}, 100)
    with pytest.raises(ValueError, match="labels is empty"):  # not an IndexError from tokenizing no labels
        split_request(engine.context, "classify", {"inputs": ["i"], "labels": []}, 100)
    with pytest.raises(ValueError, match="top_n must be at least 1, got 0"):  # sub-requests do not see top_n
        split_request(engine.context, "rerank", {"query": "q", "documents": ["d"], "top_n": 0}, 100)
