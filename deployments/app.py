"""`build`: the radixserve Ray Serve application from validated arguments (`serve_config.yaml` `args:`).

    serve run serve_config.yaml                 # import_path: deployments.app:build
    RADIXSERVE_MODEL=/models/tiny serve run serve_config.yaml

Two deployments: `Ingress` (CPU; validation, routing key, splitting) and `EngineReplica` (one GPU each with
`accelerator: gpu`, routed by `PrefixAffinityRouter`, autoscaled).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.serve import Application

from deployments.config import AppArgs
from deployments.engine_replica import EngineReplica, EngineSettings
from deployments.ingress import Ingress, IngressSettings


def build(args: dict[str, Any] | None = None) -> Application:
    """Validate `args` (unknown keys rejected) and bind the ingress to the engine deployment."""
    app_args = AppArgs.model_validate(args or {})
    cluster_gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
    device = "cuda" if app_args.resolved_accelerator(cluster_gpus) == "gpu" else "cpu"
    engine = EngineReplica.options(**app_args.engine_options(cluster_gpus)).bind(engine_settings(app_args, device))
    return Ingress.options(**app_args.ingress_options()).bind(engine, ingress_settings(app_args))


def engine_settings(args: AppArgs, device: str) -> EngineSettings:
    return EngineSettings(
        model=args.model, device=device, dtype=args.dtype, radix=args.radix, radix_threshold=args.radix_threshold,
        attention=args.attention, max_items=args.max_items_per_request, max_tokens_per_item=args.max_tokens_per_item,
        max_batch_tokens=args.max_batch_tokens, batch_wait_timeout_s=args.batch_wait_timeout_s,
        index_builder=args.index_builder,
    )


def ingress_settings(args: AppArgs) -> IngressSettings:
    return IngressSettings(
        model=args.model, max_items=args.max_items_per_request, max_tokens_per_item=args.max_tokens_per_item,
        max_request_tokens=args.max_request_tokens, max_request_bytes=args.max_request_bytes,
        api_keys_file=args.api_keys_file, api_keys_env=args.api_keys_env,
    )
