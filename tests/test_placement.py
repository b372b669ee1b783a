"""Ray placement (`deployments.placement`): accelerator, engine device, CPU reservations, replicas and autoscaling
capping, the request router, as the Ray Serve options of both deployments."""

from __future__ import annotations

import logging

import pytest

from deployments.config import MODEL_ENV, AppArgs
from deployments.placement import (
    ROUTER_CLASS,
    ClusterShape,
    combined_options,
    engine_config,
    engine_options,
    ingress_options,
    initial_replicas,
    resolve_accelerator,
)


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)


def app_args(**sections) -> AppArgs:
    return AppArgs.model_validate({"model": "m", **sections})


def test_autoscaling_converts_to_a_ray_autoscaling_config():
    from ray.serve.config import AutoscalingConfig

    args = app_args(placement={"engine": {"autoscaling": {
        "min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 16, "upscale_delay_s": 5,
        "downscale_delay_s": 120}}})
    options = engine_options(args, ClusterShape(gpus=0, node_cpus=2))
    assert "num_replicas" not in options
    ray_config = AutoscalingConfig(**options["autoscaling_config"])  # Ray accepts every key we emit
    assert (ray_config.min_replicas, ray_config.max_replicas, ray_config.target_ongoing_requests) == (1, 8, 16)
    assert (ray_config.upscale_delay_s, ray_config.downscale_delay_s) == (5, 120)


def test_replicas_are_one_by_default_else_as_set():
    assert engine_options(app_args(), ClusterShape())["num_replicas"] == 1
    assert initial_replicas(app_args().placement.ingress) == 1
    placement = {"engine": {"autoscaling": {"min_replicas": 0}}, "ingress": {"num_replicas": 3}}
    args = app_args(placement=placement)
    assert initial_replicas(args.placement.engine) == 1  # a replica at start even when scaling to zero later
    assert ingress_options(args, ClusterShape())["num_replicas"] == 3


@pytest.mark.parametrize("gpus, cluster_cpus, engine_cpus, most", [
    (0, 2, None, 1),  # the default CPU reservation (the node less the ingress) fits once on a 2-CPU machine
    (0, 16, 2.0, 4),  # room for more than max_replicas: unchanged
    (0, 4, 1.0, 3),
    (2, 2, None, 4),  # GPUs: the cluster autoscaler adds nodes, nothing is capped
])
def test_cpu_autoscaling_never_asks_for_replicas_the_cluster_cannot_place(gpus, cluster_cpus, engine_cpus, most):
    args = app_args(placement={"engine": {"cpus": engine_cpus, "autoscaling": {"min_replicas": 1,
                                                                               "max_replicas": 4}}})
    options = engine_options(args, ClusterShape(gpus, min(cluster_cpus, 2), cluster_cpus))
    assert options["autoscaling_config"]["max_replicas"] == most
    assert engine_options(args, ClusterShape(gpus, 2))["autoscaling_config"]["max_replicas"] == 4  # cluster unknown


def test_capping_says_so_and_what_to_change(caplog):
    args = app_args(placement={"engine": {"autoscaling": {"max_replicas": 4}}})
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        engine_options(args, ClusterShape(0, 2, 2))
    assert "engine autoscaling max_replicas 4 -> 1" in caplog.text and "placement.engine.cpus" in caplog.text


def test_router_settings_become_a_request_router_config():
    args = app_args(router={"load_factor": 1.5, "virtual_nodes": 64, "min_load_tokens": 4096})
    config = engine_options(args, ClusterShape(0, 2))["request_router_config"]
    assert config.request_router_class == ROUTER_CLASS
    assert config.request_router_kwargs == {"load_factor": 1.5, "virtual_nodes": 64, "min_load_tokens": 4096,
                                            "prefix_cache": True}
    assert config.get_request_router_class().__name__ == "PrefixAffinityRouter"
    default = engine_options(app_args(router={"policy": "power_of_two"}), ClusterShape())["request_router_config"]
    assert default.request_router_class != ROUTER_CLASS


@pytest.mark.parametrize("accelerator, gpus, expected", [
    ("auto", 0, "cpu"), ("auto", 2, "gpu"), ("auto", 0.5, "cpu"), ("cpu", 4, "cpu"), ("gpu", 0, "gpu"),
])
def test_accelerator_resolution(accelerator, gpus, expected):
    assert resolve_accelerator(accelerator, gpus) == expected
    options = engine_options(app_args(placement={"accelerator": accelerator}), ClusterShape(gpus, 8))
    assert options["ray_actor_options"]["num_gpus"] == (1 if expected == "gpu" else 0)


@pytest.mark.parametrize("accelerator, device, gpus, expected", [
    ("auto", "auto", 1, "cuda"), ("auto", "auto", 0, "cpu"), ("gpu", "auto", 0, "cuda"),
    ("gpu", "cpu", 1, "cpu"),  # a GPU reserved, the CPU used: GPU scheduling exercised without one
    ("cpu", "auto", 4, "cpu"),
])
def test_the_engine_device_follows_the_gpu_reservation(accelerator, device, gpus, expected):
    args = app_args(placement={"accelerator": accelerator}, engine={"device": device, "radix": "full"})
    config = engine_config(args, ClusterShape(gpus, 8))
    assert (config.device, config.radix) == (expected, "full")


def test_engine_and_ingress_options():
    args = app_args(placement={"engine": {"num_replicas": 2, "cpus": 0.5, "max_queued_requests": None},
                               "ingress": {"num_replicas": 3, "cpus": 0.25}})
    engine = engine_options(args, ClusterShape(0, 2))
    assert engine["num_replicas"] == 2 and engine["max_queued_requests"] == -1
    niceness = {"env_vars": {"RAY_worker_niceness": "0"}}  # Ray's 15 starved a CPU replica against the node's others
    assert engine["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 0, "runtime_env": niceness}
    assert engine["max_ongoing_requests"] == args.placement.engine.max_ongoing_requests
    assert engine["health_check_timeout_s"] == args.placement.engine.health_check_timeout_s
    assert ingress_options(args, ClusterShape(0, 2)) == {
        "num_replicas": 3, "max_ongoing_requests": args.placement.ingress.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": 0.25, "runtime_env": niceness}}


@pytest.mark.parametrize("placement, gpus, node_cpus, engine_cpus, ingress_cpus", [
    ({}, 0, 2, 1.75, 0.25),  # a CPU machine: the engine gets the cores the ingress does not reserve
    ({}, 0, 16, 15.75, 0.25),
    ({"engine": {"num_replicas": 2}, "ingress": {"num_replicas": 2}}, 0, 8, 3.75, 0.25),
    ({"engine": {"num_replicas": 8}}, 0, 2, 0.5, 0.25),  # never below MIN_ENGINE_CPUS
    ({}, 4, 16, 1.0, 1.0),  # beside a GPU
    ({"engine": {"cpus": 3}, "ingress": {"cpus": 0.5}}, 0, 16, 3, 0.5),  # as set
])
def test_default_cpu_reservations_follow_the_node(placement, gpus, node_cpus, engine_cpus, ingress_cpus):
    args = app_args(placement=placement)
    cluster = ClusterShape(gpus, node_cpus)
    assert engine_options(args, cluster)["ray_actor_options"]["num_cpus"] == engine_cpus
    assert ingress_options(args, cluster)["ray_actor_options"]["num_cpus"] == ingress_cpus


@pytest.mark.parametrize("gpus, node_cpus, cpus, num_gpus", [
    (0, 2, 2.0, 0),  # a CPU machine: the ingress's share and the engine's, the node's two cores
    (1, 16, 2.0, 1),  # beside a GPU: one CPU each, and the engine's GPU
])
def test_combined_replicas_reserve_the_engine_and_the_ingress(gpus, node_cpus, cpus, num_gpus):
    args = app_args(placement={"topology": "combined", "engine": {"num_replicas": 1}})
    cluster = ClusterShape(gpus, node_cpus, node_cpus)
    options = combined_options(args, cluster)
    engine, ingress = engine_options(args, cluster), ingress_options(args, cluster)
    assert options["num_replicas"] == 1 and "autoscaling_config" not in options
    assert options["max_ongoing_requests"] == ingress["max_ongoing_requests"]  # the proxies' calls, as the ingress's
    assert options["health_check_timeout_s"] == engine["health_check_timeout_s"]  # the engine's probe runs here
    assert options["ray_actor_options"] == {**engine["ray_actor_options"], "num_cpus": cpus, "num_gpus": num_gpus}


def test_combined_replicas_autoscale_as_the_engine_would():
    args = app_args(placement={"topology": "combined", "engine": {"autoscaling": {"max_replicas": 8}}})
    cluster = ClusterShape(0, 2, 2)
    assert combined_options(args, cluster)["autoscaling_config"] == engine_options(args, cluster)["autoscaling_config"]


@pytest.mark.parametrize("ingress", [{"num_replicas": 2}, {"autoscaling": {}}])
def test_combined_refuses_an_ingress_replica_count(ingress):
    with pytest.raises(ValueError, match="topology combined runs the engine inside the ingress replicas, whose "
                                         "count is placement.engine's: remove placement.ingress.num_replicas"):
        app_args(placement={"topology": "combined", "ingress": ingress})
    assert app_args(placement={"topology": "combined", "ingress": {"cpus": 0.5}}).placement.topology == "combined"
