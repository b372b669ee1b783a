"""Whole requests for the front door: the shared ids a routing key hashes, the token-bounded split, and merging
the parts back to one result equal to the request run whole."""

import numpy as np
import pytest

from radix_core import Engine
from radix_core.tasks import TASKS, load_task_context

DOCS = [f"document {i} says {'many words ' * (i % 4)}about tries" for i in range(9)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Engine.from_pretrained(str(tiny_model_dir("qwen3", "causal_lm")), device="cpu")


def run_split(engine, task_name, request, max_tokens):
    """(parts, merged result) of `request` split at `max_tokens`, each part run as a batch of its own."""
    task = TASKS[task_name]
    job = task.encode(engine.context, request)
    parts = task.split(job, max_tokens)
    return parts, task.merge(job, [partial for part in parts for partial in engine.run_jobs([part])])


def shared_ids(engine, task, request) -> list[int]:
    return TASKS[task].encode(engine.context, request).shared_ids.tolist()


def test_context_without_weights_matches_the_engine(engine):
    light = load_task_context(engine.model, engine.task_config)
    full = engine.context
    assert (light.family, light.head, light.hidden_size, light.max_seq_len) == \
           (full.family, full.head, full.hidden_size, full.max_seq_len)


def test_shared_ids_are_those_of_one_query_only(engine):
    a = shared_ids(engine, "rerank", {"query": "q1", "documents": ["x"]})
    b = shared_ids(engine, "rerank", {"query": "q1", "documents": ["y", "z"]})
    c = shared_ids(engine, "rerank", {"query": "q2", "documents": ["x"]})
    assert a == b != c and len(a) > 20
    score = shared_ids(engine, "score", {"context": "ctx\nmore", "continuations": ["a"]})
    assert score == shared_ids(engine, "score", {"context": "ctx\nmore", "continuations": ["b", " c d"]})
    few_shot = {"labels": [" yes", " no"], "prefix": "Examples\nReview:"}
    assert shared_ids(engine, "classify", {"inputs": ["input one"], **few_shot}) == \
           shared_ids(engine, "classify", {"inputs": ["other", "inputs"], **few_shot}) != []


def test_split_rerank_merges_to_the_whole_ranking(engine):
    request = {"query": "what is a trie", "documents": DOCS, "top_n": 4, "return_documents": True}
    parts, merged = run_split(engine, "rerank", request, max_tokens=150)
    assert len(parts) > 2 and all(p.num_tokens <= 150 or len(p.sequences) == 1 for p in parts)
    assert sum(len(p.sequences) for p in parts) == len(DOCS)  # nothing dropped
    whole = engine.rerank(**request)
    assert [(h.index, h.document) for h in merged.results] == [(h.index, h.document) for h in whole.results]
    np.testing.assert_allclose([h.score for h in merged.results], [h.score for h in whole.results], atol=1e-5)
    assert merged.usage.input_tokens == whole.usage.input_tokens


def test_split_embed_classify_score_merge_to_the_whole(engine):
    _, embedded = run_split(engine, "embed", {"texts": DOCS}, max_tokens=40)
    np.testing.assert_allclose(embedded.embeddings, engine.embed(DOCS).embeddings, atol=1e-5)
    request = {"inputs": DOCS[:5], "labels": ["yes", "no"], "prefix": "Relevant? "}
    parts, classified = run_split(engine, "classify", request, max_tokens=60)
    assert len(parts) > 1
    np.testing.assert_allclose(classified.probabilities, engine.classify(**request).probabilities, atol=1e-5)
    parts, scored = run_split(engine, "score", {"context": "A trie is", "continuations": DOCS[:4]}, max_tokens=30)
    assert len(parts) > 1
    whole = engine.score("A trie is", DOCS[:4]).scores
    assert [s.index for s in scored.scores] == [0, 1, 2, 3]
    np.testing.assert_allclose([s.logprob for s in scored.scores], [s.logprob for s in whole], atol=1e-5)


def test_a_part_never_exceeds_the_bound_unless_one_item_does(engine):
    job = TASKS["embed"].encode(engine.context, {"texts": DOCS})
    for bound in (1, 17, 40, 10_000):
        parts = TASKS["embed"].split(job, bound)
        assert [s for p in parts for s in p.sequences.tolists()] == job.sequences.tolists()
        assert all(p.num_tokens <= bound or len(p.sequences) == 1 for p in parts)


def test_prefix_key_is_equal_for_one_query_and_differs_across_queries(engine):
    from deployments.request_path import prefix_key

    def key(task, request):
        return prefix_key(TASKS[task].encode(engine.context, request))

    one = key("rerank", {"query": "what is a trie", "documents": DOCS[:2]})
    assert one == key("rerank", {"query": "what is a trie", "documents": DOCS[5:]})
    assert one != key("rerank", {"query": "what is a heap", "documents": DOCS[:2]})
    assert key("embed", {"texts": DOCS[:2]}) is None  # no shared ids: placed by load alone
    assert key("embed", {"texts": DOCS[:2], "instruction": "Find"}) == key("embed", {"texts": ["x"],
                                                                                     "instruction": "Find"})
