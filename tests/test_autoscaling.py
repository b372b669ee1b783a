"""Autoscaling on fake GPUs: a local Ray that advertises 4 GPUs, engine replicas that reserve one each (running on
the CPU, `engine_device: cpu`). Under load the engine deployment scales up; when the load falls it scales back
down; no request fails on the way up or down."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import ray
from ray import serve

from deployments.app import build
from serving import wait_for

pytestmark = [pytest.mark.serve, pytest.mark.slow]

DOCS = [f"passage {i}: a radix tree stores strings by shared prefixes, {'and more ' * i}" for i in range(6)]
AUTOSCALING = {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2, "upscale_delay_s": 1,
               "downscale_delay_s": 2}


def engine_replicas() -> int:
    status = serve.status().applications["radixserve"].deployments["EngineReplica"]
    return status.replica_states.get("RUNNING", 0)


@pytest.mark.timeout(400)
def test_the_engine_scales_up_under_load_and_down_after_without_a_failed_request(tiny_model_dir, start_local_ray):
    start_local_ray(num_cpus=4, num_gpus=4)
    try:
        serve.start(proxy_location="Disabled")
        handle = serve.run(build({
            "model": str(tiny_model_dir("qwen3", "causal_lm")), "engine": {"device": "cpu"},
            "batching": {"batch_wait_timeout_s": 0.2},
            "placement": {"accelerator": "gpu", "engine": {"cpus": 0.25, "autoscaling": AUTOSCALING},
                          "ingress": {"cpus": 0.25}}}), name="radixserve", route_prefix=None)
        assert ray.available_resources().get("GPU") == 3  # one engine replica holds one GPU
        outcomes: Counter = Counter()
        stop, clients = threading.Event(), []

        def client(i: int) -> None:
            while not stop.is_set():
                try:
                    handle.call.remote("rerank", {"query": f"query {i} {time.monotonic()}",
                                                  "documents": DOCS}).result(timeout_s=60)
                    outcomes["OK"] += 1
                except Exception as err:  # counted: the test fails on any
                    outcomes[type(err).__name__] += 1

        clients = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for thread in clients:
            thread.start()
        wait_for(lambda: engine_replicas() >= 2, 180, "scaling up under load", poll_s=0.5)
        stop.set()
        for thread in clients:
            thread.join(60)
        trickle = threading.Event()

        def light_load() -> None:  # requests keep arriving while replicas are removed
            while not trickle.is_set():
                try:
                    handle.call.remote("rerank", {"query": "one more", "documents": DOCS[:2]}).result(timeout_s=60)
                    outcomes["OK"] += 1
                except Exception as err:
                    outcomes[type(err).__name__] += 1
                time.sleep(0.5)

        background = threading.Thread(target=light_load)
        background.start()
        wait_for(lambda: engine_replicas() == 1, 180, "scaling down once the load fell", poll_s=0.5)
        trickle.set()
        background.join(60)
        assert set(outcomes) == {"OK"}, outcomes
        wait_for(lambda: ray.available_resources().get("GPU") == 3, 120, "the removed replicas' GPUs freed", poll_s=0.5)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
