"""The RayService's serveConfigV2, offline: Ray's schema accepts it, no key is unknown to that schema (Ray's
pydantic models ignore unknown keys, so a typo would silently keep a default), the app's own `AppArgs` accepts its
args (with the model k8s/model.env sets), and it is serve_config.yaml's application except for the settings listed
in INTENTIONAL_ARG_DIFFERENCES (dotted paths into the args' sections).
Change serve_config.yaml (ports, gRPC servicers, an arg) and these tests fail until k8s/rayservice.yaml follows.
"""

from __future__ import annotations

import copy
import math
import re
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel
from ray.serve.schema import ServeDeploySchema
from test_config import leaves

from deployments.config import MODEL_ENV, AppArgs
from deployments.launcher import CONTROL_LOOP_ENV, CONTROL_LOOP_INTERVAL_S, GRPC_MESSAGE_SIZE_ENV, grpc_message_limit

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"

# settings (and everything under them) that k8s/rayservice.yaml sets differently from serve_config.yaml, on
# purpose, and why.
INTENTIONAL_ARG_DIFFERENCES = {
    "model": "set once in k8s/model.env (ConfigMap radixserve-model, env RADIXSERVE_MODEL overrides args.model)",
    "placement.accelerator": "gpu: with auto the app would resolve to cpu while the cluster has not scaled up a GPU "
                             "node yet",
    "placement.engine.autoscaling": "production autoscaling bounds, matched to the GPU worker group",
    "placement.ingress": "autoscaled CPU ingress on the GPU workers",
    "auth.api_keys_file": "client API keys mounted from Secret radixserve-api-keys",
}
# application keys only the Kubernetes config has: per-deployment graceful shutdown, health checks, surge.
K8S_ONLY_APP_KEYS = {"deployments"}


def serve_config() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "serve_config.yaml").read_text())


def rayservice() -> dict[str, Any]:
    return yaml.safe_load((K8S / "rayservice.yaml").read_text())


def k8s_config() -> dict[str, Any]:
    return yaml.safe_load(rayservice()["spec"]["serveConfigV2"])


def k8s_app() -> dict[str, Any]:
    (app,) = k8s_config()["applications"]
    return app


def k8s_model() -> str:
    """The model k8s/model.env gives every Ray pod as RADIXSERVE_MODEL."""
    env = dict(line.split("=", 1) for line in (K8S / "model.env").read_text().splitlines() if line)
    return env[MODEL_ENV]


def k8s_args() -> AppArgs:
    """serveConfigV2's args as the app validates them on a pod (the model from k8s/model.env)."""
    return AppArgs.model_validate({"model": k8s_model(), **k8s_app()["args"]})


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)


# --- Ray's schema, strictly -----------------------------------------------------------------------------------------

def unknown_keys(data: dict[str, Any], model: type[BaseModel], path: str = "") -> list[str]:
    """Paths of keys in `data` that `model` (and the models nested in its fields) do not declare."""
    fields = {alias: f for name, f in model.model_fields.items() for alias in {name, f.alias} if alias}
    found = [f"{path}.{k}" for k in data if k not in fields]
    return found + [p for k, v in data.items() if k in fields
                    for p in unknown_in_value(v, fields[k].annotation, f"{path}.{k}")]


def unknown_in_value(value: Any, annotation: Any, path: str) -> list[str]:
    """Follow Optional/Union/list/Annotated to the pydantic models a value is parsed as (a dict in
    `Union[Dict, AutoscalingConfig]` becomes an AutoscalingConfig in Ray, so it is checked as one)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return unknown_in_value(value, args[0], path)
    if origin in (Union, types.UnionType):
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        lists = [a for a in args if get_origin(a) is list]
        if isinstance(value, dict) and models:
            return unknown_keys(value, models[0], path)
        return unknown_in_value(value, lists[0], path) if isinstance(value, list) and lists else []
    if origin is list and isinstance(value, list):
        return [p for i, item in enumerate(value) for p in unknown_in_value(item, args[0], f"{path}[{i}]")]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(value, dict):
        return unknown_keys(value, annotation, path)
    return []


def test_serve_config_v2_validates_with_ray_schema():
    ServeDeploySchema.model_validate(k8s_config())


def test_serve_config_v2_has_no_keys_unknown_to_ray():
    assert unknown_keys(k8s_config(), ServeDeploySchema) == []


def test_serve_config_yaml_has_no_keys_unknown_to_ray():
    assert unknown_keys(serve_config(), ServeDeploySchema) == []


@pytest.mark.parametrize("where", [
    (), ("http_options",), ("grpc_options",), ("applications", 0), ("applications", 0, "deployments", 0),
    ("applications", 0, "deployments", 0, "autoscaling_config"),
    ("applications", 0, "deployments", 0, "ray_actor_options"),
])
def test_strict_check_finds_a_typo_that_ray_accepts(where):
    config = k8s_config()
    config["applications"][0]["deployments"][0].update(autoscaling_config={}, ray_actor_options={})
    node = config
    for step in where:
        node = node[step]
    node["graceful_shutdown_timout_s"] = 5
    ServeDeploySchema.model_validate(config)  # Ray's own schema lets the typo through
    path = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in where)
    assert unknown_keys(config, ServeDeploySchema) == [f"{path}.graceful_shutdown_timout_s"]


def test_app_args_pass_the_app_validation():
    args = k8s_args()
    assert args.placement.accelerator == "gpu" and args.placement.engine.autoscaling is not None


# --- agreement with serve_config.yaml -------------------------------------------------------------------------------

def intentional(path: str) -> bool:
    return any(path == p or path.startswith(f"{p}.") for p in INTENTIONAL_ARG_DIFFERENCES)


def config_drift(local: dict[str, Any], k8s: dict[str, Any]) -> list[str]:
    """Differences between serve_config.yaml and serveConfigV2 other than the intentional ones, one line each."""
    def differ(where: str, a: dict[str, Any], b: dict[str, Any], skip: set[str]) -> list[str]:
        return [f"{where}{key}: serve_config.yaml has {a.get(key)!r}, k8s/rayservice.yaml has {b.get(key)!r}"
                for key in sorted((set(a) | set(b)) - skip) if a.get(key) != b.get(key)]

    drift = differ("", local, k8s, {"applications"})
    local_apps = {a.get("name", "default"): a for a in local.get("applications", [])}
    k8s_apps = {a.get("name", "default"): a for a in k8s.get("applications", [])}
    if set(local_apps) != set(k8s_apps):
        drift.append(f"applications: serve_config.yaml has {sorted(local_apps)}, k8s has {sorted(k8s_apps)}")
    for name in sorted(set(local_apps) & set(k8s_apps)):
        la, ka = local_apps[name], k8s_apps[name]
        drift += differ(f"applications[{name}].", la, ka, {"args"} | K8S_ONLY_APP_KEYS)
        local_args, k8s_args_ = leaves(la.get("args", {})), leaves(ka.get("args", {}))
        drift += differ(f"applications[{name}].args.", local_args, k8s_args_,
                        {path for path in set(local_args) | set(k8s_args_) if intentional(path)})
    return drift


def test_k8s_config_is_serve_config_but_for_the_intentional_differences():
    assert config_drift(serve_config(), k8s_config()) == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c["grpc_options"]["grpc_servicer_functions"].pop(), "grpc_options:"),
    (lambda c: c["http_options"].update(port=8080), "http_options:"),
    (lambda c: c["applications"][0].update(import_path="deployments.app:build_v2"),
     "applications[radixserve].import_path:"),
    (lambda c: c["applications"][0]["args"]["placement"]["engine"].update(cpus=2),
     "applications[radixserve].args.placement.engine.cpus:"),
    (lambda c: c["applications"][0]["args"].update(batching={"index_builder": "inline"}),
     "applications[radixserve].args.batching.index_builder:"),
    (lambda c: c["applications"][0].update(name="scoring"), "applications:"),
], ids=["grpc-servicers", "http-port", "import-path", "arg-beside-an-intentional-one", "section-added",
        "app-renamed"])
def test_drift_is_caught(mutate, expected):
    """The checker on its own: a copy of the k8s config agrees with it until one thing in the copy changes."""
    local = copy.deepcopy(k8s_config())
    assert config_drift(local, k8s_config()) == []
    mutate(local)
    drift = config_drift(local, k8s_config())
    assert len(drift) == 1 and drift[0].startswith(expected), drift


def test_intentional_differences_hold_what_they_claim():
    local_args, args = serve_config()["applications"][0]["args"], k8s_app()["args"]
    assert "model" not in args and k8s_model() == local_args["model"]
    placement = k8s_args().placement
    assert placement.accelerator == "gpu"
    assert placement.engine.autoscaling is not None and placement.ingress.autoscaling is not None
    assert k8s_args().auth.api_keys_env is None, "keys come from the Secret mounted at auth.api_keys_file"


def test_api_keys_file_is_mounted_on_every_ray_pod():
    path = Path(k8s_args().auth.api_keys_file)
    cluster = rayservice()["spec"]["rayClusterConfig"]
    for template in [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]:
        secret_volumes = {v["name"]: v["secret"] for v in template["spec"]["volumes"] if "secret" in v}
        (container,) = template["spec"]["containers"]
        (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
        assert mount["readOnly"] and path.name in {i["path"] for i in secret_volumes[mount["name"]]["items"]}


# --- the built application, graceful shutdown and GPU capacity -------------------------------------------------------

@pytest.fixture(scope="module")
def built_deployments() -> dict[str, Any]:
    """The deployments `deployments.app:build` makes from the k8s args (no Ray cluster needed)."""
    from ray.serve._private.build_app import build_app  # Ray's own app flattening; Ray is pinned exactly

    from deployments.app import build

    app = k8s_app()
    args = {"model": k8s_model(), **app["args"]}
    return {d.name: d for d in build_app(build(args), name=app["name"]).deployments}


def test_deployment_overrides_name_deployments_of_the_app(built_deployments):
    overrides = [d["name"] for d in k8s_app()["deployments"]]
    assert sorted(overrides) == sorted(built_deployments), \
        f"serveConfigV2 deployments {overrides} must name the app's deployments {sorted(built_deployments)}"


def test_each_engine_replica_takes_one_worker_gpu(built_deployments):
    (group,) = rayservice()["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    gpus_per_worker = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    assert built_deployments["EngineReplica"].ray_actor_options["num_gpus"] == 1 <= gpus_per_worker
    assert built_deployments["Ingress"].ray_actor_options.get("num_gpus", 0) == 0


def test_worker_group_fits_engine_autoscaling_with_surge():
    (group,) = rayservice()["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    gpus = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    engine = k8s_args().placement.engine.autoscaling
    surge = {d["name"]: d.get("max_surge_percent", 0) for d in k8s_app()["deployments"]}["EngineReplica"]
    peak = engine.max_replicas + math.ceil(engine.max_replicas * surge / 100)
    assert group["maxReplicas"] * gpus >= peak, f"{peak} engine replicas at most, {group['maxReplicas'] * gpus} GPUs"
    assert group["minReplicas"] * gpus <= engine.min_replicas, "GPUs kept beyond min_replicas would idle"


def test_pods_outlive_graceful_shutdown():
    rs = rayservice()
    longest = max(d["graceful_shutdown_timeout_s"] for d in k8s_app()["deployments"])
    assert rs["spec"]["upgradeStrategy"]["type"] == "NewCluster"
    assert rs["spec"]["rayClusterDeletionDelaySeconds"] > longest
    for group in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        assert group["template"]["spec"]["terminationGracePeriodSeconds"] > longest, group["groupName"]


def prestop_drain(container: dict[str, Any]) -> tuple[int, int]:
    """(drain deadline, sleep bound) in seconds of a worker's preStop `ray drain-node ...; sleep N` hook."""
    script = container["lifecycle"]["preStop"]["exec"]["command"][-1]
    drain = re.search(r"ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION .*--deadline-remaining-seconds (\d+)",
                      script)
    sleep = re.search(r";\s*sleep (\d+)\s*$", script)
    assert drain and sleep, f"preStop must drain the node, then wait a bounded time: {script!r}"
    return int(drain.group(1)), int(sleep.group(1))


def test_worker_prestop_drains_within_the_grace_period():
    longest = max(d["graceful_shutdown_timeout_s"] for d in k8s_app()["deployments"])
    for group in rayservice()["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        spec = group["template"]["spec"]
        for container in spec["containers"]:
            deadline, sleep = prestop_drain(container)
            assert longest < sleep <= deadline <= spec["terminationGracePeriodSeconds"], \
                f"{group['groupName']}: graceful_shutdown_timeout_s {longest} < preStop wait {sleep} <= drain " \
                f"deadline {deadline} <= terminationGracePeriodSeconds {spec['terminationGracePeriodSeconds']}"


def test_grpc_message_limit_env_agrees_with_max_request_bytes():
    """The proxy's limit sits ENVELOPE_BYTES above limits.max_request_bytes, the same on every Ray pod as
    locally."""
    local = AppArgs.model_validate(serve_config()["applications"][0]["args"]).limits.max_request_bytes
    expected = str(grpc_message_limit(local))
    assert k8s_args().limits.max_request_bytes == local
    cluster = rayservice()["spec"]["rayClusterConfig"]
    for template in [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]:
        for container in template["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env.get(GRPC_MESSAGE_SIZE_ENV) == expected, \
                f"{container['name']}: {GRPC_MESSAGE_SIZE_ENV} must be {expected} (max_request_bytes + envelope)"


def test_head_sets_the_launchers_control_loop_interval():
    """Serve's controller runs on the head pod: its control loop interval is the one `radixserve serve` sets."""
    head = rayservice()["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    for container in head["containers"]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env.get(CONTROL_LOOP_ENV) == CONTROL_LOOP_INTERVAL_S, \
            f"{container['name']}: {CONTROL_LOOP_ENV} must be {CONTROL_LOOP_INTERVAL_S}, as the launcher sets it"
