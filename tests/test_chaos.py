"""Killed actors and a lost node under load, through the real gRPC proxy: nothing hangs, every request ends OK or
with an explicit status code (sent = OK + refused), in-flight requests on a killed engine replica fail fast with
UNAVAILABLE, and the client's retries land on a live replica."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter

import grpc
import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster

from serving import SERVICERS, free_port, held_compute, replica_actors, wait_for

from deployments.app import build
from radixserve.client import ScoringClient

pytestmark = [pytest.mark.serve, pytest.mark.slow]

DOCS = [f"passage {i}: a radix tree stores strings by shared prefixes, {'and more ' * i}" for i in range(4)]
EXPLICIT = {"OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}


class Load:
    """`clients` threads, each sending `per_client` rerank requests one after another through its own client (none
    started after `deadline_s`, when given); records each request's final status and when it ended."""

    def __init__(self, address: str, clients: int = 4, per_client: int = 6, retries: int = 0, timeout_s: float = 60,
                 deadline_s: float | None = None):
        self.outcomes: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        self._stop_at = None if deadline_s is None else time.monotonic() + deadline_s
        self._threads = [threading.Thread(target=self._client, args=(address, i, per_client, retries, timeout_s))
                         for i in range(clients)]
        self.sent = clients * per_client

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def join(self, timeout_s: float) -> Counter:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "a request hung past the test's deadline"
        return Counter(code for code, _ in self.outcomes)

    def _client(self, address: str, client: int, per_client: int, retries: int, timeout_s: float) -> None:
        with ScoringClient(address, timeout_s=timeout_s, retries=retries, backoff_s=0.5) as scoring:
            for i in range(per_client):
                if self._stop_at is not None and time.monotonic() > self._stop_at:
                    break
                try:
                    scoring.rerank(f"query {client} {i}", DOCS)
                    code = "OK"
                except grpc.RpcError as err:
                    code = err.code().name
                with self._lock:
                    self.outcomes.append((code, time.monotonic()))


def deploy(model_dir: str, port: int, placement: dict | None = None, **args) -> str:
    """The application with small CPU reservations; `placement`'s sections replace those they name."""
    serve.start(grpc_options={"port": port, "grpc_servicer_functions": SERVICERS},
                http_options={"host": "127.0.0.1", "port": free_port()}, proxy_location="HeadOnly")
    serve.run(build({"model": model_dir, "batching": {"batch_wait_timeout_s": 0.05},
                     "placement": {"engine": {"cpus": 0.5}, "ingress": {"cpus": 0.25}, **(placement or {})}, **args}),
              name="radixserve", route_prefix="/")
    address = f"127.0.0.1:{port}"
    with ScoringClient(address, timeout_s=60, retries=10, backoff_s=0.5) as client:
        client.rerank("warm up", DOCS)  # until the proxy routes to the application
    return address


@pytest.fixture
def local_app(tiny_model_dir, start_local_ray):
    start_local_ray()
    try:
        yield lambda **args: deploy(str(tiny_model_dir("qwen3", "causal_lm")), free_port(), **args)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


@pytest.mark.timeout(300)
def test_a_killed_engine_replica_fails_in_flight_requests_fast_and_retries_succeed(local_app):
    address = local_app(placement={"engine": {"num_replicas": 2, "cpus": 0.5}})
    raw = Load(address, retries=0).start()  # no retries: what in-flight requests see
    retried = Load(address, retries=6).start()
    time.sleep(1.0)
    killed_at = time.monotonic()
    ray.kill(replica_actors("EngineReplica")[0], no_restart=False)
    raw_codes, retried_codes = raw.join(180), retried.join(180)
    assert sum(raw_codes.values()) == raw.sent and set(raw_codes) <= EXPLICIT, raw_codes
    failed_after = [at - killed_at for code, at in raw.outcomes if code == "UNAVAILABLE"]
    assert all(delay < 3.0 for delay in failed_after), failed_after  # not left waiting for a dead actor
    assert retried_codes == Counter({"OK": retried.sent}), retried_codes


@pytest.mark.timeout(300)
@pytest.mark.parametrize("topology", ["split", "combined"])
def test_a_killed_ingress_replica_loses_nothing_silently(local_app, topology):
    """With `placement.topology: combined` the killed replica holds the engine too: its restart loads the model
    again, and the clients' retries wait for it."""
    address = local_app(placement={"topology": topology})
    load = Load(address, retries=6).start()
    time.sleep(1.0)
    ray.kill(replica_actors("Ingress")[0], no_restart=False)
    codes = load.join(180)
    assert sum(codes.values()) == load.sent and set(codes) <= EXPLICIT, codes
    assert codes["OK"] >= load.sent // 2, codes
    with ScoringClient(address, timeout_s=60, retries=10, backoff_s=0.5) as client:
        assert len(client.rerank("after the kill", DOCS).results) == len(DOCS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("topology", ["split", "combined"])
def test_a_call_in_flight_on_a_killed_ingress_replica_ends_unavailable(local_app, topology):
    """Ray's proxy answers INTERNAL when the replica it forwarded a call to dies; the call never reached an answer
    and is safe to retry, so the client is told UNAVAILABLE. Combined, the call dies with its batch's replica."""
    address = local_app(placement={"topology": topology})
    docs = [f"passage {i}: {'a radix tree stores strings by their shared prefixes ' * 12}" for i in range(1000)]
    outcome: list[tuple[str, float]] = []

    def call() -> None:
        with ScoringClient(address, timeout_s=120, retries=0) as client:
            try:
                client.rerank("a query long enough to matter", docs)
                outcome.append(("OK", time.monotonic()))
            except grpc.RpcError as err:
                outcome.append((err.code().name, time.monotonic()))

    caller = threading.Thread(target=call)
    with held_compute() as ongoing:  # the call waits at the engine, in flight at the ingress, however fast the machine
        caller.start()
        wait_for(lambda: ongoing() >= 1, 60, "the call reaching the engine replica")
        killed_at = time.monotonic()
        ray.kill(replica_actors("Ingress")[0], no_restart=False)
    caller.join(150)
    assert outcome and outcome[0][1] > killed_at, f"the call ended before the kill: {outcome}"
    assert outcome[0][0] == "UNAVAILABLE", outcome


HOGS = 4  # busy processes at the node's priority, twice the CI machine's cores
BUSY_S = 35.0  # longer than a health probe period (10 s) times the failures that restart a replica (3)


@pytest.mark.timeout(300)
def test_an_engine_replica_survives_a_busy_node(local_app):
    """Noisy neighbours are normal on a node: with every core taken by processes at the node's priority, the
    engine replica keeps its health probes answered and every call is answered (or refused retryably), and no
    replica is replaced. The replicas run at `placement.niceness` (0), which their processes must show."""
    address = local_app()
    engines = {actor._actor_id for actor in replica_actors("EngineReplica")}
    nice = {ray.get(actor.__ray_call__.remote(lambda self: os.nice(0))) for actor in replica_actors("EngineReplica")}
    assert nice == {0}, nice
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOGS)]
    try:
        load = Load(address, clients=2, per_client=1_000_000, retries=6, deadline_s=BUSY_S).start()
        codes = load.join(BUSY_S + 120)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert set(codes) <= EXPLICIT and codes["OK"] >= 1, codes
    assert {actor._actor_id for actor in replica_actors("EngineReplica")} == engines, "an engine replica was replaced"


@pytest.mark.timeout(400)
def test_a_lost_worker_node_leaves_no_request_unanswered(tiny_model_dir, serve_cluster, workdir, monkeypatch):
    """A head node (the proxy, the ingress) and a worker node holding the engine replicas; the worker is removed
    under load and the engine comes back on the head."""
    serve_cluster.stop()  # a cluster of two nodes of its own
    # `Cluster` writes its address where `ray.init()` with no address looks; in a private temp directory, a run
    # killed before `cluster.shutdown()` leaves it to nobody else on the machine.
    monkeypatch.setenv("RAY_TMPDIR", str(workdir))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    worker = cluster.add_node(num_cpus=2, resources={"worker": 1})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        address = deploy(str(tiny_model_dir("qwen3", "causal_lm")), free_port(),
                         placement={"engine": {"num_replicas": 2, "cpus": 1.0}, "ingress": {"cpus": 0.25}})
        load = Load(address, retries=8).start()
        time.sleep(1.0)
        cluster.remove_node(worker, allow_graceful=False)
        codes = load.join(300)
        assert sum(codes.values()) == load.sent and set(codes) <= EXPLICIT, codes
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
