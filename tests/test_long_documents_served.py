"""Long documents by chunks on every surface, through the served path: one local Ray + Serve application whose task
config scores long documents by chunks by default, called over gRPC (stubs, `ScoringClient`, the CLI) and HTTP
(Cohere v1 through its SDK with `max_chunks_per_doc`, Cohere v2 and OpenAI with radixserve's extra fields, and TEI,
which keeps TEI's truncation whatever the default). Answers equal the library's under the same config, best spans
included; a limit crossed names the field in each surface's own spelling."""

from __future__ import annotations

import json

import cohere
import grpc
import httpx
import numpy as np
import pytest
from serving import GrpcDeployment

from radix_core import Engine
from radix_core.tasks import TaskConfig
from radixserve import cli
from radixserve.client import ScoringClient, to_dict
from radixserve.v1 import scoring_pb2 as pb
from radixserve.v1.scoring_pb2_grpc import ScoringStub

QUERY = "what is a radix tree"
WORDS = "a radix tree stores strings by their shared prefixes and every node holds one edge label".split()
RNG = np.random.default_rng(0)
DOCS = [" ".join(RNG.choice(WORDS, n)) for n in (260, 90, 12)] + ["the end of a page 😀 " * 30]
TASKS = {"long_documents": "chunk", "chunk_tokens": 48, "chunk_overlap_tokens": 8, "max_chunks_per_document": 8,
         "max_items": 64}
TOL = 1e-5
pytestmark = [pytest.mark.serve, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> str:
    return str(tiny_model_dir("qwen3", "causal_lm"))


@pytest.fixture(scope="module")
def engine(model_dir) -> Engine:
    """The library under the served application's task config."""
    return Engine.from_pretrained(model_dir, device="cpu", tasks=TaskConfig(**TASKS))


@pytest.fixture(scope="module")
def app(model_dir, serve_cluster):
    served = GrpcDeployment(
        base={"model": model_dir, "tasks": TASKS, "placement": {"engine": {"cpus": 0.5}, "ingress": {"cpus": 0.5}}},
        configs={"chunking": {}}, probe=lambda channel: ScoringStub(channel).Info(pb.InfoRequest(), timeout=10))
    try:
        served.start(serve_cluster)
        yield served.use("chunking")
    finally:
        served.stop()


def spans(hits) -> dict[int, tuple[int, int]]:
    return {h.index: (h.best_span.start, h.best_span.end) for h in hits}


def assert_same_ranking(hits, local) -> None:
    assert [h.index for h in hits] == [h.index for h in local.results]
    np.testing.assert_allclose([h.score for h in hits], [h.score for h in local.results], atol=TOL)


def test_grpc_rerank_and_embed_by_chunks(app, engine):
    stub = ScoringStub(app.channel)
    reply = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, pool="mean", chunk_tokens=40), timeout=60)
    local = engine.rerank(QUERY, DOCS, pool="mean", chunk_tokens=40)
    assert_same_ranking(reply.results, local)
    assert spans(reply.results) == {h.index: h.best_span for h in local.results}
    assert (reply.usage.input_tokens, reply.usage.computed_tokens) == (local.usage.input_tokens,
                                                                       local.usage.computed_tokens)
    by_default = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS), timeout=60)  # the server's default
    assert spans(by_default.results) == {h.index: h.best_span for h in engine.rerank(QUERY, DOCS).results}
    cut = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, long_documents="truncate"), timeout=60)
    assert_same_ranking(cut.results, engine.rerank(QUERY, DOCS, long_documents="truncate"))
    assert not any(h.HasField("best_span") for h in cut.results)

    each = stub.Embed(pb.EmbedRequest(texts=DOCS, chunks="each", dimensions=16), timeout=60)
    local = engine.embed(DOCS, chunks="each", dimensions=16)
    np.testing.assert_allclose([list(e.values) for e in each.embeddings], local.embeddings, atol=TOL)
    assert [e.index for e in each.embeddings] == local.indices.tolist()
    assert [[e.span.start, e.span.end] for e in each.embeddings] == local.spans.tolist()
    pooled = stub.Embed(pb.EmbedRequest(texts=DOCS), timeout=60)
    np.testing.assert_allclose([list(e.values) for e in pooled.embeddings], engine.embed(DOCS).embeddings, atol=TOL)
    assert not any(e.HasField("span") for e in pooled.embeddings)


def test_client_and_cli(app, engine, capsys):
    with ScoringClient(app.address) as client:
        reply = to_dict(client.rerank(QUERY, DOCS, top_n=2, pool="first", chunk_overlap_tokens=0))
    local = engine.rerank(QUERY, DOCS, top_n=2, pool="first", chunk_overlap_tokens=0)
    assert [(h["index"], (h["best_span"]["start"], h["best_span"]["end"])) for h in reply["results"]] == \
           [(h.index, h.best_span) for h in local.results]
    documents = [arg for document in DOCS for arg in ("--document", document)]
    assert cli.main(["rerank", "--address", app.address, "--query", QUERY, *documents, "--long-documents", "chunk",
                     "--chunk-tokens", "64", "--max-chunks-per-document", "2", "--pool", "max"]) == 0
    printed = json.loads(capsys.readouterr().out)["results"]
    local = engine.rerank(QUERY, DOCS, chunk_tokens=64, max_chunks_per_document=2, pool="max")
    assert [(h["index"], tuple(h["best_span"].values())) for h in printed] == \
           [(h.index, h.best_span) for h in local.results]
    assert cli.main(["embed", "--address", app.address, "--text", DOCS[0], "--chunks", "each"]) == 0
    rows = json.loads(capsys.readouterr().out)["embeddings"]
    assert [row["span"] for row in rows] == [{"start": s, "end": e} for s, e in engine.embed(
        DOCS[:1], chunks="each").spans.tolist()]


def test_limits_name_the_field_on_each_surface(app):
    with pytest.raises(grpc.RpcError) as caught:
        ScoringStub(app.channel).Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, truncate=False,
                                                         max_chunks_per_document=2), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("max_chunks_per_document is 2, but document 0 needs")
    body = {"query": QUERY, "documents": DOCS, "max_chunks_per_doc": 200, "chunk_tokens": 8}  # > 64 in all
    reply = httpx.post(f"http://127.0.0.1:{app.http_port}/v1/rerank", json=body, timeout=60)
    assert reply.status_code == 422 and reply.json()["message"].startswith("max_chunks_per_doc lets the documents")
    reply = httpx.post(f"http://127.0.0.1:{app.http_port}/v1/embeddings", timeout=60,
                       json={"input": DOCS, "chunk_tokens": 16, "chunk_overlap_tokens": 16})
    assert reply.status_code == 422 and "chunk_overlap_tokens must be less than chunk_tokens (16)" in \
           reply.json()["error"]["message"]


def test_cohere_openai_and_tei_over_http(app, engine):
    url = f"http://127.0.0.1:{app.http_port}"
    v1 = cohere.Client(api_key="unused", base_url=url).rerank(query=QUERY, documents=DOCS, max_chunks_per_doc=3)
    local = engine.rerank(QUERY, DOCS, long_documents="chunk", max_chunks_per_document=3)
    assert_same_ranking([type("Hit", (), {"index": r.index, "score": r.relevance_score}) for r in v1.results], local)
    v2 = httpx.post(f"{url}/v2/rerank", json={"query": QUERY, "documents": DOCS, "pool": "mean",
                                               "chunk_tokens": 32, "max_tokens_per_doc": 100}, timeout=60).json()
    local = engine.rerank(QUERY, DOCS, pool="mean", chunk_tokens=32, max_document_tokens=100)
    assert [(r["index"], tuple(r["best_span"])) for r in v2["results"]] == [(h.index, h.best_span)
                                                                            for h in local.results]
    np.testing.assert_allclose([r["relevance_score"] for r in v2["results"]], [h.score for h in local.results],
                               atol=TOL)

    each = httpx.post(f"{url}/v1/embeddings", json={"input": DOCS[1:], "chunks": "each", "encoding_format": "float"},
                      timeout=60).json()["data"]  # OpenAI's inputs are never cut: DOCS[0] needs more than 8 chunks
    local = engine.embed(DOCS[1:], chunks="each", truncate=False)
    assert [(d["index"], d["span"]) for d in each] == list(zip(local.indices.tolist(), local.spans.tolist()))
    np.testing.assert_allclose([d["embedding"] for d in each], local.embeddings, atol=TOL)

    tei = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS, "truncate": True}, timeout=60).json()
    local = engine.rerank(QUERY, DOCS, long_documents="truncate")
    np.testing.assert_allclose(sorted(r["score"] for r in tei), sorted(h.score for h in local.results), atol=TOL)
    vectors = httpx.post(f"{url}/embed", json={"inputs": DOCS, "truncate": True}, timeout=60).json()
    np.testing.assert_allclose(vectors, engine.embed(DOCS, long_documents="truncate").embeddings, atol=TOL)
