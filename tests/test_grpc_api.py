"""The gRPC API end to end on a local Ray: Ray Serve's gRPC proxy on a loopback port with serve_config.yaml's
servicers, the application built from a tiny model, called with grpcio, the client CLI in-process and as a
subprocess. Answers equal the library's; each bad input gets its status code and a message naming the field and
the limit; API keys; health; back-pressure; load shedding. Four configurations are deployed in turn (open, keyed
with a one-request engine queue, a small token queue, the combined topology); each test asks for the one it
needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ray import serve
from serving import ROOT, GrpcDeployment, held_compute, wait_for

import radixserve
from radix_core import Engine
from radix_core.tasks import TASKS
from radixserve import cli
from radixserve.v1 import scoring_pb2 as pb
from radixserve.v1.scoring_pb2_grpc import ScoringStub

DOCS = [f"passage {i}: a radix tree stores strings by shared prefixes, {'and more ' * i}" for i in range(6)]
QUERY = "what is a radix tree"
MAX_ITEMS = 8
MAX_REQUEST_BYTES = 65536
KEYS = ("key-one", "key-two")
pytestmark = pytest.mark.serve


class Deployment(GrpcDeployment):
    """The open, keyed and shedding configurations of one local Ray + Serve with the gRPC proxy."""

    def __init__(self, model_dir: str, keys_file: Path):
        super().__init__(
            base={"model": model_dir, "tasks": {"max_items": MAX_ITEMS},
                  "limits": {"max_request_bytes": MAX_REQUEST_BYTES},
                  "placement": {"engine": {"cpus": 0.5}, "ingress": {"cpus": 0.5}}},
            configs={"open": {},
                     "combined": {"placement": {"topology": "combined"}},
                     "keyed": {"auth": {"api_keys_file": str(keys_file)}, "batching": {"batch_wait_timeout_s": 1.0},
                               "placement": {"engine": {"max_ongoing_requests": 1, "max_queued_requests": 1}}},
                     "shedding": {"batching": {"max_queued_tokens": 400, "max_batch_tokens": 300,
                                               "batch_wait_timeout_s": 0.5}, "limits": {"max_request_tokens": 300}}},
            probe=lambda channel: ScoringStub(channel).Info(pb.InfoRequest(), timeout=10), keyed=frozenset({"keyed"}))

    @property
    def stub(self) -> ScoringStub:
        return ScoringStub(self.channel)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> str:
    return str(tiny_model_dir("qwen3", "causal_lm"))


@pytest.fixture(scope="module")
def deployment(model_dir, tmp_path_factory, serve_cluster):
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys"
    keys_file.write_text("# test keys\n" + "\n".join(KEYS) + "\n")
    served = Deployment(model_dir, keys_file)
    try:
        served.start(serve_cluster)
        yield served
    finally:
        served.stop()


@pytest.fixture
def open_app(deployment) -> Deployment:
    return deployment.use("open")


@pytest.fixture
def keyed_app(deployment) -> Deployment:
    return deployment.use("keyed")


@pytest.fixture
def engine(model_dir) -> Engine:
    """A fresh engine per test: its prefix cache holds what an earlier test ran, which a fresh replica computes."""
    return Engine.from_pretrained(model_dir, device="cpu")


def usage(reply) -> tuple[int, int]:
    return reply.usage.input_tokens, reply.usage.computed_tokens


def assert_usage(reply, local) -> None:
    assert usage(reply) == (local.usage.input_tokens, local.usage.computed_tokens)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("topology", ["split", "combined"])
def test_every_rpc_returns_what_the_library_returns(deployment, topology, engine, model_dir):
    """Either topology (`placement.topology`: the engine a deployment of its own, or run by the ingress replica)."""
    open_app = deployment.use("open" if topology == "split" else "combined")
    deployments = {"split": {"Ingress", "EngineReplica"}, "combined": {"Ingress"}}[topology]
    assert set(serve.status().applications["radixserve"].deployments) == deployments
    stub = open_app.stub
    reply = stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, top_n=3, return_documents=True), timeout=60)
    local = engine.rerank(QUERY, DOCS, top_n=3, return_documents=True)
    assert [(h.index, h.document) for h in reply.results] == [(h.index, h.document) for h in local.results]
    np.testing.assert_allclose([h.score for h in reply.results], [h.score for h in local.results], atol=1e-5)
    assert_usage(reply, local)

    reply = stub.Embed(pb.EmbedRequest(texts=DOCS[:4], instruction="Find passages", dimensions=16), timeout=60)
    local = engine.embed(DOCS[:4], instruction="Find passages", dimensions=16)
    np.testing.assert_allclose([list(e.values) for e in reply.embeddings], local.embeddings, atol=1e-5)
    assert_usage(reply, local)

    inputs, labels = ["great", "awful", "fine"], [" yes", " no"]
    reply = stub.Classify(pb.ClassifyRequest(inputs=inputs, labels=labels, prefix="Is it good? "), timeout=60)
    local = engine.classify(inputs, labels, prefix="Is it good? ")
    np.testing.assert_allclose([list(r.probabilities) for r in reply.results], local.probabilities, atol=1e-5)
    assert list(reply.labels) == labels and [r.label for r in reply.results] == local.predictions
    assert_usage(reply, local)

    reply = stub.Score(pb.ScoreRequest(context="The capital of France is", continuations=[" Paris", " Rome"]),
                       timeout=60)
    local = engine.score("The capital of France is", [" Paris", " Rome"])
    assert [(s.index, s.num_tokens) for s in reply.scores] == [(s.index, s.num_tokens) for s in local.scores]
    np.testing.assert_allclose([s.logprob for s in reply.scores], [s.logprob for s in local.scores], atol=1e-5)
    assert_usage(reply, local)

    info = stub.Info(pb.InfoRequest(), timeout=30)
    assert (info.model, info.version, list(info.tasks), info.radix) == (Path(model_dir).name, radixserve.__version__,
                                                                        list(TASKS), "auto")
    assert (info.limits.max_items, info.limits.max_request_bytes) == (MAX_ITEMS, MAX_REQUEST_BYTES)
    assert info.limits.max_seq_len == engine.info["max_seq_len"] and info.family == "qwen3"
    assert serve.get_app_handle("radixserve").info.remote().result(timeout_s=30)["computed_tokens"] > 0


BAD_INPUTS = {
    "empty-documents": ("Rerank", pb.RerankRequest(query=QUERY), "INVALID_ARGUMENT",
                        "documents is empty: give at least one"),
    "too-many-documents": ("Rerank", pb.RerankRequest(query=QUERY, documents=["d"] * (MAX_ITEMS + 1)),
                           "INVALID_ARGUMENT", f"{MAX_ITEMS + 1} documents are more than the limit of {MAX_ITEMS}"),
    "top-n-zero": ("Rerank", pb.RerankRequest(query=QUERY, documents=DOCS, top_n=0), "INVALID_ARGUMENT",
                   "top_n must be at least 1, got 0"),
    "empty-query": ("Rerank", pb.RerankRequest(query="", documents=DOCS), "INVALID_ARGUMENT", "query is empty"),
    "unknown-pooling": ("Embed", pb.EmbedRequest(texts=DOCS, pooling="max"), "INVALID_ARGUMENT",
                        "unknown pooling 'max': choose one of last, mean"),
    "dimensions": ("Embed", pb.EmbedRequest(texts=DOCS, dimensions=100000), "INVALID_ARGUMENT",
                   "dimensions must be between 1 and the model's hidden size 64, got 100000"),
    "no-labels": ("Classify", pb.ClassifyRequest(inputs=["x"]), "INVALID_ARGUMENT", "labels is empty"),
    "duplicate-labels": ("Classify", pb.ClassifyRequest(inputs=["x"], labels=["a", "a"]), "INVALID_ARGUMENT",
                         "labels must be distinct"),
    "empty-continuation": ("Score", pb.ScoreRequest(context="c", continuations=["", "x"]), "INVALID_ARGUMENT",
                           "continuations[0] is empty"),
    "oversize": ("Rerank", pb.RerankRequest(query=QUERY, documents=["x" * MAX_REQUEST_BYTES]), "RESOURCE_EXHAUSTED",
                 f"over the limit of {MAX_REQUEST_BYTES} bytes (max_request_bytes)"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_its_code_and_a_message_naming_the_limit(open_app, case):
    method, request, code, message = BAD_INPUTS[case]
    with pytest.raises(grpc.RpcError) as caught:
        getattr(open_app.stub, method)(request, timeout=60)
    assert caught.value.code().name == code and message in caught.value.details()
    assert "Traceback" not in caught.value.details()


@pytest.mark.timeout(60)
def test_health_answers_serving_and_refuses_unknown_services(open_app):
    health, serving = health_pb2_grpc.HealthStub(open_app.channel), health_pb2.HealthCheckResponse.SERVING
    for service in ("", "radixserve.v1.Scoring"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=30).status == serving
    statuses = health.List(health_pb2.HealthListRequest(), timeout=30).statuses
    assert {name: s.status for name, s in statuses.items()} == {"": serving, "radixserve.v1.Scoring": serving}
    with pytest.raises(grpc.RpcError) as caught:
        health.Check(health_pb2.HealthCheckRequest(service="nope.Nothing"), timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as caught:
        list(health.Watch(health_pb2.HealthCheckRequest(), timeout=30))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED and "poll Health/Check" in caught.value.details()


@pytest.mark.timeout(120)
def test_cli_prints_json_and_server_errors(open_app, engine, capsys):
    address = ["--address", open_app.address]
    assert cli.main(["rerank", *address, "--query", QUERY, "--document", DOCS[0], "--document", DOCS[1],
                     "--top-n", "1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    best = engine.rerank(QUERY, DOCS[:2], top_n=1).results[0]
    assert set(printed) == {"results", "usage"} and set(printed["results"][0]) == {"index", "score"}
    assert printed["results"][0]["index"] == best.index
    assert set(printed["usage"]) == {"input_tokens", "computed_tokens", "cached_tokens"}

    assert cli.main(["embed", *address, "--text", "a", "--text", "b", "--dimensions", "8"]) == 0
    assert np.array([e["values"] for e in json.loads(capsys.readouterr().out)["embeddings"]]).shape == (2, 8)
    assert cli.main(["classify", *address, "--input", "x", "--label", " yes", "--label", " no"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"] == [" yes", " no"]
    assert cli.main(["score", *address, "--context", "The sky is", "--continuation", " blue"]) == 0
    assert json.loads(capsys.readouterr().out)["scores"][0]["index"] == 0
    assert cli.main(["info", *address]) == 0
    assert json.loads(capsys.readouterr().out)["limits"]["max_items"] == MAX_ITEMS

    assert cli.main(["rerank", *address, "--query", QUERY]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "INVALID_ARGUMENT: documents is empty: give at least one\n"


@pytest.mark.timeout(120)
def test_cli_runs_as_a_subprocess(open_app):
    done = subprocess.run([sys.executable, "-m", "radixserve.cli", "rerank", "--address", open_app.address,
                           "--query", QUERY, "--document", DOCS[0], "--document", DOCS[1]],
                          capture_output=True, text=True, timeout=90, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert sorted(hit["index"] for hit in json.loads(done.stdout)["results"]) == [0, 1]


@pytest.mark.timeout(180)
def test_api_keys_guard_every_call_but_health(keyed_app, capsys, monkeypatch):
    stub, request = keyed_app.stub, pb.RerankRequest(query=QUERY, documents=DOCS[:2])
    for metadata, details in [((), "missing API key"), ((("authorization", "Bearer key-three"),), "invalid API key")]:
        for call, message in [(stub.Rerank, request), (stub.Info, pb.InfoRequest())]:
            with pytest.raises(grpc.RpcError) as caught:
                call(message, metadata=metadata, timeout=30)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED and details in caught.value.details()
    reply = stub.Rerank(request, metadata=[("authorization", f"Bearer {KEYS[1]}")], timeout=60)
    assert len(reply.results) == 2
    health = health_pb2_grpc.HealthStub(keyed_app.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == health_pb2.HealthCheckResponse.SERVING

    monkeypatch.setenv(cli.API_KEY_ENV, KEYS[0])
    assert cli.main(["info", "--address", keyed_app.address]) == 0
    assert json.loads(capsys.readouterr().out)["model"]
    assert cli.main(["info", "--address", keyed_app.address, "--api-key", "wrong"]) == 1
    assert capsys.readouterr().err == "UNAUTHENTICATED: invalid API key\n"


@pytest.mark.timeout(120)
def test_back_pressure_is_resource_exhausted(keyed_app):
    """Engine: one request running, one queued; the rest are refused at once: each refusal ends before the last
    answer, the queued request's, whose batch waits 1 s for company (the first may run at once: it came to an
    idle replica, `TokenBudgetBatcher`'s lone requests). Ray Serve's router counts a request as queued until it is
    assigned, so a burst may see the queue full while the first is still being assigned and refuse all but one
    (documented in `ray.serve._private.router`): at least one is answered, and the server keeps serving."""
    metadata = [("authorization", f"Bearer {KEYS[0]}")]
    calls = [keyed_app.stub.Rerank.future(pb.RerankRequest(query=f"{QUERY} {i}", documents=DOCS[:2]),
                                          metadata=metadata, timeout=60) for i in range(6)]
    ended: list[grpc.StatusCode] = []  # in the order the calls ended
    for call in calls:
        call.add_done_callback(lambda done: ended.append(done.code()))
    codes = [call.code() for call in calls]  # each waits for its call to end
    refused = [call.details() for call in calls if call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert grpc.StatusCode.OK in codes and refused, codes
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    for _ in range(100):  # a call's callback runs just after the call ends
        if len(ended) == len(calls):
            break
        time.sleep(0.05)
    last_answer = len(ended) - 1 - ended[::-1].index(grpc.StatusCode.OK)
    assert ended[last_answer + 1:] == [], ended  # the queued one ends last
    assert all("max_queued_requests=1" in details and "retry with backoff" in details for details in refused)
    after = keyed_app.stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS[:2]), metadata=metadata, timeout=60)
    assert len(after.results) == 2


@pytest.fixture
def shedding_app(deployment) -> Deployment:
    return deployment.use("shedding")


@pytest.mark.timeout(120)
def test_a_full_token_queue_refuses_at_once_with_a_retry_hint(shedding_app):
    """Queued tokens bounded at 400: of 12 concurrent requests of about 150 tokens, sent while the replica's compute
    thread is busy (so that the queue fills on a fast machine too), most are refused, fast, with `retry-after-ms`;
    the rest are answered once it is free; the server keeps serving."""
    requests = [pb.RerankRequest(query=f"{QUERY} {i}", documents=DOCS[:2]) for i in range(12)]
    started = time.monotonic()
    with held_compute():
        calls = [shedding_app.stub.Rerank.future(request, timeout=60) for request in requests]
        wait_for(lambda: any(call.done() for call in calls), 30, "a refusal while the compute thread was held")
    codes = [call.code() for call in calls]
    refused = [call for call in calls if call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert grpc.StatusCode.OK in codes and refused, codes
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    for call in refused:
        assert "max_queued_tokens=400" in call.details() and "retry in about" in call.details()
        assert float(dict(call.trailing_metadata())["retry-after-ms"]) > 0
    assert time.monotonic() - started < 30
    assert len(shedding_app.stub.Rerank(requests[0], timeout=60).results) == 2
    # a refusal is one WARNING line in the ingress log, never an error with a stack trace in the replica's
    serve_logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    replica_logs = "".join(path.read_text(errors="replace") for path in serve_logs.glob("replica_*EngineReplica*"))
    assert "QueueFullError" not in replica_logs and "Traceback" not in replica_logs
