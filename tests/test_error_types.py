"""Errors by type (issue 21, items 6 and 7): a client's mistake is a `RequestError`, raised where the argument is
checked and naming it, types included; anything else is a server fault. gRPC's `status_of` and HTTP's `api_error`
classify by type, never by ValueError: a bug's or numpy's ValueError is INTERNAL, logged once with its traceback.

Over HTTP, through the real FastAPI application (`deployments.http.build_app`) in this process: a client error
raised anywhere in a route is answered by an ordinary exception handler (metered with its code, no traceback
logged), and a server fault answers 500 without its message and is logged once. The dialects' JSON types are
strict, as the services they copy: `"yes"` is no boolean, `"2"` no integer.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import replace
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient

from deployments.auth import load_api_keys
from deployments.config import AppArgs
from deployments.engine_request import Priority
from deployments.grpc_status import status_of
from deployments.http import build_app
from deployments.http.errors import api_error
from deployments.metrics import IngressMetrics, RequestMeter
from deployments.model_card import model_card
from radix_core.errors import FieldName, RequestError
from radix_core.tasks import TASKS, TaskConfig, TaskRequest, load_task_context, task_for, task_of
from radix_core.templates import TemplateNotFound

NUMPY_FAULT = "operands could not be broadcast together with shapes (3,) (4,)"  # a ValueError that is no client's
pytestmark = pytest.mark.timeout(300)


# --- classification by type -----------------------------------------------------------------------------------------

def test_a_request_error_is_the_clients_and_keeps_its_structure():
    err = RequestError.about("documents", "is empty", "give every one at least one character", index=2)
    assert isinstance(err, ValueError) and issubclass(TemplateNotFound, RequestError)  # `except ValueError` still works
    assert str(err) == "documents[2] is empty: give every one at least one character"
    again = pickle.loads(pickle.dumps(err))  # as it crosses Ray processes
    assert (str(again), again.field, again.index, again.fix) == (str(err), "documents", 2, err.fix)
    for error in (err, again):  # renamed from a table, by structure: the fix's words are left alone
        renamed = error.renamed({"documents": "texts"})
        assert (type(renamed), str(renamed), renamed.field, renamed.index) == (
            RequestError, "texts[2] is empty: give every one at least one character", "texts", 2)
    one = err.renamed({"documents": FieldName("messages", item=lambda i: f"message {i} of its query")})
    assert (str(one), one.field) == ("message 2 of its query is empty: give every one at least one character",
                                     "messages")
    count = RequestError.about("documents", "are more than the limit of 4 per call", lead="5 ", limit=4)
    assert str(count.renamed({"documents": "texts"})) == "5 texts are more than the limit of 4 per call"
    assert count.renamed({"query": "inputs"}) is count  # a table that does not name its field
    free = RequestError("documents is empty in the text", field="documents")  # text as given: only `field` renamed
    assert (str(free.renamed({"documents": "texts"})), free.renamed({"documents": "texts"}).field) == (
        "documents is empty in the text", "texts")


def test_status_of_maps_a_request_error_to_invalid_argument_without_logging(caplog):
    with caplog.at_level(logging.DEBUG, logger="ray.serve"):
        assert status_of(RequestError("top_n must be at least 1, got 0")) == (
            grpc.StatusCode.INVALID_ARGUMENT, "top_n must be at least 1, got 0")
    assert caplog.records == []


@pytest.mark.parametrize("fault", [ValueError(NUMPY_FAULT), TypeError("'<' not supported between 'str' and 'int'")])
def test_any_other_error_is_internal_and_logged_once_with_its_traceback(caplog, fault):
    """A plain ValueError is no longer a client error: the server's fault, its message kept out of the reply."""
    with caplog.at_level(logging.DEBUG, logger="ray.serve"):
        code, details = status_of(fault)
    assert code == grpc.StatusCode.INTERNAL and str(fault) not in details
    assert details.startswith(f"internal error ({type(fault).__name__})")
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info[1] is fault


def test_api_error_classifies_by_type():
    assert (api_error(RequestError("query is empty")).status_code, api_error(RequestError("q")).kind.name) == (
        422, "validation")
    fault = api_error(ValueError(NUMPY_FAULT))
    assert (fault.status_code, fault.kind.name) == (500, "backend") and "broadcast" not in fault.detail


# --- wrong types name their field -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def context(tiny_model_dir):
    return load_task_context(str(tiny_model_dir("qwen3", "causal_lm")), TaskConfig())


@pytest.mark.parametrize("task, arguments, field, message", [
    ("rerank", {"top_n": "2"}, "top_n", "top_n must be an integer, got str"),
    ("rerank", {"top_n": True}, "top_n", "top_n must be an integer, got bool"),
    ("rerank", {"return_documents": "yes"}, "return_documents", "return_documents must be a boolean, got str"),
    ("rerank", {"raw_scores": 1}, "raw_scores", "raw_scores must be a boolean, got int"),
    ("rerank", {"truncate": "no"}, "truncate", "truncate must be a boolean, got str"),
    ("rerank", {"max_document_tokens": "3"}, "max_document_tokens", "max_document_tokens must be an integer, got str"),
    ("rerank", {"truncation_direction": None}, "truncation_direction",
     "truncation_direction must be a string, got NoneType"),
    ("embed", {"dimensions": "5"}, "dimensions", "dimensions must be an integer, got str"),
    ("embed", {"normalize": "false"}, "normalize", "normalize must be a boolean, got str"),
    ("embed", {"pooling": ["last"]}, "pooling", "pooling must be a string, got list"),
    ("classify", {"template": 5}, "template", "template must be a string, got int"),
    ("classify", {"prefix": b"shots"}, "prefix", "prefix must be a string, got bytes"),
])
def test_a_wrong_type_is_a_request_error_naming_the_field(context, task, arguments, field, message):
    """What a DeploymentHandle caller can send: before, `top_n="2"` failed in a comparison (TypeError: INTERNAL)
    and `return_documents="yes"` was taken as true."""
    base = {"rerank": {"query": "q", "documents": ["d"]}, "embed": {"texts": ["t"]},
            "classify": {"inputs": ["x"], "labels": [" a"]}}[task]
    with pytest.raises(RequestError) as caught:
        TASKS[task].encode(context, {**base, **arguments})
    assert (str(caught.value), caught.value.field) == (message, field)


@pytest.mark.parametrize("call, message", [
    (lambda context: TASKS["rerank"].encode(context, {"query": "q", "documents": ["d"], 7: "x"}),
     "unknown rerank request keys [7]"),
    (lambda context: TASKS["embed"].encode(context, [("texts", ["t"])]), "the embed request must be a mapping"),
    (lambda context: task_of(["rerank"]), "unknown task ['rerank']"),
    (lambda context: Priority.parse("urgent"), "priority must be 'interactive' or 'batch', got 'urgent'"),
    (lambda context: Priority.parse(2), "priority must be 'interactive' or 'batch', got a value of type int"),
])
def test_a_handle_callers_mistake_in_the_call_itself_is_a_request_error(context, call, message):
    with pytest.raises(RequestError) as caught:
        call(context)
    assert str(caught.value).startswith(message)


def test_limits_carry_their_structure(context):
    with pytest.raises(RequestError) as caught:
        TASKS["rerank"].encode(replace(context, config=TaskConfig(max_items=2)), {"query": "q", "documents": ["d"] * 3})
    assert (caught.value.field, caught.value.limit, caught.value.fix) == (
        "documents", 2, "split the request or raise max_items in the task config")
    with pytest.raises(RequestError) as caught:
        TASKS["embed"].encode(context, {"texts": ["t", "radix " * 3000], "truncate": False})
    assert (caught.value.index, caught.value.limit) == (1, context.token_limit)


# --- HTTP: handlers, metering and logs ------------------------------------------------------------------------------

class RecordingMetrics(IngressMetrics):
    """The ingress's metrics, keeping each metered request's labels and code."""

    def __init__(self):
        super().__init__()
        self.meters: list[RequestMeter] = []

    def _record(self, meter: RequestMeter, duration_s: float) -> None:
        self.meters.append(meter)


class FaultyIngress:
    """What the routes use of `deployments.ingress.Ingress`, with an engine that always fails with a plain
    ValueError (as numpy's): each call is validated as the ingress validates it, then fails on the server side."""

    def __init__(self, model: str):
        self.args = AppArgs(model=model, tasks={"max_items": 4})
        self.api_keys = load_api_keys(None, None)
        self.context = load_task_context(model, self.args.tasks)
        self.card = model_card(model, None, None, self.context)
        self.metrics = RecordingMetrics()

    async def answer(self, request: TaskRequest, priority: Priority) -> Any:
        task_for(request).encode(self.context, request)
        raise ValueError(NUMPY_FAULT)

    async def info(self) -> dict[str, Any]:
        return {}


@pytest.fixture
def ingress(tiny_model_dir):
    return FaultyIngress(str(tiny_model_dir("qwen3", "causal_lm")))


def post(ingress: FaultyIngress, path: str, body: dict, raise_server_exceptions: bool = False) -> tuple[int, dict]:
    reply = TestClient(build_app(ingress), raise_server_exceptions=raise_server_exceptions).post(path, json=body)
    return reply.status_code, reply.json()


def tracebacks(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.exc_info]


@pytest.mark.parametrize("path, body, message", [
    ("/rerank", {"query": "q", "texts": ["d", ""]}, "texts[1] is empty"),  # in Service.run
    ("/embed", {"inputs": "t", "prompt_name": "query"}, "prompt_name 'query' is not supported"),  # in the route
    ("/tokenize", {"inputs": ["a"] * 5}, "5 inputs are more than the limit of 4"),  # in a worker thread
    ("/predict", {"inputs": [["q", "d"]] * 5}, "5 inputs are more than the limit of 4"),
])
def test_http_a_client_error_is_metered_with_its_code_and_logs_no_traceback(ingress, caplog, path, body, message):
    """Before, a client error raised outside `Service.run` reached Starlette's last-resort handler, which re-raises
    after answering: metered INTERNAL, and the server logged a traceback for a 422."""
    with caplog.at_level(logging.DEBUG):
        status, error = post(ingress, path, body, raise_server_exceptions=True)  # nothing re-raised
    assert (status, error["error_type"]) == (422, "validation") and error["error"].startswith(message)
    assert [meter.code for meter in ingress.metrics.meters] == ["INVALID_ARGUMENT"]
    assert tracebacks(caplog) == []


@pytest.mark.parametrize("path, body", [
    ("/rerank", {"query": "q", "texts": ["d"]}),
    ("/v1/embeddings", {"input": ["t"]}),
    ("/v2/rerank", {"query": "q", "documents": ["d"]}),
])
def test_http_a_server_side_value_error_is_a_500_logged_once(ingress, caplog, path, body):
    """Before, every ValueError was the client's: a numpy fault in the engine was a 422 that nobody logged."""
    with caplog.at_level(logging.DEBUG):
        status, error = post(ingress, path, body)
    assert status == 500 and "broadcast" not in str(error) and "internal error (ValueError)" in str(error)
    assert [meter.code for meter in ingress.metrics.meters] == ["INTERNAL"]
    (record,) = tracebacks(caplog)
    assert str(record.exc_info[1]) == NUMPY_FAULT


class BrokenTokenizer:
    """A prompt tokenizer with a bug: /tokenize fails in its route, outside `Service.run`."""

    def encode_user(self, *args, **kwargs):
        raise ValueError(NUMPY_FAULT)


def test_http_a_fault_no_route_converted_answers_500_and_is_left_to_the_server_to_log(ingress, caplog):
    """Starlette answers it with our handler and re-raises it for the server (Ray's replica, uvicorn) to log with
    its traceback, so the handler logs nothing: once in all."""
    ingress.context = replace(ingress.context, prompts=BrokenTokenizer())
    with caplog.at_level(logging.DEBUG):
        status, error = post(ingress, "/tokenize", {"inputs": ["a"]})
    assert (status, error) == (500, {"error": "internal error (ValueError); the server logged the details",
                                     "error_type": "backend"})
    assert [meter.code for meter in ingress.metrics.meters] == ["INTERNAL"] and tracebacks(caplog) == []
    with pytest.raises(ValueError, match="broadcast"):
        post(ingress, "/tokenize", {"inputs": ["a"]}, raise_server_exceptions=True)


@pytest.mark.parametrize("path, body, field", [
    ("/rerank", {"query": "q", "texts": ["d"], "raw_scores": "yes"}, "raw_scores"),
    ("/rerank", {"query": "q", "texts": ["d"], "return_text": 1}, "return_text"),
    ("/embed", {"inputs": "t", "dimensions": "5"}, "dimensions"),
    ("/embed", {"inputs": "t", "normalize": "false"}, "normalize"),
    ("/tokenize", {"inputs": "t", "add_special_tokens": "no"}, "add_special_tokens"),
    ("/v1/embeddings", {"input": "t", "dimensions": "5"}, "dimensions"),
    ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 2.0}, "top_n"),
    ("/v2/rerank", {"query": "q", "documents": ["d"], "max_tokens_per_doc": "3"}, "max_tokens_per_doc"),
])
def test_http_json_types_are_strict_as_the_services_copied(ingress, path, body, field):
    """TEI (serde), OpenAI and Cohere refuse a string for a boolean or an integer; pydantic's lax mode took
    "yes" for true and "5" for 5."""
    status, error = post(ingress, path, body)
    message = error.get("message") or error["error"]
    message = message if isinstance(message, str) else message["message"]
    assert status == 422 and message.startswith(f"{field}: Input should be a valid "), message
    assert [meter.code for meter in ingress.metrics.meters] == ["INVALID_ARGUMENT"]
