"""The prefix cache as the server runs it (issue 23): scoped by API key, exact, counted.

Without a cluster: a call whose key passes gets its key's digest as its cache scope (`deployments.auth`), the same
on every ingress (same keys), never the key itself, and none when the operator shares the cache or runs without
keys; a refused call gets none. On the shared serve cluster (marked `serve`; one engine replica, API keys, the
default cache): a repeated prompt is read from the cache (`usage.cached_tokens`) with the same answer as its first,
computed, run; another key's first request of that prompt reads nothing; the HTTP face keeps the same scopes; the
replica's cache counters move by what the answers report; with `prefix_cache_scope: shared` a key reads what another
filled, and the redeployed replica starts cold; requests that read a cached prompt share a batch whose budget holds
only one of them whole.
"""

from __future__ import annotations

import contextvars

import grpc
import httpx
import numpy as np
import pytest
from ray import serve
from serving import GrpcDeployment, held_compute, wait_for

from deployments.auth import SCOPE_DIGEST_BYTES, ApiKeys, cache_scope
from deployments.http.service import CACHED_TOKENS_HEADER
from radix_core.engine import Engine
from radix_core.tasks import RerankRequest, task_for
from radixserve.v1 import scoring_pb2 as pb
from radixserve.v1.scoring_pb2_grpc import ScoringStub

KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"
PROMPT = " ".join(f"Example {i}: the radix tree stores shared prefixes once, label positive." for i in range(12))
INPUTS = ["a trie keeps common prefixes together", "bread rises in a warm oven", "tokens share their history"]
TOL = 1e-5  # float32: the cached rows are the very values the first run computed
TIGHT_BATCH_TOKENS = 4096  # a batch budget that holds one request of the doubled prompt whole, not two


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


def checked(keys: ApiKeys, key: str | None) -> tuple[str | None, str | None]:
    """(refusal, cache scope) of a call presenting `key`, in a fresh context of its own, as each call has."""
    def call():
        return keys.refusal(bearer(key) if key else []), cache_scope()
    return contextvars.Context().run(call)


# --- the scope of a call (no cluster) -----------------------------------------------------------------------------

def test_each_key_gets_a_digest_of_its_own_as_its_cache_scope():
    keys, before = ApiKeys([KEY_A, KEY_B]), cache_scope()
    (refusal_a, scope_a), (refusal_b, scope_b) = checked(keys, KEY_A), checked(keys, KEY_B)
    assert refusal_a is refusal_b is None
    assert scope_a != scope_b and len(scope_a) == len(scope_b) == 2 * SCOPE_DIGEST_BYTES
    assert int(scope_a, 16) >= 0 and KEY_A not in scope_a
    assert checked(ApiKeys([KEY_B, KEY_A]), KEY_A)[1] == scope_a  # another ingress, the same keys: the same scope
    assert checked(ApiKeys([KEY_A, "another-key"]), KEY_A)[1] != scope_a  # keyed with the set of keys
    assert cache_scope() == before  # the calls' scopes stayed in their own contexts


def test_no_scope_for_a_shared_cache_no_keys_or_a_refused_call():
    assert checked(ApiKeys([KEY_A], prefix_cache_scope="shared"), KEY_A) == (None, None)
    assert checked(ApiKeys(), None) == (None, None)  # auth off: one tenant
    assert checked(ApiKeys([KEY_A]), "a-wrong-key") == ("invalid API key", None)
    refusal, scope = checked(ApiKeys([KEY_A]), None)
    assert refusal.startswith("missing API key") and scope is None


# --- served ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def app(tiny_model_dir, serve_cluster, tmp_path_factory):
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys"
    keys_file.write_text(f"{KEY_A}\n{KEY_B}\n")
    base = {"model": str(tiny_model_dir("qwen3", "causal_lm")), "auth": {"api_keys_file": str(keys_file)}}
    configs = {"key": {}, "shared": {"auth": {"prefix_cache_scope": "shared"}},
               "tight": {"batching": {"max_batch_tokens": TIGHT_BATCH_TOKENS, "batch_wait_timeout_s": 0.5},
                         "limits": {"max_request_tokens": TIGHT_BATCH_TOKENS}}}
    served = GrpcDeployment(base=base, configs=configs,
                            probe=lambda channel: ScoringStub(channel).Info(pb.InfoRequest(), timeout=10),
                            keyed=frozenset(configs))
    try:
        served.start(serve_cluster)
        yield served
    finally:
        served.stop()


def classify_request(prompt: str) -> pb.ClassifyRequest:
    return pb.ClassifyRequest(inputs=INPUTS, labels=["positive", "negative"], prefix=prompt,
                              template="\nInput: {input}\nLabel:")


def classify(app, key: str, prompt: str = PROMPT) -> pb.ClassifyResponse:
    return ScoringStub(app.channel).Classify(classify_request(prompt), timeout=60, metadata=bearer(key))


def probabilities(reply: pb.ClassifyResponse) -> np.ndarray:
    return np.array([list(row.probabilities) for row in reply.results])


def engine_info() -> dict:
    """The (one) engine replica's facts, through the ingress's `info`."""
    return serve.get_app_handle("radixserve").info.remote().result(timeout_s=30)


@pytest.mark.serve
@pytest.mark.timeout(300)
def test_a_repeated_prompt_is_read_from_the_cache_with_the_same_answer(app):
    app.use("key")
    first, second = classify(app, KEY_A, "Repeated. " + PROMPT), classify(app, KEY_A, "Repeated. " + PROMPT)
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens > 0 and second.usage.computed_tokens < first.usage.computed_tokens
    assert second.usage.input_tokens == first.usage.input_tokens
    np.testing.assert_allclose(probabilities(second), probabilities(first), atol=TOL)
    assert [r.label for r in second.results] == [r.label for r in first.results]


@pytest.mark.serve
@pytest.mark.timeout(300)
def test_another_key_never_reads_what_one_key_cached(app):
    app.use("key")
    prompt = "Tenants. " + PROMPT
    classify(app, KEY_A, prompt)
    assert classify(app, KEY_A, prompt).usage.cached_tokens > 0
    first_b = classify(app, KEY_B, prompt)
    assert first_b.usage.cached_tokens == 0  # its own scope: nothing of A's
    assert classify(app, KEY_B, prompt).usage.cached_tokens > 0  # then B's own


@pytest.mark.serve
@pytest.mark.timeout(300)
def test_http_keeps_the_scope_of_the_key(app):
    app.use("key")
    documents = ["a radix tree shares prefixes", "ovens bake bread", "a trie is a prefix tree"]
    body = {"query": "which passage is about prefix trees? " + PROMPT[:200], "documents": documents}

    def rerank(key: str) -> httpx.Response:
        reply = httpx.post(f"http://127.0.0.1:{app.http_port}/v2/rerank", json=body, timeout=60,
                           headers={"authorization": f"Bearer {key}"})
        assert reply.status_code == 200, reply.text
        return reply

    rerank(KEY_A)
    again = rerank(KEY_A)
    cached = again.json()["meta"]["tokens"]["cached_tokens"]
    assert cached > 0 and again.headers[CACHED_TOKENS_HEADER] == str(cached)
    assert rerank(KEY_B).json()["meta"]["tokens"]["cached_tokens"] == 0


@pytest.mark.serve
@pytest.mark.timeout(300)
def test_the_replica_counts_what_the_answers_read_from_its_cache(app):
    app.use("key")
    prompt = "Counted. " + PROMPT
    classify(app, KEY_A, prompt)
    before = engine_info()
    reply = classify(app, KEY_A, prompt)
    after = engine_info()
    read = reply.usage.cached_tokens
    assert read > 0
    assert after["prefix_cache"]["hit_tokens"] - before["prefix_cache"]["hit_tokens"] == read
    assert after["prefix_cache"]["lookup_tokens"] - before["prefix_cache"]["lookup_tokens"] == reply.usage.input_tokens
    assert after["cached_tokens"] - before["cached_tokens"] == read
    assert after["computed_tokens"] - before["computed_tokens"] == reply.usage.computed_tokens
    assert after["input_tokens"] - before["input_tokens"] == reply.usage.input_tokens
    assert 0 < after["prefix_cache"]["bytes"] <= after["prefix_cache"]["budget_bytes"] == after["prefix_cache_bytes"]


@pytest.mark.serve
@pytest.mark.timeout(300)
def test_documents_that_open_alike_are_cached_once_a_second_request_sends_them(app, tiny_model_dir):
    """Rows below a request's prompt and query that only its own documents share (their first sentence) stay out
    of the replica's cache (`PrefixCache`'s second request); the same documents sent by a second request enter it,
    and a third request reads them all."""
    app.use("key")
    opening = "Opening. The Great Barrier Reef is the largest coral reef system in the world. "
    documents = [opening + f"Fact number {i}." for i in range(4)] + ["Bread is baked in an oven."]
    query = "facts about the reef"
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "causal_lm")), device="cpu", prefix_cache_bytes=0)
    request = RerankRequest(query=query, documents=documents)
    sequences = task_for(request).encode(engine.context, request).sequences.tolists()
    common = next(p for p in range(min(map(len, sequences))) if len({tuple(s[:p + 1]) for s in sequences}) > 1)
    rows = len({tuple(s[:p + 1]) for s in sequences for p in range(len(s))})  # the request's distinct rows

    def inserted_by_a_request() -> tuple[int, pb.RerankResponse]:
        before = engine_info()["prefix_cache"]["inserted_tokens"]
        reply = ScoringStub(app.channel).Rerank(pb.RerankRequest(query=query, documents=documents), timeout=60,
                                                metadata=bearer(KEY_A))
        return engine_info()["prefix_cache"]["inserted_tokens"] - before, reply

    first, reply = inserted_by_a_request()
    assert reply.usage.input_tokens == sum(map(len, sequences))  # the server encodes as this engine does
    read = reply.usage.cached_tokens // len(documents)  # a part of the template, cached by an earlier test
    assert first == common - read  # the prompt and query, not the opening four documents share
    second, _ = inserted_by_a_request()
    assert second == rows - common
    third, reply = inserted_by_a_request()
    assert third == 0 and reply.usage.computed_tokens == 0


@pytest.mark.serve
@pytest.mark.timeout(300)
def test_a_shared_scope_lets_keys_read_each_others_prompts_and_a_new_replica_starts_cold(app):
    app.use("shared")  # a redeployment: new replicas, whose caches start empty
    prompt = "Repeated. " + PROMPT  # cached for KEY_A by the first test's replica
    assert classify(app, KEY_A, prompt).usage.cached_tokens == 0
    assert classify(app, KEY_B, prompt).usage.cached_tokens > 0
    with pytest.raises(grpc.RpcError) as refused:  # sharing the cache does not open the door
        classify(app, "not-a-key", prompt)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.serve
@pytest.mark.timeout(300)
def test_requests_that_read_a_cached_prompt_share_a_batch_their_whole_tokens_would_not_fit(app):
    """The replica budgets a batch in what it computes: a request's input tokens less its prompt's cached rows.
    Four requests of ~3,000 tokens behind one cached prompt, sent while the replica's compute thread is busy (so
    that they all queue, however fast the machine answers each), run together under a 4,096-token budget."""
    app.use("tight")
    prompt = "Batched. " + PROMPT * 2
    first = classify(app, KEY_A, prompt)
    assert TIGHT_BATCH_TOKENS / 2 < first.usage.input_tokens <= TIGHT_BATCH_TOKENS  # two whole would not fit
    before = engine_info()["batcher"]
    stub = ScoringStub(app.channel)
    with held_compute() as ongoing:
        calls = [stub.Classify.future(classify_request(prompt), timeout=60, metadata=bearer(KEY_A)) for _ in range(4)]
        wait_for(lambda: ongoing() >= 4, 30, "the four requests reaching the replica")
    replies = [call.result() for call in calls]
    after = engine_info()["batcher"]
    assert all(reply.usage.cached_tokens > 0 for reply in replies)
    for reply in replies:
        np.testing.assert_allclose(probabilities(reply), probabilities(first), atol=TOL)
    assert after["num_items"] - before["num_items"] == 4
    assert after["num_batches"] - before["num_batches"] <= 2, (before, after)  # one by one before: 4 batches
