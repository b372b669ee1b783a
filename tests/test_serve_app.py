"""The whole Ray Serve application on a local Ray: the library's answers through DeploymentHandles, bad input,
split requests, and an IndexBuilder actor killed mid-run."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray
from ray import serve

from deployments.app import build
from radix_core import Engine
from radix_core.tasks import TASKS

DOCS = [f"passage {i}: a radix tree stores strings by shared prefixes, {'and more ' * (i % 5)}" for i in range(12)]
QUERY = "what is a radix tree"
# A custom rerank template set as serve_config.yaml would set it (tasks.templates): the served answers equal the
# library's with the same template only when it reaches the ingress's encoding and the engine.
TASK_CONFIG = {"templates": {"rerank": {
    "prefix": "<|im_start|>system\nJudge whether the Document answers the Query.<|im_end|>\n<|im_start|>user\n",
    "body": "<Query>: {query}\n<Document>: {document}", "suffix": "<|im_end|>\n<|im_start|>assistant\n"}}}


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return str(tiny_model_dir("qwen3", "causal_lm"))


@pytest.fixture(scope="module")
def app(model_dir, serve_cluster):
    """Two engine replicas and the ingress on the shared 2-CPU local Ray; small sub-requests force splitting."""
    serve_cluster.ensure()
    try:
        handle = serve.run(build({"model": model_dir, "tasks": TASK_CONFIG, "limits": {"max_request_tokens": 120},
                                  "batching": {"max_batch_tokens": 4096},
                                  "placement": {"engine": {"num_replicas": 2, "cpus": 0.5}, "ingress": {"cpus": 0.5}}}),
                           name="radixserve", route_prefix=None)
        yield handle
    finally:
        serve_cluster.clear()


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine.from_pretrained(model_dir, device="cpu", tasks=TASK_CONFIG)


def call(handle, task: str, request: dict):
    return handle.call.remote(task, request).result(timeout_s=60)


def parts_submitted(handle) -> int:
    """Sub-jobs the (one) ingress replica has sent to the engine so far."""
    return handle.info.remote().result(timeout_s=30)["submitted_parts"]


@pytest.mark.serve
@pytest.mark.timeout(300)
def test_served_results_equal_the_library(app, engine):
    served = call(app, "rerank", {"query": QUERY, "documents": DOCS, "top_n": 5})
    local = engine.rerank(QUERY, DOCS, top_n=5)
    assert [h.index for h in served.results] == [h.index for h in local.results]
    np.testing.assert_allclose([h.score for h in served.results], [h.score for h in local.results], atol=1e-5)
    assert served.usage.input_tokens == local.usage.input_tokens

    embedded = call(app, "embed", {"texts": DOCS[:5], "instruction": "Find passages about trees"})
    np.testing.assert_allclose(embedded.embeddings,
                               engine.embed(DOCS[:5], instruction="Find passages about trees").embeddings, atol=1e-5)

    classified = call(app, "classify", {"inputs": ["great", "awful", "fine"], "labels": ["yes", "no"],
                                        "prefix": "Is it good? "})
    np.testing.assert_allclose(classified.probabilities,
                               engine.classify(["great", "awful", "fine"], ["yes", "no"], prefix="Is it good? ")
                               .probabilities, atol=1e-5)

    scored = call(app, "score", {"context": "The capital of France is", "continuations": [" Paris", " Rome"]})
    local_scores = engine.score("The capital of France is", [" Paris", " Rome"]).scores
    np.testing.assert_allclose([s.logprob for s in scored.scores], [s.logprob for s in local_scores], atol=1e-5)


@pytest.mark.serve
@pytest.mark.timeout(120)
def test_bad_input_is_refused_at_the_ingress_and_the_server_keeps_serving(app):
    before = parts_submitted(app)
    with pytest.raises(ValueError, match="documents is empty"):
        call(app, "rerank", {"query": QUERY, "documents": []})
    with pytest.raises(ValueError, match="unknown rerank request keys"):
        call(app, "rerank", {"query": QUERY, "documents": DOCS, "colour": "red"})
    with pytest.raises(ValueError, match="unknown task 'summarize'"):
        call(app, "summarize", {"texts": DOCS})
    with pytest.raises(ValueError, match="continuations\\[1\\] is empty"):
        call(app, "score", {"context": "c", "continuations": ["a", ""]})
    assert parts_submitted(app) == before  # nothing reached an engine replica
    assert len(call(app, "rerank", {"query": QUERY, "documents": DOCS[:2]}).results) == 2
    assert parts_submitted(app) > before


@pytest.mark.serve
@pytest.mark.timeout(180)
def test_a_killed_index_builder_is_recreated(app):
    killed = index_builders()
    assert len(killed) == 2  # one per engine replica
    for actor in killed.values():
        ray.kill(actor)
    for _ in range(3):  # concurrent: a batch formed while another runs is built by its replica's (dead) builder, which
        # that build replaces; a batch formed on an idle replica is built on its compute thread
        responses = [app.call.remote("rerank", {"query": QUERY, "documents": DOCS}) for _ in range(4)]
        assert [len(response.result(timeout_s=60).results) for response in responses] == [len(DOCS)] * 4
    info = app.info.remote().result(timeout_s=30)
    assert info["index_builder"] == "actor" and info["tasks"] == list(TASKS)
    # a replica whose builds did not find its builder dead replaces it at its next health check: leave the app whole
    # for the next test, so a new actor's start-up does not land in its latency measurement
    deadline = time.monotonic() + 60
    while len(index_builders()) < len(killed) and time.monotonic() < deadline:
        time.sleep(0.5)
    builders = index_builders()
    assert len(builders) == len(killed), "a replica did not replace its IndexBuilder within 60 s"
    assert ray.get([builder.ping.remote() for builder in builders.values()], timeout=60) == [True] * len(builders)


def index_builders() -> dict[str, ray.actor.ActorHandle]:
    """The live IndexBuilder actors by name (`index-builder-<replica id>-<generation>`)."""
    named = ray.util.list_named_actors(all_namespaces=True)
    builders = {}
    for actor in named:
        if actor["name"].startswith("index-builder-"):
            try:
                builders[actor["name"]] = ray.get_actor(actor["name"], namespace=actor["namespace"])
            except ValueError:  # killed, not yet forgotten
                continue
    return builders


@pytest.mark.serve
@pytest.mark.timeout(240)
def test_small_requests_keep_their_latency_while_huge_documents_arrive(app):
    """Two 15 MB documents cost about what maximum-length ones do (cut by characters, then truncated), off the
    ingress's event loop: small requests sent meanwhile stay within 3 s or 10x their unloaded latency."""
    small = {"query": QUERY, "documents": DOCS[:2]}

    def timed() -> float:
        began = time.perf_counter()
        call(app, "rerank", small)
        return time.perf_counter() - began

    unloaded = float(np.median([timed() for _ in range(5)]))
    huge = "tries share prefixes and radix trees compress them " * 300_000  # 15.6 MB
    pending = [app.call.remote("rerank", {"query": f"{QUERY} {i}", "documents": [huge]}) for i in range(2)]
    latencies, deadline = [], time.monotonic() + 120
    while not all(_done(p) for p in pending) and len(latencies) < 40 and time.monotonic() < deadline:
        latencies.append(timed())
    bound = max(3.0, 10 * unloaded)
    assert latencies and max(latencies) < bound, (unloaded, latencies)
    for response in pending:
        assert len(response.result(timeout_s=120).results) == 1  # truncated to the limit, not refused


def _done(response) -> bool:
    try:
        response.result(timeout_s=0)
    except TimeoutError:
        return False
    return True
