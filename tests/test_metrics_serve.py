"""The application's metrics as Prometheus scrapes them: a local Ray whose metrics agent serves Prometheus text on a
loopback port, the application with API keys behind Ray Serve's gRPC proxy, known traffic (answered calls of two
tasks over radixserve.v1 and tei.v1, bad input, a missing key), then the scrape:

* `radixserve_requests_total` by task, api and code equals what was sent, INVALID_ARGUMENT and UNAUTHENTICATED
  included; the computed-, input- and cached-token counters equal the sums of the `usage` the answers carried;
* the prefix cache (a budget of 256 tiny rows, so that this traffic evicts): the replicas' hit tokens are at least
  what the answers read from it, within the tokens looked up; evictions, bytes held within the budget, the budget;
* the compression histogram, the batch counter and each stage histogram have one observation per batch the
  engine replicas ran (their own count, from `info`);
* a burst of one prefix key's requests over two engine replicas with `load_factor: 1` spills, a key whose
  ring owner did far more recent work than the other replica moves, and killed IndexBuilders are counted as restarts;
* every metric the Grafana dashboard (k8s/monitoring/) queries is among those exported;
* a client's `x-request-id` comes back in the trailing metadata and names the call in the ingress's and the
  engine replica's log lines (its batch's DEBUG line), so one request can be followed from ingress to batch.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import pytest
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from serving import SERVICERS, free_port, held_compute, wait_for

from deployments.app import build
from radixserve.tei.v1 import tei_pb2 as tei
from radixserve.tei.v1.tei_pb2_grpc import RerankStub as TeiRerankStub
from radixserve.v1 import scoring_pb2 as pb
from radixserve.v1.scoring_pb2_grpc import ScoringStub

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "k8s" / "monitoring" / "radixserve-dashboard.json"
KEY = "metrics-key"
CACHE_BYTES = 256 * 1280  # 256 rows of the tiny preset's K/V and states (1,280 bytes each)
AUTH = [("authorization", f"Bearer {KEY}")]
TRACE_ID = "trace-metrics-7"
# a batch that does not start on an idle replica waits this long to fill: a burst's requests stay outstanding on their
# key's owner while the ingress routes the rest, so they spill however fast the replicas answer (at the default
# 10 ms, a CI run whose ingress routed the burst no faster than the replica answered it saw no spill)
BURST_WAIT_S = 0.5
DOCS = [f"passage {i}: a radix tree stores strings by shared prefixes, {'and more ' * i}" for i in range(5)]
pytestmark = [pytest.mark.serve, pytest.mark.slow, pytest.mark.timeout(240)]  # a Ray of its own


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory, start_local_ray_with_metrics):
    """(gRPC channel, metrics URL, Serve log directory) of the keyed application, DEBUG logs on."""
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys"
    keys_file.write_text(KEY + "\n")
    metrics_port, grpc_port, http_port = free_port(), free_port(), free_port()
    start_local_ray_with_metrics(metrics_port)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    try:
        serve.start(grpc_options={"port": grpc_port, "grpc_servicer_functions": SERVICERS},
                    http_options={"host": "127.0.0.1", "port": http_port})
        serve.run(build({"model": str(tiny_model_dir("qwen3", "causal_lm")), "auth": {"api_keys_file": str(keys_file)},
                         "router": {"load_factor": 1.0}, "limits": {"max_request_tokens": 150},
                         "batching": {"batch_wait_timeout_s": BURST_WAIT_S},
                         "engine": {"prefix_cache_bytes": CACHE_BYTES},
                         "placement": {"engine": {"num_replicas": 2, "cpus": 0.5}, "ingress": {"cpus": 0.5}}}),
                  name="radixserve", route_prefix="/", logging_config={"log_level": "DEBUG"})
        wait_serving(channel)
        logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
        yield channel, f"http://127.0.0.1:{metrics_port}/metrics", logs, f"http://127.0.0.1:{http_port}"
    finally:
        channel.close()
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def wait_serving(channel: grpc.Channel, timeout_s: float = 90) -> None:
    """Until grpc.health.v1 Check (not metered) answers SERVING through the proxy."""
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, f"the application did not serve within {timeout_s} s"
        time.sleep(0.5)


def send(call, request, metadata=AUTH) -> tuple[str, object, grpc.Call | None]:
    """(status code name, reply or None, the call) of one unary call."""
    try:
        reply, state = call.with_call(request, timeout=60, metadata=metadata)
        return "OK", reply, state
    except grpc.RpcError as err:
        return err.code().name, None, err


def post(url: str, body: dict, key: str | None) -> tuple[int, dict[str, str]]:
    """(status, headers) of a JSON POST; an error status is returned, not raised."""
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers)


def scrape(url: str) -> dict[str, list]:
    """Metric family name -> its samples, from Ray's Prometheus endpoint; of the request metrics only those the
    ingress recorded (tagged with the application): request meters this test process recorded itself in other
    tests (tests/test_metrics.py, without a cluster) are exported too once it joins one."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {family.name: [s for s in family.samples
                          if "radixserve_request" not in s.name or s.labels.get("application") == "radixserve"]
            for family in text_string_to_metric_families(text)}


def total(families: dict[str, list], sample_name: str, **labels: str) -> float:
    """Sum of the samples named `sample_name` whose labels include `labels`."""
    family = re.sub(r"_(total|count|sum|bucket)$", "", sample_name)
    return sum(s.value for s in families.get(family, []) + families.get(sample_name, [])
               if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()))


def gauge(families: dict[str, list], name: str) -> float:
    """Sum of a gauge's samples (one per replica); `total` would count a gauge's family twice, as its name is both."""
    return sum(s.value for s in families.get(name, []))


def by_labels(families: dict[str, list], sample_name: str, keys: tuple[str, ...]) -> Counter:
    family = re.sub(r"_total$", "", sample_name)
    counts = Counter()
    for s in families.get(family, []):
        if s.name == sample_name:
            counts[tuple(s.labels[k] for k in keys)] += s.value
    return counts


def dashboard_metrics() -> set[str]:
    """Every `ray_*` metric name the dashboard's panels query (histogram suffixes stripped)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    return {re.sub(r"_(bucket|count|sum)$", "", name) for e in exprs for name in re.findall(r"\bray_[a-z_]+", e)}


def index_builders() -> list[tuple[str, str]]:
    """(name, namespace) of the live IndexBuilder actors."""
    return [(a["name"], a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("index-builder-")]


def engine_batches(timeout_s: float = 30) -> int:
    """Batches both engine replicas ran and did not fail, by their own count. An `info` call reaches one: called
    through a handle of the engine deployment made here, whose router has nothing else outstanding, so equal loads
    spread its calls over both replicas (through the ingress, its router sends each call to the replica it counts
    least loaded: in one CI run 30 s of calls all reached one replica)."""
    handle = serve.get_deployment_handle("EngineReplica", app_name="radixserve")
    seen = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < 2:
        info = handle.info.remote().result(timeout_s=30)
        seen[info["replica"]] = info["batcher"]["num_batches"] - info["batcher"]["num_failed_batches"]
        assert time.monotonic() < deadline, f"info reached only {len(seen)} of 2 engine replicas"
    return sum(seen.values())


def exported_names(families: dict[str, list]) -> set[str]:
    return set(families) | {s.name for samples in families.values() for s in samples}


def test_exported_metrics_match_the_traffic(served):
    channel, url, logs, http = served
    scoring, tei_rerank = ScoringStub(channel), TeiRerankStub(channel)
    sent, usages = Counter(), []
    calls = ([(scoring.Rerank, pb.RerankRequest(query=f"query {i}", documents=DOCS), AUTH) for i in range(3)]
             + [(scoring.Embed, pb.EmbedRequest(texts=DOCS[:3]), AUTH)] * 2
             + [(scoring.Rerank, pb.RerankRequest(query="q", documents=[]), AUTH)]  # no documents
             + [(scoring.Embed, pb.EmbedRequest(texts=DOCS, dimensions=-3), AUTH)]  # a bad dimension
             + [(scoring.Rerank, pb.RerankRequest(query="q", documents=DOCS), [])] * 2  # no key
             + [(tei_rerank.Rerank, tei.RerankRequest(query="q", texts=DOCS[:2]), AUTH)])
    for call, request, metadata in calls:
        code, reply, _ = send(call, request, metadata)
        api = "tei_grpc" if isinstance(request, tei.RerankRequest) else "grpc"
        task = "rerank" if "Rerank" in type(request).__name__ else "embed"
        sent[(task, api, code)] += 1
        if code == "OK" and api == "grpc":
            usages.append((reply.usage.input_tokens, reply.usage.computed_tokens, reply.usage.cached_tokens))
    assert {key[2] for key in sent} == {"OK", "INVALID_ARGUMENT", "UNAUTHENTICATED"}, sent

    http_usages = []
    for path, body, key, label in [("/v2/rerank", {"query": "q", "documents": DOCS}, KEY, ("rerank", "http_cohere")),
                                   ("/embed", {"inputs": DOCS[:2]}, KEY, ("embed", "http_tei")),
                                   ("/v1/embeddings", {"input": "a text"}, None, ("none", "http_openai"))]:
        status, headers = post(http + path, body, key)
        sent[(*label, {200: "OK", 401: "UNAUTHENTICATED"}[status])] += 1
        if status == 200:
            http_usages.append((int(headers["x-radixserve-input-tokens"]),
                                int(headers["x-radixserve-computed-tokens"]),
                                int(headers["x-radixserve-cached-tokens"])))
    assert len(http_usages) == 2

    code, reply, state = send(scoring.Rerank, pb.RerankRequest(query="traced", documents=DOCS[:2]),
                              AUTH + [("x-request-id", TRACE_ID)])
    assert code == "OK" and ("x-request-id", TRACE_ID) in tuple(state.trailing_metadata())
    sent[("rerank", "grpc", "OK")] += 1
    usages.append((reply.usage.input_tokens, reply.usage.computed_tokens, reply.usage.cached_tokens))

    # one key, more than its fair share: it spills. Each request's parts cost the key's owner its documents' rows
    # only (the owner has the query cached); the replicas' compute is held until all 16 arrived, so several are
    # outstanding on the owner when the ingress routes the next, however fast the replicas answer (a CI run whose
    # replicas answered each before the ingress routed the next saw no spill)
    with held_compute() as ongoing:
        burst = [scoring.Rerank.future(pb.RerankRequest(query="one shared query", documents=DOCS * 8), timeout=60,
                                       metadata=AUTH) for _ in range(16)]
        wait_for(lambda: ongoing() >= len(burst), 30, "the burst reaching the engine replicas")
    for _ in range(2):  # IndexBuilders killed: the next batch built while one runs, or the health probe, starts one
        for name, namespace in index_builders():
            ray.kill(ray.get_actor(name, namespace=namespace))
        burst += [scoring.Rerank.future(pb.RerankRequest(query=f"after a kill {i}", documents=DOCS[:2]), timeout=60,
                                        metadata=AUTH) for i in range(4)]
    for future in burst:
        reply = future.result()
        sent[("rerank", "grpc", "OK")] += 1
        usages.append((reply.usage.input_tokens, reply.usage.computed_tokens, reply.usage.cached_tokens))

    # one key's large requests one after another (never two outstanding: no spill), so that its home replica did far
    # more recent work than the other; then 12 small keys twice each: any of them whose ring owner is that replica
    # (all 12 on the other: 1 in 4,096) moves to the other on its second request
    for query, documents in [("steady query", DOCS * 8)] * 24 + [(f"small key {i % 12}", DOCS[:2]) for i in range(24)]:
        reply = scoring.Rerank(pb.RerankRequest(query=query, documents=documents), timeout=60, metadata=AUTH)
        sent[("rerank", "grpc", "OK")] += 1
        usages.append((reply.usage.input_tokens, reply.usage.computed_tokens, reply.usage.cached_tokens))

    batches = engine_batches()
    deadline = time.monotonic() + 60
    # the agent exports every second: wait until the last request and batch are in, and a killed builder was
    # replaced (a replica idle after the kills builds on its compute thread; its health probe, every 10 s, does it)
    while True:
        families = scrape(url)
        counted = by_labels(families, "ray_radixserve_requests_total", ("task", "api", "code"))
        if (counted == sent and total(families, "ray_radixserve_batch_compression_count") == batches
                and total(families, "ray_radixserve_index_builder_restarts_total") >= 1) \
                or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert counted == sent
    assert total(families, "ray_radixserve_request_input_tokens_total", api="grpc") == sum(u[0] for u in usages)
    assert total(families, "ray_radixserve_request_computed_tokens_total", api="grpc") == sum(u[1] for u in usages)
    assert total(families, "ray_radixserve_request_cached_tokens_total", api="grpc") == sum(u[2] for u in usages)
    assert sum(u[1] for u in usages) < sum(u[0] for u in usages)  # shared prefixes computed once
    read = sum(u[2] for u in usages + http_usages)
    assert read > 0  # the burst of one query read its prefix from the cache
    hits, lookups = (total(families, f"ray_radixserve_prefix_cache_{name}_tokens_total") for name in ("hit", "lookup"))
    assert read <= hits < lookups  # hits also count what tei.v1 answers read, whose replies carry no usage
    assert total(families, "ray_radixserve_prefix_cache_evictions_total") >= 1
    assert 0 < gauge(families, "ray_radixserve_prefix_cache_bytes") <= 2 * CACHE_BYTES
    assert gauge(families, "ray_radixserve_prefix_cache_budget_bytes") == 2 * CACHE_BYTES
    for api, (used,) in (("http_cohere", http_usages[:1]), ("http_tei", http_usages[1:])):
        assert total(families, "ray_radixserve_request_input_tokens_total", api=api) == used[0], api
        assert total(families, "ray_radixserve_request_computed_tokens_total", api=api) == used[1], api

    assert batches > 0 and total(families, "ray_radixserve_batch_compression_count") == batches
    assert total(families, "ray_radixserve_batches_total") == batches
    for stage in ("queue", "build", "wait", "forward"):
        assert total(families, "ray_radixserve_batch_stage_seconds_count", stage=stage) == batches, stage
    assert total(families, "ray_radixserve_queue_tokens") == 0
    assert total(families, "ray_radixserve_router_keys") >= 1
    assert total(families, "ray_radixserve_router_spills_total") >= 1
    assert total(families, "ray_radixserve_router_key_moves_total") >= 1
    assert total(families, "ray_radixserve_index_builder_restarts_total") >= 1

    missing = dashboard_metrics() - exported_names(families)
    assert not missing, f"the dashboard queries metrics Ray did not export: {sorted(missing)}"

    lines = {path.name: [line for line in path.read_text().splitlines() if TRACE_ID in line]
             for path in logs.glob("replica_*.log")}
    assert any("Ingress" in name and any("OK" in line for line in found) for name, found in lines.items()), lines
    assert any("EngineReplica" in name and any("batch of" in line for line in found)
               for name, found in lines.items()), lines
