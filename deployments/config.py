"""Typed application arguments (`serve_config.yaml` `args:`): one section per part of the server, each the part's
own config type, so a setting has one name and one default from the YAML down to the replica.

    args:
      model: Qwen/Qwen3-Reranker-0.6B      # $RADIXSERVE_MODEL overrides it
      engine: {radix: full}                # radix_core.EngineConfig
      tasks:                               # radix_core.TaskConfig
        max_items: 256
        templates: {rerank: {prefix: "...", body: "...{query}...{document}", suffix: "..."}}
      batching: {max_queue_wait_s: 2}      # deployments.batching_config.BatchingConfig
      limits: {max_request_tokens: 4096}   # LimitSettings: what one request may hold
      auth: {api_keys_file: /etc/radixserve/api-keys}
      router: {load_factor: 1.5}           # RouterSettings
      placement:                           # PlacementSettings: accelerator, replicas, reservations
        engine: {autoscaling: {min_replicas: 1, max_replicas: 4}}

`engine`, `tasks` and `batching` are the components' dataclasses themselves: pydantic checks each field against
the dataclass's annotation and then the dataclass's own checks run, so a field added there is a setting here
with no edit. Every section rejects unknown keys with a message naming them and the closest known key, or the
section a key belongs in when it is given at the wrong level, so a typo fails at start-up instead of silently
keeping a default. How the placement becomes Ray Serve options is `deployments.placement`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from deployments.auth import DEFAULT_CACHE_SCOPE, CacheScope
from deployments.batching_config import BatchingConfig
from deployments.hash_ring import DEFAULT_LOAD_FACTOR, DEFAULT_VIRTUAL_NODES
from radix_core.engine_config import EngineConfig
from radix_core.tasks import TaskConfig

MODEL_ENV = "RADIXSERVE_MODEL"
SERVER_DEVICES = ("auto", "cpu")  # engine.device in a server: the replica's GPU reservation decides the rest
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
Accelerator = Literal["auto", "gpu", "cpu"]
Topology = Literal["split", "combined"]  # placement.topology


def reject_unknown_keys(owner: type, data: Any) -> Any:
    """`data` unchanged, unless it is a dict with keys `owner` (a pydantic model or a dataclass) does not have: then
    a ValueError naming each, with the closest known key or the section that holds a key of that name."""
    if not isinstance(data, dict):
        return data
    known = _keys(owner)
    unknown = sorted(str(key) for key in data if key not in known)
    if unknown:
        deeper = list(_nested_paths(owner))
        hints = ", ".join(f"{key!r}{_hint(key, known, deeper)}" for key in unknown)
        raise ValueError(f"unknown setting(s) {hints} for {owner.__name__}; known: {', '.join(known)}")
    return data


def _keys(owner: Any) -> list[str]:
    """The setting names of a section type (a pydantic model or a dataclass, optional or not); none for a value."""
    owner = next((kind for kind in (owner, *get_args(owner)) if isinstance(kind, type)
                  and (issubclass(kind, BaseModel) or dataclasses.is_dataclass(kind))), None)
    if owner is None:
        return []
    if issubclass(owner, BaseModel):
        return list(owner.model_fields)
    return [field.name for field in dataclasses.fields(owner)]


def _nested_paths(owner: type, prefix: str = "") -> Iterator[str]:
    """Dotted paths of the settings inside `owner`'s sections (`batching.max_batch_tokens`, ...)."""
    if not (isinstance(owner, type) and issubclass(owner, BaseModel)):
        return
    for name, field in owner.model_fields.items():
        for key in _keys(field.annotation):
            yield f"{prefix}{name}.{key}"
        for kind in (field.annotation, *get_args(field.annotation)):
            yield from _nested_paths(kind, f"{prefix}{name}.")


def _hint(key: str, known: list[str], deeper: list[str]) -> str:
    """` (it belongs in 'a.key')` for a key given at the wrong level, else ` (did you mean 'x'?)`, else nothing."""
    moved = [path for path in deeper if path.rsplit(".", 1)[-1] == key]
    if moved:
        return f" (it belongs in {' or '.join(repr(path) for path in moved)})"
    close = difflib.get_close_matches(key, known, n=1)
    if not close:
        names = {path.rsplit(".", 1)[-1]: path for path in deeper}
        close = [names[name] for name in difflib.get_close_matches(key, names, n=1)]
    return f" (did you mean {close[0]!r}?)" if close else ""


def dataclass_section(config_type: type) -> Any:
    """A component's dataclass as a section: pydantic validates a dict into it field by field (by the dataclass's
    annotations, then its own `__post_init__` checks), after unknown keys are refused by name."""
    return Annotated[config_type, BeforeValidator(lambda data: reject_unknown_keys(config_type, data))]


EngineSection = dataclass_section(EngineConfig)
TaskSection = dataclass_section(TaskConfig)
BatchingSection = dataclass_section(BatchingConfig)


class StrictSettings(BaseModel):
    """Strict base: unknown keys are an error that names them; inputs stay out of errors (keys may be misplaced)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        return reject_unknown_keys(cls, data)


class LimitSettings(StrictSettings):
    """What one request may hold at the ingress (items and tokens per item are `tasks`')."""

    max_request_tokens: int = Field(
        8192, ge=1, description="The ingress cuts a larger request into parts of at most this many tokens (whole "
                                "items), sent together in one call and admitted together; the batcher fills "
                                "batches with parts.")
    max_request_bytes: int = Field(
        16 * 1024 * 1024, ge=1, description="Largest request the ingress accepts (a gRPC message, an HTTP body); "
                                            "larger ones get RESOURCE_EXHAUSTED (HTTP 413) naming this limit. Ray's "
                                            "gRPC proxy itself accepts up to $RAY_SERVE_GRPC_MAX_MESSAGE_SIZE, which "
                                            "`radixserve serve` sets just above this.")
    client_input_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Seconds the ingress waits for a client's input: an HTTP body must arrive "
                                         "in full (else 408), a tei.v1 client stream must end (else "
                                         "DEADLINE_EXCEEDED), a bidirectional stream's next message must come (else "
                                         "the stream ends with DEADLINE_EXCEEDED after the earlier answers). Such "
                                         "a call holds a connection meanwhile, not a place in "
                                         "max_in_flight_requests. 16 MiB in 30 s needs about 4.5 Mbit/s.")
    max_in_flight_requests: int = Field(
        1024, ge=1, description="Complete requests one ingress replica answers at once on each transport (HTTP, "
                                "gRPC: each its own bound, so one cannot exhaust the other), counted once the "
                                "body or the stream's messages are all in; one more is refused at once with "
                                "RESOURCE_EXHAUSTED (HTTP 429) and a retry hint. Keep it well under "
                                "placement.ingress.max_ongoing_requests, which also counts calls still sending.")


class AuthSettings(StrictSettings):
    """Where the client API keys are (never the keys). Neither set: no auth."""

    api_keys_file: str | None = Field(
        None, description="Path of a file with one API key per line (# starts a comment); calls then need "
                          "'authorization: Bearer <key>' (gRPC metadata or HTTP header).")
    api_keys_env: str | None = Field(
        None, description="Name of an environment variable holding comma-separated API keys (not the keys).")
    prefix_cache_scope: CacheScope = Field(
        DEFAULT_CACHE_SCOPE, description="key: each API key reads only the prefix cache K/V its own calls filled (a "
                                         "shared cache's hits show in latency across tenants); shared: one cache "
                                         "for every key (one tenant behind several keys). Without keys the cache "
                                         "is shared.")

    @field_validator("api_keys_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not _ENV_NAME.fullmatch(name):
            raise ValueError(f"auth.api_keys_env must name an environment variable (letters, digits, _), got a "
                             f"value of {len(name)} characters; put the keys in that variable, not in this file")
        return name


class RouterSettings(StrictSettings):
    """How the ingress picks an engine replica: PrefixAffinityRouter (consistent hashing with bounded loads over
    the replicas, keyed by the request's prefix) or Ray Serve's default power-of-two-choices router."""

    policy: Literal["prefix_affinity", "power_of_two"] = Field(
        "prefix_affinity", description="prefix_affinity: one prefix -> one replica (shared prefixes computed once "
                                       "per batch); power_of_two: Ray Serve's default, for comparison.")
    load_factor: float = Field(DEFAULT_LOAD_FACTOR, ge=1.0, le=10.0,
                               description="A replica above this multiple of the mean outstanding tokens is "
                                           "skipped for new keys' requests (1.25 = 25% over the mean).")
    virtual_nodes: int = Field(DEFAULT_VIRTUAL_NODES, ge=1, le=4096,
                               description="Ring points per replica; more spread keys more evenly.")
    min_load_tokens: int = Field(
        0, ge=0, description="A replica with at most this many outstanding tokens is never skipped. 0 is the plain "
                             "bounded-load rule (concurrent requests of one key spread when the others idle); "
                             "batching.max_batch_tokens keeps a burst of one prefix together while it fits one "
                             "batch.")


class AutoscalingSettings(StrictSettings):
    """Ray Serve request-based autoscaling for one deployment."""

    min_replicas: int = Field(1, ge=0, description="Fewest replicas kept running (0 allows scale to zero).")
    max_replicas: int = Field(4, ge=1, description="Most replicas; each engine replica needs its accelerator.")
    target_ongoing_requests: float = Field(
        32.0, gt=0, description="Requests per replica (running + queued) the autoscaler aims for; an engine "
                                "replica batches many requests at once, so this is far above Ray's default of 2.")
    upscale_delay_s: float = Field(30.0, ge=0, description="How long load must stay high before scaling up.")
    downscale_delay_s: float = Field(600.0, ge=0, description="How long load must stay low before scaling down.")

    @model_validator(mode="after")
    def _min_below_max(self) -> AutoscalingSettings:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        return self


class DeploymentSettings(StrictSettings):
    """One deployment's replicas: a fixed `num_replicas`, or `autoscaling` (not both); neither: one replica."""

    num_replicas: int | None = Field(None, ge=1, description="Fixed replica count (without autoscaling); unset "
                                                             "without autoscaling: one replica.")
    autoscaling: AutoscalingSettings | None = Field(None, description="Autoscaling bounds and targets, instead of "
                                                                      "num_replicas.")

    @model_validator(mode="after")
    def _fixed_or_autoscaled(self) -> DeploymentSettings:
        if self.autoscaling is not None and self.num_replicas is not None:
            raise ValueError("set num_replicas (a fixed count) or autoscaling (min/max bounds), not both")
        return self


class EngineDeployment(DeploymentSettings):
    """The engine replicas (one accelerator each with a gpu accelerator) and Ray Serve's bounds on their calls."""

    cpus: float | None = Field(
        None, ge=0.0, description="CPUs reserved per engine replica; a CPU replica runs torch on that many threads "
                                  "(rounded up). Default: 1 with GPUs; on CPU, the largest node's cores less the "
                                  "ingress's, shared by the engine replicas.")
    max_ongoing_requests: int = Field(
        256, ge=1, description="Requests one engine replica accepts at once; beyond it the replica refuses and "
                               "the router tries the next one, so keep it above a full batch's request count.")
    max_queued_requests: int | None = Field(
        2048, ge=1, description="Requests each caller may queue for the engine before getting a back-pressure "
                                "error (Ray Serve's max_queued_requests); unset for no bound.")
    health_check_timeout_s: float = Field(
        60.0, gt=0, description="Seconds an engine replica's health probe may take before it counts as failed (Ray "
                                "Serve's health_check_timeout_s, default 30; Serve replaces a replica after 3 "
                                "failed probes in a row, one every 10 s). A flash-attn 4 compile holds the GIL "
                                "(flash-attention#2635), so a kernel compiling after start-up keeps the probe from "
                                "answering: 60 s survives about 3 minutes of compiling. Start-up itself (the "
                                "warm-up in EngineReplica's constructor) is not probed and has no timeout in Serve.")


class IngressDeployment(DeploymentSettings):
    """The ingress replicas (CPU only)."""

    cpus: float | None = Field(
        None, ge=0.0, description="CPUs reserved per ingress replica, which tokenizes every request. Default: 1 "
                                  "with GPUs; on CPU a share of one (deployments.placement.CPU_INGRESS_CPUS), as "
                                  "the engine needs the cores more.")
    max_ongoing_requests: int = Field(
        16384, ge=1, description="Calls Ray Serve's proxies hand one ingress replica at once (beyond it they "
                                 "queue them), counted from the HTTP headers or the gRPC stream's start, so calls "
                                 "still sending their input hold one: sized for connections, which wait as cheap "
                                 "coroutines (each is also an open file in the proxy: `radixserve serve` raises the "
                                 "open-files limit). The work admitted at once is limits.max_in_flight_requests.")


NICENESS_ENV = "RAY_worker_niceness"  # Ray's nice level for a worker, which the worker reads from its environment


class PlacementSettings(StrictSettings):
    """Where and how many: the engine's accelerator, each deployment's replicas and reservations
    (`deployments.placement` turns them into Ray Serve options)."""

    accelerator: Accelerator = Field(
        "auto", description="gpu: one GPU per engine replica; auto: gpu when the Ray cluster has GPUs, else cpu.")
    topology: Topology = Field(
        "split", description="split: ingress and engine replicas are deployments of their own, and the ingress "
                             "routes each prefix key to one engine replica (PrefixAffinityRouter); combined: each "
                             "ingress replica runs an engine replica in its own process (one Ray hop and one process "
                             "fewer a request; the proxy picks replicas by load, not by prefix), with placement."
                             "engine's replicas, reservations and health timeout. combined suits one engine replica "
                             "(a one-GPU node, a CPU machine); deployments/engine_link.py.")
    engine: EngineDeployment = Field(default_factory=EngineDeployment, description="The engine replicas.")
    ingress: IngressDeployment = Field(default_factory=IngressDeployment, description="The ingress replicas.")
    niceness: int = Field(
        0, ge=0, le=19, description="The nice level of the ingress and engine replicas and their IndexBuilder actors "
                                    "(Ray's worker_niceness; Ray starts its workers at 15 so that its daemons win "
                                    "the CPU). 0: the priority of the node's other processes; at 15 a CPU engine "
                                    "gets about 1/28 of a core against each busy process at 0 (CFS weights 36 and "
                                    "1024).")

    @model_validator(mode="after")
    def _one_replica_count(self) -> PlacementSettings:
        if self.topology == "combined" and {"num_replicas", "autoscaling"} & self.ingress.model_fields_set:
            raise ValueError("placement.topology combined runs the engine inside the ingress replicas, whose count "
                             "is placement.engine's: remove placement.ingress.num_replicas and .autoscaling")
        return self


class AppArgs(StrictSettings):
    """Arguments of the radixserve application (`deployments.app:build`), validated once and passed whole to both
    deployments."""

    model: str = Field(min_length=1, description=f"Hugging Face model id or local directory; ${MODEL_ENV} "
                                                 "overrides it.")
    served_model_name: str | None = Field(
        None, min_length=1, description="The name clients send as `model` (Cohere, OpenAI, Jina) and that /info and "
                                        "Info report; a request naming a model other than this or `model` gets "
                                        "404. Unset: `model` for a hub id, the directory's name for a local "
                                        "directory (Info never shows a filesystem path).")
    primary_task: Literal["rerank", "embed", "classify"] | None = Field(
        None, description="The model's main task, reported as TEI's model_type by /info and tei.v1 Info "
                          "(tei-client reranks only on a reranker, embeds only on an embedding model); every task "
                          "stays callable. Unset: from the checkpoint (deployments/model_card.py).")
    engine: EngineSection = Field(
        default_factory=EngineConfig, description="radix_core.EngineConfig, how the engine runs (dtype, radix "
                                                  "mode, attention backend, ...); in a server, device is auto (CUDA "
                                                  "where the replica reserves a GPU) or cpu (the CPU even then, to "
                                                  "exercise GPU scheduling on a machine without one).")
    tasks: TaskSection = Field(
        default_factory=TaskConfig, description="radix_core.TaskConfig, what the tasks accept (items per request, "
                                                "tokens per item, prompt templates by task, ...).")
    batching: BatchingSection = Field(
        default_factory=BatchingConfig, description="deployments.batching_config.BatchingConfig: the engine "
                                                    "replica's batch budget, wait, queue bounds and priority aging.")
    limits: LimitSettings = Field(default_factory=LimitSettings, description="What one request may hold.")
    auth: AuthSettings = Field(default_factory=AuthSettings, description="Where the API keys are.")
    router: RouterSettings = Field(default_factory=RouterSettings, description="Prefix-affinity routing.")
    placement: PlacementSettings = Field(default_factory=PlacementSettings,
                                         description="Accelerator, replicas and reservations of both deployments.")

    @model_validator(mode="before")
    @classmethod
    def _model_from_env(cls, data: Any) -> Any:
        override = os.environ.get(MODEL_ENV)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            return data
        if override:
            return {**data, "model": override}
        if "model" not in data:
            raise ValueError(f"no model: set args.model in the config (a Hugging Face model id or a local "
                             f"directory) or the environment variable {MODEL_ENV}")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> AppArgs:
        if self.engine.device not in SERVER_DEVICES:
            raise ValueError(f"engine.device must be auto (CUDA where the replica reserves a GPU: "
                             f"placement.accelerator) or cpu, got {self.engine.device!r}")
        request, batch = self.limits.max_request_tokens, self.batching.max_batch_tokens
        if request > batch:
            raise ValueError(f"limits.max_request_tokens ({request}) must be <= batching.max_batch_tokens ({batch}) "
                             f"so one part of a request fits one engine batch")
        if self.tasks.max_tokens is not None and self.tasks.max_tokens > request:
            raise ValueError(f"tasks.max_tokens ({self.tasks.max_tokens}) must be <= limits.max_request_tokens "
                             f"({request}): an item cannot be split across parts")
        return self
