"""A hybrid model served end to end: a tiny Qwen3.5 reranker (Gated DeltaNet + gated attention, the Qwen3-Reranker
prompt) on the shared serve cluster answers rerank, embed, classify and score over gRPC and HTTP (Cohere v2, OpenAI
embeddings) as the library does; the replica's prefix cache holds its recurrent state, so the repeated query reads
the prompt from the cache."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from serving import GrpcDeployment

from radix_core import Engine
from radixserve.v1 import scoring_pb2 as pb
from radixserve.v1.scoring_pb2_grpc import ScoringStub

QUERY = "what is a radix tree"
DOCS = ["a radix tree stores strings by their shared prefixes", "bread rises in a warm oven",
        "every node of a trie holds one edge label", "a radix tree stores strings"]
TOL = 1e-5
pytestmark = [pytest.mark.serve, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> str:
    return str(tiny_model_dir("qwen3_5", "causal_lm"))


@pytest.fixture(scope="module")
def app(model_dir, serve_cluster):
    served = GrpcDeployment(
        base={"model": model_dir, "placement": {"engine": {"cpus": 0.5}, "ingress": {"cpus": 0.5}}},
        configs={"hybrid": {}}, probe=lambda channel: ScoringStub(channel).Info(pb.InfoRequest(), timeout=10))
    try:
        served.start(serve_cluster)
        yield served.use("hybrid")
    finally:
        served.stop()


def test_rerank_over_grpc_and_http_equals_the_library(app, model_dir):
    local = Engine.from_pretrained(model_dir, device="cpu").rerank(QUERY, DOCS)
    want_index, want_score = [h.index for h in local.results], [h.score for h in local.results]
    for _ in range(2):  # the second reads the template and query from the replica's prefix cache
        grpc_reply = ScoringStub(app.channel).Rerank(pb.RerankRequest(query=QUERY, documents=DOCS), timeout=60)
        assert [h.index for h in grpc_reply.results] == want_index
        np.testing.assert_allclose([h.score for h in grpc_reply.results], want_score, atol=TOL)
    assert grpc_reply.usage.cached_tokens > 0
    http_reply = httpx.post(f"http://127.0.0.1:{app.http_port}/v2/rerank", json={"query": QUERY, "documents": DOCS},
                            timeout=60).json()
    assert [r["index"] for r in http_reply["results"]] == want_index
    np.testing.assert_allclose([r["relevance_score"] for r in http_reply["results"]], want_score, atol=TOL)


def test_embed_classify_and_score_over_grpc_and_http_equal_the_library(app, model_dir):
    local = Engine.from_pretrained(model_dir, device="cpu")
    stub = ScoringStub(app.channel)
    texts = DOCS[:3]
    want = local.embed(texts).embeddings
    grpc_embed = stub.Embed(pb.EmbedRequest(texts=texts), timeout=60)
    np.testing.assert_allclose([list(e.values) for e in grpc_embed.embeddings], want, atol=TOL)
    http_embed = httpx.post(f"http://127.0.0.1:{app.http_port}/v1/embeddings",
                            json={"input": texts, "encoding_format": "float"}, timeout=60).json()
    np.testing.assert_allclose([d["embedding"] for d in http_embed["data"]], want, atol=TOL)
    labels = ["yes", "no"]
    classified = stub.Classify(pb.ClassifyRequest(inputs=texts, labels=labels), timeout=60)
    np.testing.assert_allclose([list(c.probabilities) for c in classified.results],
                               local.classify(texts, labels).probabilities, atol=TOL)
    scored = stub.Score(pb.ScoreRequest(context=QUERY, continuations=texts), timeout=60)
    want_logprobs = [s.logprob for s in local.score(QUERY, texts).scores]
    np.testing.assert_allclose([s.logprob for s in scored.scores], want_logprobs, atol=1e-4)
