"""Application arguments: defaults, validation messages, the model override, and the Ray Serve options."""

import pytest
from pydantic import ValidationError

from deployments.config import (
    DEFAULT_MODEL,
    MODEL_ENV,
    ROUTER_CLASS,
    AppArgs,
    AutoscalingSettings,
    ReplicaSettings,
    RouterSettings,
    resolve_accelerator,
)


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)


def test_defaults_are_valid_and_described():
    args = AppArgs()
    assert args.model == DEFAULT_MODEL and args.accelerator == "auto" and args.radix == "auto"
    assert args.engine_replicas.num_replicas == 1 and args.router.load_factor == 1.25
    for model in (AppArgs, ReplicaSettings, AutoscalingSettings, RouterSettings):
        assert all(f.description for f in model.model_fields.values()), model.__name__


def test_env_var_overrides_model(monkeypatch):
    monkeypatch.setenv(MODEL_ENV, "/models/tiny")
    assert AppArgs().model == "/models/tiny"
    assert AppArgs.model_validate({"model": "Qwen/Qwen3-Reranker-4B"}).model == "/models/tiny"
    monkeypatch.setenv(MODEL_ENV, "")
    assert AppArgs.model_validate({"model": "Qwen/Qwen3-Reranker-4B"}).model == "Qwen/Qwen3-Reranker-4B"


def test_unknown_keys_are_named_with_a_suggestion():
    with pytest.raises(ValidationError, match=r"unknown setting\(s\) 'max_batch_token' \(did you mean "
                                              r"'max_batch_tokens'\?\) for AppArgs"):
        AppArgs.model_validate({"max_batch_token": 4096})
    with pytest.raises(ValidationError, match="'load_factr' .did you mean 'load_factor'.*RouterSettings"):
        AppArgs.model_validate({"router": {"load_factr": 2.0}})
    with pytest.raises(ValidationError, match="'zzz' for AutoscalingSettings"):
        AppArgs.model_validate({"engine_replicas": {"autoscaling": {"zzz": 1}}})


@pytest.mark.parametrize("args, message", [
    ({"dtype": "float64"}, "dtype"),
    ({"accelerator": "tpu"}, "accelerator"),
    ({"radix": "on"}, "radix"),
    ({"attention": "xformers"}, "attention"),
    ({"radix_threshold": 1.5}, "less than or equal to 1"),
    ({"max_batch_tokens": 0}, "greater than or equal to 1"),
    ({"batch_wait_timeout_s": -1}, "greater than or equal to 0"),
    ({"router": {"load_factor": 0.9}}, "greater than or equal to 1"),
    ({"max_request_tokens": 20000, "max_batch_tokens": 16384},
     r"max_request_tokens \(20000\) must be <= max_batch_tokens \(16384\)"),
    ({"max_tokens_per_item": 9000, "max_request_tokens": 8192},
     "an item cannot be split across parts"),
    ({"api_keys_env": "sk-live-1234"}, "must name an environment variable"),
])
def test_invalid_values_say_what_is_wrong(args, message):
    with pytest.raises(ValidationError, match=message):
        AppArgs.model_validate(args)


def test_api_keys_env_error_does_not_echo_the_value():
    with pytest.raises(ValidationError) as err:
        AppArgs.model_validate({"api_keys_env": "sk-live-1234"})
    assert "sk-live-1234" not in str(err.value)


def test_replicas_fixed_or_autoscaling_exactly_one():
    assert ReplicaSettings.model_validate(3).to_serve_options() == {"num_replicas": 3}
    with pytest.raises(ValidationError, match="set exactly one of num_replicas"):
        ReplicaSettings()
    with pytest.raises(ValidationError, match="set exactly one of num_replicas"):
        ReplicaSettings(num_replicas=2, autoscaling=AutoscalingSettings())
    with pytest.raises(ValidationError, match=r"min_replicas \(3\) must be <= max_replicas \(2\)"):
        AutoscalingSettings(min_replicas=3, max_replicas=2)


def test_autoscaling_converts_to_a_ray_autoscaling_config():
    from ray.serve.config import AutoscalingConfig

    args = AppArgs.model_validate({"engine_replicas": {"autoscaling": {
        "min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 16, "upscale_delay_s": 5,
        "downscale_delay_s": 120}}})
    options = args.engine_options(cluster_gpus=0, node_cpus=2)
    assert "num_replicas" not in options
    ray_config = AutoscalingConfig(**options["autoscaling_config"])  # Ray accepts every key we emit
    assert (ray_config.min_replicas, ray_config.max_replicas, ray_config.target_ongoing_requests) == (1, 8, 16)
    assert (ray_config.upscale_delay_s, ray_config.downscale_delay_s) == (5, 120)


@pytest.mark.parametrize("gpus, cluster_cpus, engine_cpus, most", [
    (0, 2, None, 1),  # the default CPU reservation (the node less the ingress) fits once on a 2-CPU machine
    (0, 16, 2.0, 4),  # room for more than max_replicas: unchanged
    (0, 4, 1.0, 3),
    (2, 2, None, 4),  # GPUs: the cluster autoscaler adds nodes, nothing is capped
])
def test_cpu_autoscaling_never_asks_for_replicas_the_cluster_cannot_place(gpus, cluster_cpus, engine_cpus, most):
    args = AppArgs.model_validate({"engine_cpus": engine_cpus, "engine_replicas": {"autoscaling": {
        "min_replicas": 1, "max_replicas": 4}}})
    options = args.engine_options(cluster_gpus=gpus, node_cpus=min(cluster_cpus, 2), cluster_cpus=cluster_cpus)
    assert options["autoscaling_config"]["max_replicas"] == most
    assert args.engine_options(cluster_gpus=gpus, node_cpus=2)["autoscaling_config"]["max_replicas"] == 4


def test_router_settings_become_a_request_router_config():
    args = AppArgs.model_validate({"router": {"load_factor": 1.5, "virtual_nodes": 64, "min_load_tokens": 4096}})
    config = args.engine_options(cluster_gpus=0, node_cpus=2)["request_router_config"]
    assert config.request_router_class == ROUTER_CLASS
    assert config.request_router_kwargs == {"load_factor": 1.5, "virtual_nodes": 64, "min_load_tokens": 4096}
    assert config.get_request_router_class().__name__ == "PrefixAffinityRouter"


@pytest.mark.parametrize("accelerator, gpus, expected", [
    ("auto", 0, "cpu"), ("auto", 2, "gpu"), ("auto", 0.5, "cpu"), ("cpu", 4, "cpu"), ("gpu", 0, "gpu"),
])
def test_accelerator_resolution(accelerator, gpus, expected):
    assert resolve_accelerator(accelerator, gpus) == expected
    options = AppArgs(accelerator=accelerator).engine_options(cluster_gpus=gpus, node_cpus=8)
    assert options["ray_actor_options"]["num_gpus"] == (1 if expected == "gpu" else 0)


def test_engine_and_ingress_options():
    args = AppArgs(engine_replicas=2, ingress_replicas=3, max_queued_requests=None, engine_cpus=0.5,
                   ingress_cpus=0.25)
    engine = args.engine_options(cluster_gpus=0, node_cpus=2)
    assert engine["num_replicas"] == 2 and engine["max_queued_requests"] == -1
    assert engine["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 0}
    assert args.ingress_options(cluster_gpus=0) == {
        "num_replicas": 3, "max_ongoing_requests": args.ingress_max_ongoing_requests,
        "ray_actor_options": {"num_cpus": 0.25}}


@pytest.mark.parametrize("settings, gpus, node_cpus, engine_cpus, ingress_cpus", [
    ({}, 0, 2, 1.75, 0.25),  # a CPU machine: the engine gets the cores the ingress does not reserve
    ({}, 0, 16, 15.75, 0.25),
    ({"engine_replicas": 2, "ingress_replicas": 2}, 0, 8, 3.75, 0.25),
    ({"engine_replicas": 8}, 0, 2, 0.5, 0.25),  # never below MIN_ENGINE_CPUS
    ({}, 4, 16, 1.0, 1.0),  # beside a GPU
    ({"engine_cpus": 3, "ingress_cpus": 0.5}, 0, 16, 3, 0.5),  # as set
])
def test_default_cpu_reservations_follow_the_node(settings, gpus, node_cpus, engine_cpus, ingress_cpus):
    args = AppArgs(**settings)
    assert args.engine_options(cluster_gpus=gpus, node_cpus=node_cpus)["ray_actor_options"]["num_cpus"] == engine_cpus
    assert args.ingress_options(cluster_gpus=gpus)["ray_actor_options"]["num_cpus"] == ingress_cpus
