"""Hostile input (issue 21, round two): text that is not valid Unicode, empty items, item counts and the sequences
a request expands to, and per-item token bounds, refused as client errors that name the field and the limit.

The task layer first (one check in `radix_core.tasks` covers the library, gRPC and HTTP), then the HTTP routes:
the real FastAPI application (`deployments.http.build_app`) in this process, over a stand-in for the ingress
replica that runs each call as the library does (encode, one batch, merge). No Ray cluster: the serve tests
(tests/test_http_api.py) check that the deployed application is this one behind Ray's proxy.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from test_tasks_tokenization import counted

from deployments import tei as tei_fields
from deployments.auth import load_api_keys
from deployments.config import AppArgs
from deployments.engine_request import Priority
from deployments.http import build_app
from deployments.metrics import IngressMetrics
from deployments.model_card import model_card
from radix_core.engine import Engine
from radix_core.errors import RequestError
from radix_core.tasks import TASKS, TaskConfig, TaskRequest, load_task_context, task_for
from radix_core.tiny_models import make_tiny_tokenizer

MAX_ITEMS = 4
SURROGATE = "text \ud800 with a lone surrogate"  # valid JSON ("\ud800"), not valid Unicode
LONG = "radix tree " * 3000  # over the tiny models' 2048-token limit, under the character bound
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def contexts(tiny_model_dir):
    """`TaskContext`s with `MAX_ITEMS`: a causal LM (rerank, embed, classify, score) and a score head (predict)."""
    config = TaskConfig(max_items=MAX_ITEMS)
    return {head: load_task_context(str(tiny_model_dir("qwen3", head)), config) for head in ("causal_lm", "seq_cls")}


def encode(contexts, task: str, request: dict[str, Any]):
    return TASKS[task].encode(contexts["seq_cls" if task == "predict" else "causal_lm"], request)


@pytest.mark.parametrize("task, request_, field", [
    ("rerank", {"query": SURROGATE, "documents": ["d"]}, "query"),
    ("rerank", {"query": "q", "documents": ["d", SURROGATE]}, "documents[1]"),
    ("rerank", {"query": "q", "documents": ["d"], "instruction": SURROGATE}, "instruction"),
    ("embed", {"texts": [SURROGATE]}, "texts[0]"),
    ("embed", {"texts": ["t"], "instruction": SURROGATE}, "instruction"),
    ("classify", {"inputs": ["x", SURROGATE], "labels": [" a"]}, "inputs[1]"),
    ("classify", {"inputs": ["x"], "labels": [SURROGATE]}, "labels[0]"),
    ("classify", {"inputs": ["x"], "labels": [" a"], "prefix": SURROGATE}, "prefix"),
    ("classify", {"inputs": ["x"], "labels": [" a"], "template": SURROGATE + " {input}"}, "template"),
    ("score", {"context": SURROGATE, "continuations": [" a"]}, "context"),
    ("score", {"context": "c", "continuations": [" a", SURROGATE]}, "continuations[1]"),
    ("predict", {"inputs": [SURROGATE]}, "inputs[0]"),
])
def test_text_that_is_not_unicode_is_refused_naming_its_field(contexts, task, request_, field):
    with pytest.raises(ValueError, match=rf"^{re.escape(field)} is not valid Unicode: .*U\+D800 at character 5"):
        encode(contexts, task, request_)


@pytest.mark.parametrize("task, request_, field", [
    ("rerank", {"query": "q", "documents": ["d", ""]}, "documents[1]"),
    ("embed", {"texts": [""]}, "texts[0]"),
    ("embed", {"texts": ["t", ""]}, "texts[1]"),
    ("classify", {"inputs": ["x", ""], "labels": [" a"]}, "inputs[1]"),
    ("classify", {"inputs": ["x"], "labels": [" a", ""]}, "labels[1]"),
    ("score", {"context": "c", "continuations": [" a", ""]}, "continuations[1]"),
    ("predict", {"inputs": ["x", ""]}, "inputs[1]"),
])
def test_an_empty_item_is_refused_by_every_task_naming_its_index(contexts, task, request_, field):
    with pytest.raises(ValueError, match=rf"^{re.escape(field)} is empty: "):
        encode(contexts, task, request_)


def test_too_many_items_are_counted_in_the_plural(contexts):
    with pytest.raises(ValueError, match=r"^5 documents are more than the limit of 4 per call: "):
        encode(contexts, "rerank", {"query": "q", "documents": ["d"] * 5})


class Untouchable:
    """A prompt tokenizer that fails the test when anything of it is used."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the request was tokenized ({name}) before it was refused")


def test_classify_bounds_inputs_times_labels_before_tokenizing(contexts):
    """Each (input, label) pair is a sequence: 3 x 2 = 6 > MAX_ITEMS is refused without tokenizing anything."""
    untouchable = replace(contexts["causal_lm"], prompts=Untouchable())
    request = {"inputs": ["a", "b", "c"], "labels": [" yes", " no"]}
    with pytest.raises(ValueError, match=r"^inputs x labels is 3 x 2 = 6 sequences, more than the limit of 4 per "
                                         r"call: send at most 2 inputs with 2 labels"):
        TASKS["classify"].encode(untouchable, request)
    job = encode(contexts, "classify", {"inputs": ["a", "b"], "labels": [" yes", " no"]})  # 4: at the limit
    assert len(job.item_cu) - 1 == MAX_ITEMS


def test_tokenize_bounds_each_text_by_the_token_limit_before_tokenizing_it():
    """Over the character bound: refused before anything is tokenized; under it but over the limit: refused by its
    exact count; within it: the encodings, affixes included."""
    prompts, counters = counted(make_tiny_tokenizer())
    with pytest.raises(ValueError, match=r"^inputs\[1\] has at least \d+ tokens; the limit is 100 per text: "):
        prompts.encode_user(["short", "word " * 400_000], True, 100, field="inputs")
    assert sum(c.chars for c in counters) == 0
    text = "radix tree " * 100
    with pytest.raises(ValueError, match=rf"^inputs\[0\] has {len(prompts.encode(text))} tokens; the limit is 100 "
                                         r"per text: "):
        prompts.encode_user([text], False, 100, field="inputs")
    (short,) = prompts.encode_user(["a radix tree"], False, 100, field="inputs")
    assert short.ids == prompts.encode("a radix tree")


def task_error(contexts, task: str, request: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as err:
        encode(contexts, task, request)
    return err.value


@pytest.mark.parametrize("names, task, request_, named", [
    (tei_fields.RERANK_STREAM_NAMES, "rerank", {"query": "q", "documents": ["d", "d", ""]},
     "message 2 of its query is empty"),
    (tei_fields.pair_names([3, 5]), "rerank", {"query": "q", "documents": ["d", SURROGATE]},
     "inputs[5][1] is not valid Unicode"),
    (tei_fields.pair_names([3, 5]), "rerank", {"query": SURROGATE, "documents": ["d", "d"]},
     "inputs[3][0] is not valid Unicode"),
    (tei_fields.predict_names([1, 4]), "predict", {"inputs": ["x", ""]}, "inputs[4] is empty"),
    (tei_fields.predict_names([1, 4]), "predict", {"inputs": ["x", LONG], "truncate": False},
     "inputs[4] gives a sequence of"),
    (tei_fields.pair_names([3, 5]), "rerank", {"query": "q", "documents": ["d", LONG], "truncate": False},
     "inputs[5][1] gives a sequence of"),
    (tei_fields.ONE_TEXT_EMBED_NAMES, "embed", {"texts": [LONG], "truncate": False}, "inputs gives a sequence of"),
])
def test_tei_names_a_task_error_by_the_field_and_index_the_client_sent(contexts, names, task, request_, named):
    """TEI's requests become task calls of their own shape (a stream's messages grouped by query, /predict's pairs
    by first text and its texts apart): an error names the client's field and index, renamed once."""
    assert str(task_error(contexts, task, request_).renamed(names)).startswith(named)


class LocalIngress:
    """What the routes tested here use of `deployments.ingress.Ingress` (`Server`), with the library's engine in
    place of the engine deployment: each call is encoded, run as a batch of its own and merged."""

    def __init__(self, model: str):
        self.args = AppArgs(model=model, tasks={"max_items": MAX_ITEMS})
        self.api_keys = load_api_keys(None, None)
        self.context = load_task_context(model, self.args.tasks)
        self.card = model_card(model, None, None, self.context)
        self.metrics = IngressMetrics()
        self.engine = Engine.from_pretrained(model, device="cpu", tasks=self.args.tasks)

    async def answer(self, request: TaskRequest, priority: Priority) -> Any:
        def run():  # one request alone: its priority class orders nothing
            job = task_for(request).encode(self.context, request)
            return task_for(request).merge(job, self.engine.run_jobs([job]))
        return await asyncio.to_thread(run)


@pytest.fixture(scope="module")
def http(tiny_model_dir):
    """`http(head)`: a client of the HTTP application over a tiny Qwen3 of that head."""
    clients = {}

    def get(head: str = "causal_lm") -> TestClient:
        if head not in clients:
            clients[head] = TestClient(build_app(LocalIngress(str(tiny_model_dir("qwen3", head)))),
                                       raise_server_exceptions=False)
        return clients[head]

    return get


def post(client: TestClient, path: str, body: dict) -> tuple[int, str]:
    """(status, error message in the route's dialect) of a POST; the body as ASCII JSON, so a lone surrogate
    travels as the escape `\\ud800`, as a client's JSON encoder writes it."""
    reply = client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    if reply.status_code == 200:
        return 200, ""
    error = reply.json()
    message = error.get("message") or error["error"]  # Cohere's {message}, TEI's {error}, OpenAI's {error: {message}}
    return reply.status_code, message if isinstance(message, str) else message["message"]


@pytest.mark.parametrize("inputs, count", [
    ([[f"query {i}", "a document"] for i in range(MAX_ITEMS + 1)], MAX_ITEMS + 1),
    ([["q", "d"], "a text", ["other q", "d"], "another text", "a third text"], 5),
])
def test_http_predict_counts_every_pair_and_text_against_the_item_limit(http, inputs, count):
    """Each distinct first text of a pair is a rerank call of its own: the request's items are bounded together."""
    status, message = post(http(), "/predict", {"inputs": inputs})
    assert status == 422 and message.startswith(f"{count} inputs are more than the limit of {MAX_ITEMS} per call")


def test_http_predict_answers_up_to_the_item_limit(http):
    status, message = post(http(), "/predict", {"inputs": [[f"query {i}", "a document"] for i in range(MAX_ITEMS)]})
    assert status == 200, message


def test_http_tokenize_bounds_each_input_by_the_token_limit(http):
    status, message = post(http(), "/tokenize", {"inputs": ["short", LONG]})
    assert status == 422 and re.match(r"inputs\[1\] has \d+ tokens; the limit is 2048 per text: ", message), message
    status, message = post(http(), "/tokenize", {"inputs": "word " * 1_000_000})
    assert status == 422 and re.match(r"inputs\[0\] has at least \d+ tokens; the limit is 2048 per text", message)
    status, message = post(http(), "/tokenize", {"inputs": ["x"] * (MAX_ITEMS + 1)})
    assert status == 422 and message.startswith(f"{MAX_ITEMS + 1} inputs are more than the limit of {MAX_ITEMS}")
    assert post(http(), "/tokenize", {"inputs": ["short", "a radix tree"]}) == (200, "")


@pytest.mark.parametrize("path, body, field", [
    ("/rerank", {"query": SURROGATE, "texts": ["d"]}, "query"),
    ("/rerank", {"query": "q", "texts": ["d", SURROGATE]}, "texts[1]"),
    ("/embed", {"inputs": SURROGATE}, "inputs[0]"),
    ("/predict", {"inputs": [["q", "d"], "a text", SURROGATE]}, "inputs[2]"),
    ("/predict", {"inputs": [["q", "d"], ["q", SURROGATE]]}, "inputs[1][1]"),
    ("/predict", {"inputs": [["q", "d"], [SURROGATE, "d"]]}, "inputs[1][0]"),
    ("/tokenize", {"inputs": ["a", SURROGATE]}, "inputs[1]"),
    ("/v1/embeddings", {"input": [SURROGATE]}, "input[0]"),
    ("/v1/rerank", {"query": "q", "documents": [{"text": SURROGATE}]}, "documents[0]"),
    ("/v2/rerank", {"query": SURROGATE, "documents": ["d"]}, "query"),
])
def test_http_text_that_is_not_unicode_is_a_client_error_on_every_route(http, path, body, field):
    status, message = post(http(), path, body)
    assert status == 422 and message.startswith(f"{field} is not valid Unicode"), (status, message)


@pytest.mark.parametrize("path, body, field", [
    ("/rerank", {"query": "q", "texts": ["d", ""]}, "texts[1]"),
    ("/embed", {"inputs": ""}, "inputs[0]"),
    ("/predict", {"inputs": [["q", "d"], ["q", ""]]}, "inputs[1][1]"),
    ("/predict", {"inputs": [["q", "d"], ""]}, "inputs[1]"),
    ("/tokenize", {"inputs": ""}, "inputs[0]"),
    ("/v1/embeddings", {"input": ["a", ""]}, "input[1]"),
    ("/v2/rerank", {"query": "q", "documents": [""]}, "documents[0]"),
])
def test_http_an_empty_text_is_refused_on_every_route(http, path, body, field):
    status, message = post(http(), path, body)
    assert status == 422 and message.startswith(f"{field} is empty"), (status, message)


def test_openai_refuses_an_input_over_the_limit_as_openai_does(http):
    """OpenAI answers an input over the context length with an error, never a silently cut embedding; TEI's
    /embed refuses one unless the client asks to truncate."""
    status, message = post(http(), "/v1/embeddings", {"input": ["a short text", LONG]})
    assert status == 422 and "input[1] gives a sequence of" in message and "the limit is 2048" in message, message
    status, message = post(http(), "/embed", {"inputs": ["a short text", LONG]})
    assert status == 422 and "inputs[1] gives a sequence of" in message, message
