"""`build`: the radixserve Ray Serve application from validated arguments (`serve_config.yaml` `args:`).

    serve run serve_config.yaml                 # import_path: deployments.app:build
    RADIXSERVE_MODEL=/models/tiny serve run serve_config.yaml

Two deployments: `Ingress` (CPU; validation, tokenization, routing key, splitting) and `EngineReplica` (one GPU
each with `accelerator: gpu`, routed by `PrefixAffinityRouter`, autoscaled). Both get the one validated `AppArgs`.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.serve import Application

from deployments.config import AppArgs
from deployments.engine_replica import EngineReplica
from deployments.ingress import Ingress


def build(args: dict[str, Any] | None = None) -> Application:
    """Validate `args` (unknown keys rejected) and bind the ingress to the engine deployment."""
    app_args = AppArgs.model_validate(args or {})
    cluster_gpus, node_cpus = cluster_shape()
    device = app_args.engine_torch_device(cluster_gpus)
    engine = EngineReplica.options(**app_args.engine_options(cluster_gpus, node_cpus)).bind(app_args, device)
    return Ingress.options(**app_args.ingress_options(cluster_gpus)).bind(engine, app_args)


def cluster_shape() -> tuple[float, float]:
    """(GPUs in the cluster, CPUs of its largest live node); (0, 1) before Ray is started."""
    if not ray.is_initialized():
        return 0.0, 1.0
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    return ray.cluster_resources().get("GPU", 0.0), max((n.get("CPU", 0.0) for n in nodes), default=1.0)
