"""TEI's gRPC API (tei.v1) end to end on a local Ray: Ray Serve's gRPC proxy with serve_config.yaml's servicers, the
application built from a tiny model. The real `tei-client` GrpcClient (in a subprocess: its stubs and ours both
define tei.v1 in protobuf's default pool) reranks, embeds, tokenizes, decodes and reads Info, and gets the
library's answers; plain grpcio calls cover the streams, Predict and PredictPair, left truncation, the dispatch by
message type and the status codes. Four configurations are deployed in turn (the tiny causal LM's default primary
task rerank, primary_task embed, keyed, and a tiny sequence-classification model for Predict); each test asks for
the one it needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from serving import GrpcDeployment

import radixserve
from radix_core import Engine
from radixserve.tei.v1 import tei_pb2 as tei
from radixserve.tei.v1 import tei_pb2_grpc
from radixserve.v1 import scoring_pb2 as pb
from radixserve.v1.scoring_pb2_grpc import ScoringStub

DOCS = [f"passage {i}: a radix tree stores strings by shared prefixes, {'and more ' * i}" for i in range(6)]
QUERY = "what is a radix tree"
MAX_ITEMS = 8
MAX_REQUEST_BYTES = 65536
KEY = "tei-key"
pytestmark = [pytest.mark.serve, pytest.mark.slow]  # each model its own deployment: 80 s of the suite

# Runs tei-client's GrpcClient: argv[1] the address, argv[2] a JSON list of [method, kwargs]; prints one JSON
# answer per call, or {"error": ...} with the exception's type and message.
TEI_CLIENT = """
import json, sys
from tei_client import GrpcClient

client = GrpcClient(sys.argv[1])
answers = []
for method, kwargs in json.loads(sys.argv[2]):
    try:
        if method == "info":
            answers.append(client.info().model_dump(mode="json", by_alias=True))
        elif method == "rerank":
            answers.append([rank.model_dump() for rank in client.rerank(**kwargs).ranks])
        elif method == "tokenize":
            answers.append([[token.model_dump() for token in result.tokens] for result in client.tokenize(**kwargs)])
        elif method == "decode":
            answers.append(client.decode(**kwargs))
        else:
            answers.append([list(vector) for vector in client.embed(**kwargs)])
    except Exception as err:
        answers.append({"error": f"{type(err).__name__}: {err}"})
print(json.dumps(answers))
"""


class Deployment(GrpcDeployment):
    """The reranker, embedder, keyed and classifier configurations of one local Ray + Serve with the gRPC proxy."""

    def __init__(self, model_dir: str, classifier_dir: str, keys_file: Path):
        super().__init__(
            base={"model": model_dir, "tasks": {"max_items": MAX_ITEMS},
                  "limits": {"max_request_bytes": MAX_REQUEST_BYTES},
                  "placement": {"engine": {"cpus": 0.5}, "ingress": {"cpus": 0.5}}},
            configs={"rerank": {}, "embed": {"primary_task": "embed"},
                     "keyed": {"auth": {"api_keys_file": str(keys_file)}},
                     "classifier": {"model": classifier_dir}},
            probe=lambda channel: tei_pb2_grpc.InfoStub(channel).Info(tei.InfoRequest(), timeout=10),
            keyed=frozenset({"keyed"}))

    def stub(self, service: str):
        return getattr(tei_pb2_grpc, f"{service}Stub")(self.channel)

    def tei_client(self, calls: list[tuple[str, dict]]) -> list:
        """The answers of tei-client's GrpcClient to `calls`, run in a subprocess."""
        done = subprocess.run([sys.executable, "-c", TEI_CLIENT, self.address, json.dumps(calls)],
                              capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> str:
    return str(tiny_model_dir("qwen3", "causal_lm"))


@pytest.fixture(scope="module")
def classifier_dir(tiny_model_dir) -> str:
    return str(tiny_model_dir("qwen3", "seq_cls"))


@pytest.fixture(scope="module")
def deployment(model_dir, classifier_dir, tmp_path_factory, serve_cluster):
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys"
    keys_file.write_text(KEY + "\n")
    served = Deployment(model_dir, classifier_dir, keys_file)
    try:
        served.start(serve_cluster)
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def engine(model_dir) -> Engine:
    return Engine.from_pretrained(model_dir, device="cpu")


def assert_ranks_equal(ranks, local, texts: bool = False) -> None:
    """TEI ranks (dicts or `Rank` messages) are the library's hits: same order, scores within 1e-5."""
    ranks = [r if isinstance(r, dict) else {"index": r.index, "score": r.score, "text": r.text} for r in ranks]
    assert [r["index"] for r in ranks] == [h.index for h in local.results]
    np.testing.assert_allclose([r["score"] for r in ranks], [h.score for h in local.results], atol=1e-5)
    if texts:
        assert [r["text"] for r in ranks] == [h.document for h in local.results]


@pytest.mark.timeout(180)
def test_tei_client_reranks_and_reads_info_on_a_reranker(deployment, engine, model_dir):
    info, ranks, raw, embed = deployment.use("rerank").tei_client([
        ("info", {}), ("rerank", {"query": QUERY, "texts": DOCS, "return_text": True}),
        ("rerank", {"query": QUERY, "texts": DOCS[:3], "raw_scores": True}), ("embed", {"text": DOCS[0]})])
    assert "error" not in info, info
    assert (info["model_type"], info["model_id"], info["version"]) == ("reranker", Path(model_dir).name,
                                                                       radixserve.__version__)
    assert (info["max_client_batch_size"], info["model_dtype"]) == (MAX_ITEMS, "float32")
    assert info["max_input_length"] > 0 and info["max_batch_tokens"] > 0
    assert_ranks_equal(ranks, engine.rerank(QUERY, DOCS, return_documents=True), texts=True)
    assert_ranks_equal(raw, engine.rerank(QUERY, DOCS[:3], raw_scores=True))
    assert "Embedding model required" in embed["error"]  # tei-client embeds only on an embedding model


@pytest.mark.timeout(180)
def test_tei_client_embeds_on_an_embedding_model(deployment, engine):
    # (tei-client 0.2.4's proto predates TEI's `optional` normalize, so its normalize=False never reaches a server;
    # the grpcio test below sends it)
    info, vectors, rerank = deployment.use("embed").tei_client([
        ("info", {}), ("embed", {"text": DOCS}), ("rerank", {"query": QUERY, "texts": DOCS})])
    assert info["model_type"] == "embedding"
    np.testing.assert_allclose(vectors, engine.embed(DOCS).embeddings, atol=1e-5)
    assert "Reranker model required" in rerank["error"]
    # every task stays callable whatever model_type says
    reply = deployment.stub("Rerank").Rerank(tei.RerankRequest(query=QUERY, texts=DOCS[:2]), timeout=60)
    assert_ranks_equal(reply.ranks, engine.rerank(QUERY, DOCS[:2]))


@pytest.mark.timeout(180)
def test_unary_calls_and_streams_return_what_the_library_returns(deployment, engine):
    rerank, embed = deployment.use("rerank").stub("Rerank"), deployment.stub("Embed")
    reply = rerank.Rerank(tei.RerankRequest(query=QUERY, texts=DOCS, return_text=True), timeout=60)
    local = engine.rerank(QUERY, DOCS, return_documents=True)
    assert_ranks_equal(reply.ranks, local, texts=True)
    assert reply.metadata.compute_tokens == local.usage.input_tokens and reply.metadata.total_time_ns > 0

    reply = rerank.RerankStream(iter([tei.RerankStreamRequest(query=QUERY, text=doc) for doc in DOCS]), timeout=60)
    assert_ranks_equal(reply.ranks, engine.rerank(QUERY, DOCS))
    assert not any(rank.HasField("text") for rank in reply.ranks)

    # two queries in one stream: each message scored against its own query, all ranked together
    pairs = [("what is a trie", DOCS[0]), (QUERY, DOCS[1]), ("what is a trie", DOCS[2])]
    reply = rerank.RerankStream(iter([tei.RerankStreamRequest(query=q, text=t, return_text=True) for q, t in pairs]),
                                timeout=60)
    scores = {i: engine.rerank(q, [t]).results[0].score for i, (q, t) in enumerate(pairs)}
    assert [r.index for r in reply.ranks] == sorted(scores, key=lambda i: -scores[i])
    np.testing.assert_allclose([r.score for r in reply.ranks], [scores[r.index] for r in reply.ranks], atol=1e-5)
    assert [r.text for r in reply.ranks] == [pairs[r.index][1] for r in reply.ranks]

    reply = embed.Embed(tei.EmbedRequest(inputs=DOCS[0], dimensions=16), timeout=60)
    np.testing.assert_allclose(reply.embeddings, engine.embed(DOCS[:1], dimensions=16).embeddings[0], atol=1e-5)
    replies = list(embed.EmbedStream(iter([tei.EmbedRequest(inputs=doc, normalize=False) for doc in DOCS]),
                                     timeout=60))
    np.testing.assert_allclose([list(r.embeddings) for r in replies], engine.embed(DOCS, normalize=False).embeddings,
                               atol=1e-5)

    # truncation from the left, as the library cuts
    long = "the start of a long text, " + TOO_LONG + "and its very end"
    reply = rerank.Rerank(tei.RerankRequest(query=QUERY, texts=[DOCS[0], long], truncate=True,
                                            truncation_direction=tei.TRUNCATION_DIRECTION_LEFT), timeout=60)
    assert_ranks_equal(reply.ranks, engine.rerank(QUERY, [DOCS[0], long], truncation_direction="left"))
    reply = embed.Embed(tei.EmbedRequest(inputs=long, truncate=True,
                                         truncation_direction=tei.TRUNCATION_DIRECTION_LEFT), timeout=60)
    np.testing.assert_allclose(reply.embeddings, engine.embed([long], truncation_direction="left").embeddings[0],
                               atol=1e-5)

    # the same method names, radixserve.v1's messages: answered by radixserve.v1
    scoring = ScoringStub(deployment.channel)
    reply = scoring.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS[:2]), timeout=60)
    assert [h.index for h in reply.results] == [h.index for h in engine.rerank(QUERY, DOCS[:2]).results]
    assert scoring.Info(pb.InfoRequest(), timeout=30).limits.max_items == MAX_ITEMS


TOO_LONG = "radix " * 3000  # over the tiny models' 2048-token limit
BAD_INPUTS = {
    "empty-texts": ("Rerank", "Rerank", tei.RerankRequest(query=QUERY), "INVALID_ARGUMENT",
                    "texts is empty: give at least one"),
    "too-many-texts": ("Rerank", "Rerank", tei.RerankRequest(query=QUERY, texts=["d"] * (MAX_ITEMS + 1)),
                       "INVALID_ARGUMENT", f"{MAX_ITEMS + 1} texts are more than the limit of {MAX_ITEMS}"),
    "unknown-direction": ("Rerank", "Rerank", tei.RerankRequest(query=QUERY, texts=DOCS, truncation_direction=7),
                          "INVALID_ARGUMENT", "truncation_direction 7 is unknown"),
    "too-long": ("Rerank", "Rerank", tei.RerankRequest(query=QUERY, texts=["short", TOO_LONG]), "INVALID_ARGUMENT",
                 "texts[1] gives a sequence of"),
    "prompt-name": ("Embed", "Embed", tei.EmbedRequest(inputs="x", prompt_name="query"), "INVALID_ARGUMENT",
                    "prompt_name 'query' is not supported"),
    "dimensions": ("Embed", "Embed", tei.EmbedRequest(inputs="x", dimensions=100000), "INVALID_ARGUMENT",
                   "dimensions must be between 1 and the model's hidden size 64, got 100000"),
    "embed-too-long": ("Embed", "Embed", tei.EmbedRequest(inputs=TOO_LONG), "INVALID_ARGUMENT",
                       "inputs gives a sequence of"),
    "predict-without-labels": ("Predict", "Predict", tei.PredictRequest(inputs="great"), "INVALID_ARGUMENT",
                               "has no sequence-classification head, so it has no labels of its own"),
    "oversize": ("Embed", "Embed", tei.EmbedRequest(inputs="x" * MAX_REQUEST_BYTES), "RESOURCE_EXHAUSTED",
                 f"over the limit of {MAX_REQUEST_BYTES} bytes (max_request_bytes)"),
    "pair-of-one": ("Predict", "PredictPair", tei.PredictPairRequest(inputs=[QUERY]), "INVALID_ARGUMENT",
                    "inputs has 1 texts: send a [text, text_pair] pair"),
    "pair-too-long": ("Predict", "PredictPair", tei.PredictPairRequest(inputs=[QUERY, TOO_LONG]), "INVALID_ARGUMENT",
                      "inputs[1] gives a sequence of"),
    "tokenize-too-long": ("Tokenize", "Tokenize", tei.EncodeRequest(inputs=TOO_LONG), "INVALID_ARGUMENT",
                          "inputs has 3003 tokens; the limit is 2048 per text"),
    "decode-unknown-id": ("Tokenize", "Decode", tei.DecodeRequest(ids=[1, 10**6]), "INVALID_ARGUMENT",
                          "ids holds 1000000, which is no token id of the model's tokenizer"),
    "stream-empty": ("Rerank", "RerankStream", iter([]), "INVALID_ARGUMENT", "RerankStream received no messages"),
    "stream-too-many": ("Rerank", "RerankStream", iter([tei.RerankStreamRequest(query=QUERY, text="d")] * 20),
                        "INVALID_ARGUMENT", f"the stream has more than {MAX_ITEMS} messages, the limit of one call"),
    "stream-oversize": ("Rerank", "RerankStream",
                        iter([tei.RerankStreamRequest(query=QUERY, text="x" * (MAX_REQUEST_BYTES // 2))] * 3),
                        "RESOURCE_EXHAUSTED", "(max_request_bytes)"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_its_code_and_a_message_naming_the_field(deployment, case):
    service, method, request, code, message = BAD_INPUTS[case]
    with pytest.raises(grpc.RpcError) as caught:
        getattr(deployment.use("rerank").stub(service), method)(request, timeout=60)
    assert caught.value.code().name == code and message in caught.value.details(), caught.value.details()
    assert "Traceback" not in caught.value.details()


@pytest.mark.timeout(180)
def test_tei_client_tokenizes_and_decodes_and_pairs_are_scored_by_the_reranker(deployment, engine):
    texts = ["a radix tree", "page<|im_end|>yes"]
    (tokens,) = deployment.use("rerank").tei_client([("tokenize", {"text": texts, "add_special_tokens": False})])
    assert [token["id"] for token in tokens[0]] == engine.context.prompt_tokenizer().encode(texts[0])
    assert ["".join(token["text"] for token in row) for row in tokens] == texts
    assert not any(token["special"] for row in tokens for token in row)  # a literal in user text is plain text
    ids = [[token["id"] for token in row] for row in tokens]
    one, both = deployment.tei_client([("decode", {"tokenized_input": ids[0]}), ("decode", {"tokenized_input": ids})])
    assert (one, both) == (texts[0], texts)
    predict = deployment.stub("Predict")
    want = [engine.rerank(QUERY, [doc]).results[0].score for doc in DOCS[:3]]
    reply = predict.PredictPair(tei.PredictPairRequest(inputs=[QUERY, DOCS[0]]), timeout=60)
    assert [(p.label, p.score) for p in reply.predictions] == [("relevance", pytest.approx(want[0], abs=1e-5))]
    replies = list(predict.PredictPairStream(iter([tei.PredictPairRequest(inputs=[QUERY, doc]) for doc in DOCS[:3]]),
                                             timeout=60))
    np.testing.assert_allclose([r.predictions[0].score for r in replies], want, atol=1e-5)


@pytest.mark.timeout(120)
def test_a_bidirectional_stream_answers_until_its_first_bad_message(deployment, engine):
    embed, predict = deployment.use("rerank").stub("Embed"), deployment.stub("Predict")
    messages = [tei.EmbedRequest(inputs=DOCS[0]), tei.EmbedRequest(inputs=DOCS[1]),
                tei.EmbedRequest(inputs="x", dimensions=100000), tei.EmbedRequest(inputs=DOCS[2])]
    call = embed.EmbedStream(iter(messages), timeout=60)
    replies = []
    with pytest.raises(grpc.RpcError) as caught:
        for reply in call:
            replies.append(list(reply.embeddings))
    np.testing.assert_allclose(replies, engine.embed(DOCS[:2]).embeddings, atol=1e-5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dimensions must be between 1 and the model's hidden size" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        list(predict.PredictStream(iter([tei.PredictRequest(inputs="great")]), timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no sequence-classification head" in caught.value.details()


@pytest.mark.timeout(180)
def test_predict_and_its_stream_return_the_models_labels(deployment, classifier_dir):
    classifier = Engine.from_pretrained(classifier_dir, device="cpu")
    predict = deployment.use("classifier").stub("Predict")
    texts = ["a radix tree", "bread rises in a warm oven", "the start of a long text, " + TOO_LONG]
    want = classifier.predict(texts, truncation_direction="left").results
    reply = predict.Predict(tei.PredictRequest(inputs=texts[0]), timeout=60)
    assert [(p.label, p.score) for p in reply.predictions] == [
        ("LABEL_0", pytest.approx(hit.score, abs=1e-5)) for hit in want[0]]
    assert reply.metadata.compute_tokens == classifier.predict(texts[:1]).usage.input_tokens
    replies = list(predict.PredictStream(iter([tei.PredictRequest(inputs=text, truncate=True,
                                                                  truncation_direction=tei.TRUNCATION_DIRECTION_LEFT)
                                               for text in texts]), timeout=60))
    np.testing.assert_allclose([[p.score for p in r.predictions] for r in replies],
                               [[hit.score for hit in row] for row in want], atol=1e-5)
    raw = predict.Predict(tei.PredictRequest(inputs=texts[1], raw_scores=True), timeout=60)
    assert raw.predictions[0].score == pytest.approx(classifier.predict(texts[1:2], raw_scores=True)
                                                     .results[0][0].score, abs=1e-5)
    with pytest.raises(grpc.RpcError) as caught:
        predict.Predict(tei.PredictRequest(inputs=texts[2]), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "inputs gives a sequence of" in \
        caught.value.details()
    # radixserve.v1's Predict, the same method name: answered by radixserve.v1
    reply = ScoringStub(deployment.channel).Predict(pb.PredictRequest(inputs=texts[:2]), timeout=60)
    assert [[s.label for s in r.scores] for r in reply.results] == [[hit.label for hit in row] for row in want[:2]]
    np.testing.assert_allclose([[s.score for s in r.scores] for r in reply.results],
                               [[hit.score for hit in row] for row in want[:2]], atol=1e-5)


@pytest.mark.timeout(180)
def test_api_keys_guard_tei_calls_and_streams(deployment):
    keyed, metadata = deployment.use("keyed"), [("authorization", f"Bearer {KEY}")]
    rerank, embed = keyed.stub("Rerank"), keyed.stub("Embed")
    calls = [lambda md: rerank.Rerank(tei.RerankRequest(query=QUERY, texts=DOCS[:2]), metadata=md, timeout=60),
             lambda md: rerank.RerankStream(iter([tei.RerankStreamRequest(query=QUERY, text=DOCS[0])]), metadata=md,
                                            timeout=60),
             lambda md: list(embed.EmbedStream(iter([tei.EmbedRequest(inputs=DOCS[0])]), metadata=md, timeout=60)),
             lambda md: keyed.stub("Info").Info(tei.InfoRequest(), metadata=md, timeout=30),
             lambda md: keyed.stub("Tokenize").Tokenize(tei.EncodeRequest(inputs=DOCS[0]), metadata=md, timeout=30),
             lambda md: list(keyed.stub("Tokenize").DecodeStream(iter([tei.DecodeRequest(ids=[1, 2])]), metadata=md,
                                                                 timeout=30))]
    for call in calls:
        with pytest.raises(grpc.RpcError) as caught:
            call(())
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value.details()
        assert "missing API key" in caught.value.details()
        assert call(metadata)
