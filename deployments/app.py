"""`build`: the radixserve Ray Serve application from validated arguments (`serve_config.yaml` `args:`).

    serve run serve_config.yaml                 # import_path: deployments.app:build
    RADIXSERVE_MODEL=/models/tiny serve run serve_config.yaml

Two deployments: `Ingress` (CPU; validation, tokenization, routing key, splitting) and `EngineReplica` (one GPU
each with `placement.accelerator: gpu`, routed by `PrefixAffinityRouter`, autoscaled). Both get the one validated
`AppArgs`; `deployments.placement` turns its placement into their Ray options for this cluster. With
`placement.topology: combined`, one deployment: `Ingress` replicas that each run an engine replica themselves
(`deployments.engine_link`).
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from deployments.config import AppArgs
from deployments.engine_replica import EngineReplica
from deployments.ingress import Ingress
from deployments.placement import ClusterShape, combined_options, engine_config, engine_options, ingress_options


def build(args: dict[str, Any] | None = None) -> Application:
    """Validate `args` (unknown keys rejected) and bind the ingress to the engine deployment, or to the engine it
    runs itself (combined topology)."""
    app_args = AppArgs.model_validate(args or {})
    cluster = ClusterShape.of_ray()
    if app_args.placement.topology == "combined":
        return Ingress.options(**combined_options(app_args, cluster)).bind(engine_config(app_args, cluster), app_args)
    engine = EngineReplica.options(**engine_options(app_args, cluster)).bind(app_args, engine_config(app_args, cluster))
    return Ingress.options(**ingress_options(app_args, cluster)).bind(engine, app_args)
