"""Ray placement: the application's settings (`AppArgs.placement`, `router`, `engine.device`) as Ray Serve
deployment options for the cluster at hand.

    cluster = ClusterShape.of_ray()
    engine = EngineReplica.options(**engine_options(args, cluster)).bind(args, engine_config(args, cluster))
    Ingress.options(**ingress_options(args, cluster)).bind(engine, args)
    Ingress.options(**combined_options(args, cluster)).bind(engine_config(args, cluster), args)  # combined

`accelerator: auto` is gpu when the cluster has a GPU now. CPU reservations left unset follow the node: beside
GPUs each replica reserves 1 CPU; on a CPU-only cluster an ingress replica reserves CPU_INGRESS_CPUS and the engine
replicas share the largest node's other cores (at least MIN_ENGINE_CPUS each). There, engine autoscaling is capped
at the replicas the cluster's CPUs can place, so Ray does not wait forever for replicas it cannot schedule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Literal

from deployments.config import (NICENESS_ENV, Accelerator, AppArgs, DeploymentSettings, PlacementSettings,
                                RouterSettings)
from radix_core.engine_config import EngineConfig

ROUTER_CLASS = "deployments.router:PrefixAffinityRouter"
CPU_INGRESS_CPUS = 0.25  # an ingress beside CPU engines: tokenizing is a small share of a CPU forward
MIN_ENGINE_CPUS = 0.5

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class ClusterShape:
    """What placement reads of the Ray cluster: its GPUs, the CPUs of its largest live node, and all its CPUs (None
    before Ray is started: nothing is known to cap)."""

    gpus: float = 0.0
    node_cpus: float = 1.0
    cpus: float | None = None

    @classmethod
    def of_ray(cls) -> ClusterShape:
        """The connected Ray cluster's shape, or the defaults before Ray is started."""
        import ray

        if not ray.is_initialized():
            return cls()
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        resources = ray.cluster_resources()
        return cls(resources.get("GPU", 0.0), max((n.get("CPU", 0.0) for n in nodes), default=1.0),
                   resources.get("CPU", 0.0))


def resolve_accelerator(accelerator: Accelerator, cluster_gpus: float) -> Literal["gpu", "cpu"]:
    """auto -> gpu when the cluster has at least one GPU now, else cpu; gpu and cpu stay as asked.

    An explicit gpu on a cluster without GPUs stays gpu: an autoscaling cluster (KubeRay) adds GPU nodes for
    replicas that ask for one, and until then the replicas wait for resources.
    """
    if accelerator == "auto":
        return "gpu" if cluster_gpus >= 1 else "cpu"
    return accelerator


def engine_config(args: AppArgs, cluster: ClusterShape) -> EngineConfig:
    """`args.engine` with the engine replicas' torch device: "cuda" where they reserve a GPU, unless
    `engine.device` is cpu."""
    gpu = resolve_accelerator(args.placement.accelerator, cluster.gpus) == "gpu"
    return replace(args.engine, device="cuda" if gpu and args.engine.device == "auto" else "cpu")


def ingress_cpus(placement: PlacementSettings, cluster: ClusterShape) -> float:
    """CPUs per ingress replica: as set, else 1 beside a GPU, else CPU_INGRESS_CPUS."""
    if placement.ingress.cpus is not None:
        return placement.ingress.cpus
    return 1.0 if resolve_accelerator(placement.accelerator, cluster.gpus) == "gpu" else CPU_INGRESS_CPUS


def engine_cpus(placement: PlacementSettings, cluster: ClusterShape) -> float:
    """CPUs per engine replica: as set, else 1 beside a GPU, else the largest node's CPUs less the ingress's
    reservation, split between the engine replicas (at least MIN_ENGINE_CPUS each)."""
    if placement.engine.cpus is not None:
        return placement.engine.cpus
    if resolve_accelerator(placement.accelerator, cluster.gpus) == "gpu":
        return 1.0
    ingress = ingress_cpus(placement, cluster) * initial_replicas(placement.ingress)
    return max(MIN_ENGINE_CPUS, (cluster.node_cpus - ingress) / initial_replicas(placement.engine))


def placeable_engine_replicas(placement: PlacementSettings, cluster: ClusterShape) -> int | None:
    """How many CPU engine replicas the cluster's CPUs hold beside the ingress replicas; None on GPUs, where the
    cluster autoscaler adds nodes for replicas that ask for one, or when the cluster is not known."""
    cpus = engine_cpus(placement, cluster)
    if cluster.cpus is None or resolve_accelerator(placement.accelerator, cluster.gpus) == "gpu" or cpus <= 0:
        return None
    ingress = ingress_cpus(placement, cluster) * initial_replicas(placement.ingress)
    return int((cluster.cpus - ingress) // cpus)


def initial_replicas(deployment: DeploymentSettings) -> int:
    """Replicas at start: the fixed count (one when unset), or autoscaling's minimum (at least 1)."""
    if deployment.autoscaling is not None:
        return max(1, deployment.autoscaling.min_replicas)
    return deployment.num_replicas or 1


def replica_options(deployment: DeploymentSettings, most: int | None = None) -> dict[str, Any]:
    """`{"num_replicas": n}` or `{"autoscaling_config": {...}}` for `Deployment.options()`; autoscaling's
    `max_replicas` at most `most` (never below `min_replicas` or 1). A fixed count is what the operator asked for
    and stays."""
    if deployment.autoscaling is None:
        return {"num_replicas": initial_replicas(deployment)}
    config = deployment.autoscaling.model_dump()
    if most is not None:
        config["max_replicas"] = max(min(config["max_replicas"], most), config["min_replicas"], 1)
    return {"autoscaling_config": config}


def request_router_config(router: RouterSettings, prefix_cache: bool):
    """Ray's `RequestRouterConfig`: `PrefixAffinityRouter` with these settings, and whether the engine replicas keep
    a prefix cache (`engine.prefix_cache_bytes` not 0), or Ray's default router."""
    from ray.serve.config import RequestRouterConfig

    if router.policy == "power_of_two":
        return RequestRouterConfig()
    return RequestRouterConfig(request_router_class=ROUTER_CLASS,
                               request_router_kwargs={**router.model_dump(exclude={"policy"}),
                                                      "prefix_cache": prefix_cache})


def engine_options(args: AppArgs, cluster: ClusterShape) -> dict[str, Any]:
    """`Deployment.options()` for the engine: replicas (CPU autoscaling capped at what the cluster can place, with
    a WARNING when that lowers it), routing, queue bounds, health timeout, and the actor's resources."""
    placement, engine = args.placement, args.placement.engine
    replicas = replica_options(engine, placeable_engine_replicas(placement, cluster))
    asked = replica_options(engine)
    if replicas != asked:
        logger.warning("engine autoscaling max_replicas %d -> %d: this cluster's %g CPUs hold no more CPU engine "
                       "replicas beside the ingress; add CPU nodes, lower placement.engine.cpus, or set "
                       "placement.engine.num_replicas", asked["autoscaling_config"]["max_replicas"],
                       replicas["autoscaling_config"]["max_replicas"], cluster.cpus)
    gpu = resolve_accelerator(placement.accelerator, cluster.gpus) == "gpu"
    return {
        **replicas,
        "max_ongoing_requests": engine.max_ongoing_requests,
        "max_queued_requests": -1 if engine.max_queued_requests is None else engine.max_queued_requests,
        "request_router_config": request_router_config(args.router, args.engine.prefix_cache_bytes != 0),
        "health_check_timeout_s": engine.health_check_timeout_s,
        "ray_actor_options": {"num_cpus": engine_cpus(placement, cluster), "num_gpus": 1 if gpu else 0,
                              "runtime_env": worker_env(placement)},
    }


def ingress_options(args: AppArgs, cluster: ClusterShape) -> dict[str, Any]:
    """`Deployment.options()` for the ingress (CPU only)."""
    ingress = args.placement.ingress
    return {**replica_options(ingress), "max_ongoing_requests": ingress.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": ingress_cpus(args.placement, cluster),
                                  "runtime_env": worker_env(args.placement)}}


def combined_options(args: AppArgs, cluster: ClusterShape) -> dict[str, Any]:
    """`Deployment.options()` for an ingress that runs its engine replica itself (`placement.topology: combined`):
    the engine's replicas (capped as `engine_options` caps them) and health timeout, the ingress's bound on the
    calls the proxies hand it, and both reservations in one actor."""
    engine, ingress = engine_options(args, cluster), ingress_options(args, cluster)
    replicas = {key: engine[key] for key in ("num_replicas", "autoscaling_config") if key in engine}
    resources = engine["ray_actor_options"]
    return {**replicas, "max_ongoing_requests": ingress["max_ongoing_requests"],
            "health_check_timeout_s": engine["health_check_timeout_s"],
            "ray_actor_options": {**resources,
                                  "num_cpus": resources["num_cpus"] + ingress["ray_actor_options"]["num_cpus"]}}


def worker_env(placement: PlacementSettings) -> dict[str, Any]:
    """The replicas' runtime_env: their nice level (`placement.niceness`) as Ray's `worker_niceness`, which a worker
    reads when it starts (actors the replica creates, its IndexBuilder, inherit it). Ray's default, 15, starved a
    CPU engine replica against the node's other processes at 0 (a load generator, another service)."""
    return {"env_vars": {NICENESS_ENV: str(placement.niceness)}}
