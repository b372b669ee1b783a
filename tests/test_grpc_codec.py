"""The gRPC pieces without a server: protobuf <-> library values, error -> status code, API keys, client retries."""

from __future__ import annotations

import dataclasses
import inspect
import socket
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
from ray.exceptions import ActorAlreadyExistsError, ActorDiedError, RayTaskError
from ray.serve._private.common import DeploymentID
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from deployments.auth import load_api_keys
from deployments.batcher import QueueFullError
from deployments.grpc_codec import SERVER_FIELDS, SERVICE, from_pb, info_to_pb, to_pb
from deployments.grpc_status import status_of
from radix_core import Engine
from radix_core.errors import RequestError
from radix_core.tasks import (
    TASKS, ClassifyRequest, ClassifyResult, ContinuationScore, EmbedRequest, EmbedResult, LabelScore, PredictResult,
    RerankHit, RerankRequest, RerankResult, ScoreResult, Usage,
)
from radixserve.client import ScoringClient, to_dict
from radixserve.v1 import scoring_pb2 as pb

USAGE = Usage(input_tokens=40, computed_tokens=25)


# --- codec ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("task", TASKS.values(), ids=list(TASKS))
def test_request_fields_are_the_task_requests_fields_in_order(task):
    """The task's request type is the contract: the proto message and the `Engine` method take its fields, in its
    order (the client passes them positionally; the server's own fields come last)."""
    request_fields = {f.name: f for f in dataclasses.fields(task.request_type)}
    message_fields = SERVICE.methods_by_name[task.rpc].input_type.fields
    assert [f.name for f in message_fields] == list(request_fields) + list(SERVER_FIELDS)
    assert list(inspect.signature(getattr(Engine, task.name)).parameters) == ["self", *request_fields]
    for field in message_fields[:len(message_fields) - len(SERVER_FIELDS)]:
        default = request_fields[field.name].default
        if default is not dataclasses.MISSING and default != field.default_value:  # None, True, "right", ...
            assert field.has_presence, f"{task.name}.{field.name} defaults to {default!r}: declare it optional"


def test_every_rpc_but_info_is_a_task():
    assert {task.rpc for task in TASKS.values()} == set(SERVICE.methods_by_name) - {"Info"}


def test_unset_optional_fields_leave_the_library_defaults():
    assert from_pb(pb.RerankRequest(query="q", documents=["a", "b"])) == RerankRequest("q", ["a", "b"])
    assert from_pb(pb.RerankRequest(query="q", documents=["a"], top_n=1, truncate=False, instruction="")) == \
        RerankRequest("q", ["a"], instruction="", top_n=1, truncate=False)
    assert from_pb(pb.EmbedRequest(texts=["t"], dimensions=8, pooling="mean")) == EmbedRequest(
        ["t"], dimensions=8, pooling="mean")
    assert from_pb(pb.ClassifyRequest(inputs=["i"], labels=["a", "b"])) == ClassifyRequest(["i"], ["a", "b"])
    assert from_pb(pb.RerankRequest(query="q", documents=["a"], priority="batch")) == RerankRequest("q", ["a"])


def test_results_become_responses():
    rerank = to_pb(TASKS["rerank"], RerankResult([RerankHit(2, 0.9, "doc"), RerankHit(0, 0.1)], USAGE))
    assert [(h.index, h.score, h.document, h.HasField("document")) for h in rerank.results] == [
        (2, 0.9, "doc", True), (0, 0.1, "", False)]
    assert (rerank.usage.input_tokens, rerank.usage.computed_tokens) == (40, 25)

    vectors = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    embed = to_pb(TASKS["embed"], EmbedResult(vectors, USAGE))
    np.testing.assert_array_equal(np.array([e.values for e in embed.embeddings], dtype=np.float32), vectors)

    probabilities = np.array([[0.25, 0.75], [0.6, 0.4]])
    classify = to_pb(TASKS["classify"], ClassifyResult(["yes", "no"], probabilities, USAGE))
    assert list(classify.labels) == ["yes", "no"] and [r.label for r in classify.results] == ["no", "yes"]
    np.testing.assert_array_equal([r.probabilities for r in classify.results], probabilities)

    score = to_pb(TASKS["score"], ScoreResult([ContinuationScore(0, -3.0, -1.5, 2)], USAGE))
    assert (score.scores[0].logprob, score.scores[0].mean_logprob, score.scores[0].num_tokens) == (-3.0, -1.5, 2)

    predict = to_pb(TASKS["predict"], PredictResult([[LabelScore("b", 0.75), LabelScore("a", 0.25)]], USAGE))
    assert [[(s.label, s.score) for s in r.scores] for r in predict.results] == [[("b", 0.75), ("a", 0.25)]]
    assert [type(m).__name__ for m in (rerank, embed, classify, score, predict)] == [
        f"{task.rpc}Response" for task in TASKS.values()]


def test_info_dict_becomes_info_response():
    info = {"model": "m", "version": "1.2", "tasks": ["rerank"], "radix": "auto", "radix_threshold": 0.9,
            "family": "qwen3", "head": "causal_lm", "device": "cpu", "dtype": "float32", "attention": "torch",
            "index_builder": "actor", "max_items": 8, "max_tokens_per_item": 512, "max_request_tokens": 100,
            "max_batch_tokens": 200, "max_seq_len": 2048, "max_request_bytes": 1 << 20}
    reply = info_to_pb(info)
    assert (reply.model, reply.version, list(reply.tasks), reply.limits.max_request_bytes) == ("m", "1.2", ["rerank"],
                                                                                               1 << 20)


# --- status codes ---------------------------------------------------------------------------------------------------

def remote(cause: Exception) -> Exception:
    """`cause` as it arrives from another Ray process: a RayTaskError that is also an instance of the cause."""
    return RayTaskError("submit", "Traceback (most recent call last):\n  ...", cause).as_instanceof_cause()


@pytest.mark.parametrize("err, code, details", [
    (RequestError("documents is empty", "give at least one"), "INVALID_ARGUMENT",
     "documents is empty: give at least one"),
    (remote(RequestError("query is empty")), "INVALID_ARGUMENT", "query is empty"),
    (ValueError("operands could not be broadcast together"), "INTERNAL", "internal error (ValueError)"),
    (BackPressureError(num_queued_requests=3, max_queued_requests=2), "RESOURCE_EXHAUSTED", "max_queued_requests=2"),
    (remote(QueueFullError("batch queue full: 9 requests waiting", 2.5)), "RESOURCE_EXHAUSTED", "batch queue full"),
    (DeploymentUnavailableError(DeploymentID("EngineReplica", "radixserve")), "UNAVAILABLE", "retry shortly"),
    (ActorDiedError(), "UNAVAILABLE", "ActorDiedError"),
    (RuntimeError("boom"), "INTERNAL", "internal error (RuntimeError)"),
    (ActorAlreadyExistsError("x"), "INTERNAL", "ActorAlreadyExistsError"),  # a ValueError of Ray's, not the user's
])
def test_errors_map_to_status_codes_without_stack_traces(err, code, details):
    got_code, got_details = status_of(err)
    assert got_code.name == code and details in got_details
    assert "Traceback" not in got_details


# --- API keys -------------------------------------------------------------------------------------------------------

def test_api_keys_from_file_and_env(tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text("# production\nkey-one\n\n  key-two  \n")
    keys = load_api_keys(str(keys_file), "MY_KEYS", environ={"MY_KEYS": "key-three, key-four"})
    for key in ("key-one", "key-two", "key-four"):
        assert keys.refusal([("authorization", f"Bearer {key}")]) is None
    assert keys.refusal([("authorization", "bearer key-three")]) is None  # the scheme in any case
    assert keys.refusal([]).startswith("missing API key")
    assert keys.refusal([("authorization", "key-one")]).startswith("missing API key")
    assert keys.refusal([("authorization", "Bearer key-on")]) == "invalid API key"
    assert load_api_keys(None, None).refusal([]) is None  # auth off


@pytest.mark.parametrize("keys_file, env, message", [
    ("missing", None, "cannot be read"),
    ("empty", None, "holds no key"),
    (None, {"MY_KEYS": " , "}, "unset or holds no key"),
    (None, {}, "unset or holds no key"),
])
def test_a_configured_source_without_keys_refuses_to_start(tmp_path, keys_file, env, message):
    (tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(ValueError, match=message):
        load_api_keys(str(tmp_path / keys_file) if keys_file else None, "MY_KEYS" if env is not None else None,
                      environ=env or {})


# --- client retries -------------------------------------------------------------------------------------------------

class ScriptedServer:
    """A real gRPC server on a loopback port whose Info answers the queued status codes first, then an
    InfoResponse; counts the attempts."""

    def __init__(self, *codes: grpc.StatusCode, trailing: tuple = ()):
        self.codes = list(codes)
        self.trailing = trailing
        self.attempts = 0
        self.times: list[float] = []
        handler = grpc.method_handlers_generic_handler("radixserve.v1.Scoring", {
            "Info": grpc.unary_unary_rpc_method_handler(self._info, pb.InfoRequest.FromString,
                                                        pb.InfoResponse.SerializeToString)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def _info(self, request, context):
        self.attempts += 1
        self.times.append(time.monotonic())
        if self.codes:
            context.set_trailing_metadata(self.trailing)
            context.abort(self.codes.pop(0), "scripted")
        return pb.InfoResponse(model="m", limits=pb.Limits(max_request_bytes=5))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.server.stop(grace=None)


@pytest.mark.timeout(30)
def test_client_retries_unavailable_and_hinted_resource_exhausted_only():
    with ScriptedServer(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        trailing=(("retry-after-ms", "1"),)) as server:
        with ScoringClient(server.address, retries=3, backoff_s=0.001) as client:
            info = to_dict(client.info())
        assert server.attempts == 3 and info["model"] == "m" and info["limits"]["max_request_bytes"] == 5
    for code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):  # the latter without a hint:
        with ScriptedServer(code) as server:  # a message over max_request_bytes never fits, however often sent
            with ScoringClient(server.address, retries=3, backoff_s=0.001) as client:
                with pytest.raises(grpc.RpcError) as caught:
                    client.info()
            assert caught.value.code() == code and server.attempts == 1


def test_client_methods_take_fields_positionally_and_by_name():
    with pytest.raises(TypeError, match=r"Rerank has no fields \['colour'\]"):
        ScoringClient("127.0.0.1:1").rerank("q", ["d"], colour="red")
    with pytest.raises(TypeError, match=r"got \['query'\] both positionally and by name"):
        ScoringClient("127.0.0.1:1").rerank("q", query="q")
    with pytest.raises(ValueError, match="unknown rpc 'Summarize'"):
        ScoringClient("127.0.0.1:1").call("Summarize")


def test_client_waits_at_least_the_servers_retry_hint():
    with ScriptedServer(grpc.StatusCode.RESOURCE_EXHAUSTED, trailing=(("retry-after-ms", "300"),)) as server:
        with ScoringClient(server.address, retries=2, backoff_s=0.001, timeout_s=10) as client:
            assert to_dict(client.info())["model"] == "m"
        assert server.attempts == 2 and server.times[1] - server.times[0] >= 0.3


def test_client_retries_stop_at_the_deadline():
    with ScriptedServer(*[grpc.StatusCode.UNAVAILABLE] * 10) as server:
        started = time.monotonic()
        with ScoringClient(server.address, retries=10, backoff_s=0.2, timeout_s=1.0) as client:
            with pytest.raises(grpc.RpcError) as caught:
                client.info()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 1.5 and 2 <= server.attempts < 6


@pytest.mark.timeout(30)
def test_client_gives_up_after_its_retries_with_backoff():
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with ScoringClient(f"127.0.0.1:{port}", retries=2, backoff_s=0.1, timeout_s=5) as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.info()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started >= 0.15  # backoff 0.1 + 0.2, each at least halved by the jitter
