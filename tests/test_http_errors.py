"""The HTTP status of each error (through the gRPC classifier, not a second one), and the model card's primary
task rule on tiny checkpoints. No Ray cluster: the errors are Ray's and the batcher's own classes."""

from __future__ import annotations

import json
import shutil

import pytest
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from starlette.exceptions import HTTPException

from deployments.batcher import QueueFullError
from deployments.http.errors import api_error
from deployments.http.registry import DIALECTS
from deployments.model_card import model_card
from radix_core.errors import RequestError
from radix_core.tasks import TaskConfig, load_task_context
from radix_core.tiny_models import make_tiny_model


@pytest.mark.parametrize("err, status, name", [
    (RequestError("documents is empty", "give at least one"), 422, "validation"),
    (BackPressureError(num_queued_requests=3, max_queued_requests=2), 429, "overloaded"),
    (DeploymentUnavailableError("engine"), 503, "unhealthy"),
    (RuntimeError("a bug with a secret path /etc/x"), 500, "backend"),
    (HTTPException(405, "Method Not Allowed"), 405, "method_not_allowed"),
])
def test_errors_get_their_status_and_kind(err, status, name):
    error = api_error(err)
    assert (error.status_code, error.kind.name) == (status, name)
    assert (error.headers or {}).get("Retry-After") == ("1" if status == 429 else None)
    if status == 500:
        assert "secret" not in error.detail and "RuntimeError" in error.detail


def test_a_full_batch_queue_says_when_to_retry():
    error = api_error(QueueFullError("batch queue full: retry in about 2.3 s", 2.3))
    assert (error.status_code, error.headers["Retry-After"]) == (429, "3")
    assert error.detail.startswith("batch queue full")


@pytest.mark.parametrize("dialect, body", [
    ("cohere", {"message": "m"}),
    ("openai", {"error": {"message": "m", "type": "validation", "param": None, "code": 422}}),
    ("tei", {"error": "m", "error_type": "validation"}),
])
def test_each_dialect_writes_its_error_body(dialect, body):
    (found,) = [d for d in DIALECTS if d.name == dialect]
    assert found.error_body(api_error(RequestError("m")).kind, "m") == body
    json.dumps(body)


def context(path):
    return load_task_context(str(path), TaskConfig())


def test_primary_task_from_the_checkpoint(tiny_model_dir, tmp_path):
    reranker = tiny_model_dir("qwen3", "causal_lm")
    assert model_card(str(reranker), None, None, context(reranker)).primary_task == "rerank"
    cross_encoder = tiny_model_dir("qwen3", "seq_cls")
    card = model_card(str(cross_encoder), "mine", None, context(cross_encoder))
    assert (card.primary_task, card.served_model_name, len(card.labels)) == ("rerank", "mine", 1)
    assert card.accepts(None) and card.accepts("mine") and card.accepts(str(cross_encoder))
    assert not card.accepts("other")
    assert model_card(str(tiny_model_dir("llama", "causal_lm")), None, None,
                      context(tiny_model_dir("llama", "causal_lm"))).primary_task == "embed"
    embedder = shutil.copytree(reranker, tmp_path / "embedder")
    (embedder / "modules.json").write_text("[]")
    assert model_card(str(embedder), None, None, context(embedder)).primary_task == "embed"
    assert model_card(str(reranker), None, "classify", context(reranker)).primary_task == "classify"
    classifier = make_tiny_model(tmp_path / "classifier", "qwen3", "seq_cls", num_labels=3)
    card = model_card(str(classifier), None, None, context(classifier))
    assert (card.primary_task, card.labels) == ("classify", ("LABEL_0", "LABEL_1", "LABEL_2"))
