"""`build`: the radixserve Ray Serve application from validated arguments (`serve_config.yaml` `args:`).

    serve run serve_config.yaml                 # import_path: deployments.app:build
    RADIXSERVE_MODEL=/models/tiny serve run serve_config.yaml

Two deployments: `Ingress` (CPU; validation, tokenization, routing key, splitting) and `EngineReplica` (one GPU
each with `accelerator: gpu`, routed by `PrefixAffinityRouter`, autoscaled). Both get the one validated `AppArgs`.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.serve import Application

from deployments.config import AppArgs
from deployments.engine_replica import EngineReplica
from deployments.ingress import Ingress

logger = logging.getLogger("ray.serve")


def build(args: dict[str, Any] | None = None) -> Application:
    """Validate `args` (unknown keys rejected) and bind the ingress to the engine deployment."""
    app_args = AppArgs.model_validate(args or {})
    cluster_gpus, node_cpus, cluster_cpus = cluster_shape()
    device = app_args.engine_torch_device(cluster_gpus)
    options = app_args.engine_options(cluster_gpus, node_cpus, cluster_cpus)
    asked = app_args.engine_replicas.to_serve_options()
    if options.get("autoscaling_config") != asked.get("autoscaling_config"):
        logger.warning("engine autoscaling max_replicas %d -> %d: this cluster's %g CPUs hold no more CPU engine "
                       "replicas beside the ingress; add CPU nodes, lower engine_cpus, or set engine_replicas",
                       asked["autoscaling_config"]["max_replicas"], options["autoscaling_config"]["max_replicas"],
                       cluster_cpus)
    engine = EngineReplica.options(**options).bind(app_args, device)
    return Ingress.options(**app_args.ingress_options(cluster_gpus)).bind(engine, app_args)


def cluster_shape() -> tuple[float, float, float | None]:
    """(GPUs in the cluster, CPUs of its largest live node, CPUs in the cluster); (0, 1, None) before Ray is
    started (nothing is known to cap)."""
    if not ray.is_initialized():
        return 0.0, 1.0, None
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    resources = ray.cluster_resources()
    return (resources.get("GPU", 0.0), max((n.get("CPU", 0.0) for n in nodes), default=1.0),
            resources.get("CPU", 0.0))
