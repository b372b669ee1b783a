"""Typed application arguments (`serve_config.yaml` `args:`), and their translation to Ray Serve options.

Every model rejects unknown keys with a message naming them (and the closest known key), so a typo in the YAML
fails at start-up instead of silently keeping a default. `RADIXSERVE_MODEL` in the environment overrides
`model`, so a local directory can be served without editing the file. Importing this module does not import
torch or start Ray; the Ray objects are built by the helpers on demand.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from deployments.hash_ring import DEFAULT_LOAD_FACTOR, DEFAULT_VIRTUAL_NODES

if TYPE_CHECKING:
    from radix_core.tasks import TaskConfig

MODEL_ENV = "RADIXSERVE_MODEL"
DEFAULT_MODEL = "Qwen/Qwen3-Reranker-0.6B"
ROUTER_CLASS = "deployments.router:PrefixAffinityRouter"
CPU_INGRESS_CPUS = 0.25  # an ingress beside CPU engines: tokenizing is a small share of a CPU forward
MIN_ENGINE_CPUS = 0.5
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Settings(BaseModel):
    """Strict base: unknown keys are an error that names them; inputs stay out of errors (keys may be misplaced)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(k) for k in data if k not in cls.model_fields)
            if unknown:
                hints = []
                for key in unknown:
                    close = difflib.get_close_matches(key, cls.model_fields, n=1)
                    hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
                raise ValueError(f"unknown setting(s) {', '.join(hints)} for {cls.__name__}; "
                                 f"known: {', '.join(cls.model_fields)}")
        return data


class AutoscalingSettings(_Settings):
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

    def to_autoscaling_config(self) -> dict[str, Any]:
        """The `autoscaling_config` dict Ray Serve takes in `.options()` or a deployment's YAML."""
        return self.model_dump()


class ReplicaSettings(_Settings):
    """How many replicas a deployment runs: a fixed `num_replicas`, or `autoscaling` (exactly one of them).

    A bare integer is accepted as shorthand for `num_replicas`.
    """

    num_replicas: int | None = Field(None, ge=1, description="Fixed replica count (without autoscaling).")
    autoscaling: AutoscalingSettings | None = Field(None, description="Autoscaling bounds and targets.")

    @model_validator(mode="before")
    @classmethod
    def _int_shorthand(cls, data: Any) -> Any:
        return {"num_replicas": data} if isinstance(data, int) and not isinstance(data, bool) else data

    @model_validator(mode="after")
    def _exactly_one(self) -> ReplicaSettings:
        if (self.num_replicas is None) == (self.autoscaling is None):
            raise ValueError("set exactly one of num_replicas (a fixed count) or autoscaling (min/max bounds), "
                             f"got num_replicas={self.num_replicas} and autoscaling={self.autoscaling}")
        return self

    @property
    def initial_replicas(self) -> int:
        """Replicas at start: the fixed count, or autoscaling's minimum (at least 1)."""
        return self.num_replicas if self.autoscaling is None else max(1, self.autoscaling.min_replicas)

    def capped(self, most: int) -> ReplicaSettings:
        """These settings with autoscaling's `max_replicas` at most `most` (never below `min_replicas` or 1); a fixed
        count is what the operator asked for and stays."""
        if self.autoscaling is None:
            return self
        bound = max(min(self.autoscaling.max_replicas, most), self.autoscaling.min_replicas, 1)
        return self.model_copy(update={"autoscaling": self.autoscaling.model_copy(update={"max_replicas": bound})})

    def to_serve_options(self) -> dict[str, Any]:
        """`{"num_replicas": n}` or `{"autoscaling_config": {...}}` for `Deployment.options()`."""
        if self.autoscaling is not None:
            return {"autoscaling_config": self.autoscaling.to_autoscaling_config()}
        return {"num_replicas": self.num_replicas}


class RouterSettings(_Settings):
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
                             "max_batch_tokens keeps a burst of one prefix together while it fits one batch.")

    def to_request_router_config(self):
        """Ray's `RequestRouterConfig`: `PrefixAffinityRouter` with these settings, or Ray's default router."""
        from ray.serve.config import RequestRouterConfig

        if self.policy == "power_of_two":
            return RequestRouterConfig()
        return RequestRouterConfig(request_router_class=ROUTER_CLASS,
                                   request_router_kwargs=self.model_dump(exclude={"policy"}))


class AppArgs(_Settings):
    """Arguments of the radixserve application (`deployments.app:build`)."""

    model: str = Field(DEFAULT_MODEL, min_length=1,
                       description=f"Hugging Face model id or local directory; ${MODEL_ENV} overrides it.")
    engine_device: Literal["auto", "cpu"] = Field(
        "auto", description="auto: CUDA where the engine reserves a GPU (accelerator gpu), else the CPU. cpu: the "
                            "CPU even while a GPU is reserved, to exercise GPU scheduling and autoscaling on a "
                            "machine without one (ray start --num-gpus N).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights and activations dtype; auto is bfloat16 on GPU, float32 on CPU.")
    accelerator: Literal["auto", "gpu", "cpu"] = Field(
        "auto", description="gpu: one GPU per engine replica; auto: gpu when the Ray cluster has GPUs, else cpu.")
    radix: Literal["auto", "off", "mlp", "full"] = Field(
        "auto", description="off: ragged baseline; mlp: RadixMLP; full: compact attention too; auto: per batch.")
    radix_threshold: float = Field(0.9, ge=0.0, le=1.0,
                                   description="radix=auto runs full when a batch's compression N'/N is at most "
                                               "this, else off.")
    attention: Literal["auto", "torch", "flash", "triton"] = Field(
        "auto", description="Attention backend; auto is flash-attn on CUDA in half precision when installed.")
    max_batch_tokens: int = Field(16384, ge=1, description="Token budget of one engine batch.")
    index_builder: Literal["actor", "inline"] = Field(
        "actor", description="actor: index batch k+1 in a per-replica actor while batch k runs; "
                             "inline: build each batch just before running it (for comparison).")
    batch_wait_timeout_s: float = Field(0.01, ge=0.0, le=10.0,
                                        description="Longest a request waits for its batch to fill.")
    max_items_per_request: int = Field(1024, ge=1, description="Most items (documents, texts) in one request.")
    max_tokens_per_item: int | None = Field(
        None, ge=1, description="Most tokens of one templated item; default the model's maximum length.")
    max_request_tokens: int = Field(
        8192, ge=1, description="The ingress cuts a larger request into parts of at most this many tokens (whole "
                                "items), sent together in one call and admitted together; the batcher fills "
                                "batches with parts.")
    client_input_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Seconds the ingress waits for a client's input: an HTTP body must arrive "
                                         "in full (else 408), a tei.v1 client stream must end (else "
                                         "DEADLINE_EXCEEDED), a bidirectional stream's next message must come (else "
                                         "the stream ends with DEADLINE_EXCEEDED after the earlier answers). Each "
                                         "such call holds an ingress request slot meanwhile, so slow or idle peers "
                                         "cannot hold them all. 16 MiB (the default max_request_bytes) in 30 s needs "
                                         "about 4.5 Mbit/s.")
    max_request_bytes: int = Field(
        16 * 1024 * 1024, ge=1, description="Largest gRPC request message the ingress accepts; larger ones get "
                                            "RESOURCE_EXHAUSTED naming this limit. Ray's gRPC proxy itself "
                                            "accepts up to $RAY_SERVE_GRPC_MAX_MESSAGE_SIZE (2 GiB by default).")
    special_tokens_in_user_text: bool = Field(
        False, description="false: special-token literals in user text (<|im_end|> in a document) are plain text, "
                           "only the prompt template's are control tokens. true: the tokenizer's raw behaviour; "
                           "anyone who writes a document can then rewrite the prompt (e.g. answer 'yes' for a "
                           "reranker), so only for fully trusted text.")
    api_keys_file: str | None = Field(
        None, description="Path of a file with one API key per line (# starts a comment); gRPC calls then need "
                          "the metadata 'authorization: Bearer <key>'. Unset together with api_keys_env: no auth.")
    api_keys_env: str | None = Field(
        None, description="Name of an environment variable holding comma-separated API keys (not the keys).")
    max_ongoing_requests: int = Field(
        256, ge=1, description="Requests one engine replica accepts at once; beyond it the replica refuses and "
                               "the router tries the next one, so keep it above a full batch's request count.")
    ingress_max_ongoing_requests: int = Field(
        1024, ge=1, description="Requests one ingress replica handles at once (each mostly awaits the engine); "
                                "beyond it the proxy queues them.")
    max_queued_tokens: int | None = Field(
        None, ge=1, description="Work one engine replica queues before refusing more requests at once with "
                                "RESOURCE_EXHAUSTED and a retry hint, in rows the device will compute (a request's "
                                "shared prefix counts once). A request is admitted or refused whole, and never "
                                "while the replica's queue is empty, so any request the request limits accept runs "
                                "on an idle replica. Default 64 x max_batch_tokens.")
    max_queue_wait_s: float | None = Field(
        None, gt=0, description="An engine replica refuses a request at once (RESOURCE_EXHAUSTED with a retry hint) "
                               "when more than this many seconds of work are ahead of it (running, prepared and "
                               "queued work at its recent rate) and its queue is not empty: the queueing an "
                               "accepted request may see under overload (a latency bound: lower it where latency "
                               "matters more than full batches). Unset: bounded by max_queued_tokens only.")
    batch_priority_aging_s: float = Field(
        30.0, gt=0, description="Requests sent with priority batch run after interactive ones (they only fill what "
                                "interactive work leaves of a batch) until they have waited this long; then they "
                                "count as interactive, so bulk work is never starved.")
    max_queued_requests: int | None = Field(
        2048, ge=1, description="Requests each caller may queue for the engine before getting a back-pressure "
                                "error (Ray Serve's max_queued_requests); unset for no bound.")
    engine_cpus: float | None = Field(
        None, ge=0.0, description="CPUs reserved per engine replica; a CPU replica runs torch on that many threads "
                                  "(rounded up). Default: 1 with GPUs; on CPU, the largest node's cores less the "
                                  "ingress's, shared by the engine replicas.")
    ingress_cpus: float | None = Field(
        None, ge=0.0, description="CPUs reserved per ingress replica, which tokenizes every request. Default: 1 "
                                  "with GPUs, 0.25 on CPU (the engine needs the cores more).")
    engine_health_check_timeout_s: float = Field(
        60.0, gt=0, description="Seconds an engine replica's health probe may take before it counts as failed (Ray "
                                "Serve's health_check_timeout_s, default 30; Serve replaces a replica after 3 "
                                "failed probes in a row, one every 10 s). A flash-attn 4 compile holds the GIL "
                                "(flash-attention#2635), so a kernel compiling after start-up keeps the probe from "
                                "answering: 60 s survives about 3 minutes of compiling. Start-up itself (the "
                                "warm-up in EngineReplica's constructor) is not probed and has no timeout in Serve.")
    engine_replicas: ReplicaSettings = Field(default_factory=lambda: ReplicaSettings(num_replicas=1),
                                             description="Engine replica count or autoscaling.")
    ingress_replicas: ReplicaSettings = Field(default_factory=lambda: ReplicaSettings(num_replicas=1),
                                              description="Ingress (CPU) replica count or autoscaling.")
    router: RouterSettings = Field(default_factory=RouterSettings, description="Prefix-affinity routing.")
    served_model_name: str | None = Field(
        None, min_length=1, description="The name clients send as `model` (Cohere, OpenAI, Jina) and that /info and "
                                        "Info report; a request naming a model other than this or `model` gets "
                                        "404. Unset: `model` for a hub id, the directory's name for a local "
                                        "directory (Info never shows a filesystem path).")
    primary_task: Literal["rerank", "embed", "classify"] | None = Field(
        None, description="The model's main task, reported as TEI's model_type by /info and tei.v1 Info "
                          "(tei-client reranks only on a reranker, embeds only on an embedding model); every task "
                          "stays callable. Unset: from the checkpoint (deployments/model_card.py).")

    @model_validator(mode="before")
    @classmethod
    def _model_from_env(cls, data: Any) -> Any:
        override = os.environ.get(MODEL_ENV)
        if override and isinstance(data, dict):
            return {**data, "model": override}
        if override and data is None:
            return {"model": override}
        return data

    @field_validator("api_keys_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not _ENV_NAME.fullmatch(name):
            raise ValueError(f"api_keys_env must name an environment variable (letters, digits, _), got a value "
                             f"of {len(name)} characters; put the keys in that variable, not in this file")
        return name

    @model_validator(mode="after")
    def _limits_consistent(self) -> AppArgs:
        if self.max_request_tokens > self.max_batch_tokens:
            raise ValueError(f"max_request_tokens ({self.max_request_tokens}) must be <= max_batch_tokens "
                             f"({self.max_batch_tokens}) so one part of a request fits one engine batch")
        if self.max_tokens_per_item is not None and self.max_tokens_per_item > self.max_request_tokens:
            raise ValueError(f"max_tokens_per_item ({self.max_tokens_per_item}) must be <= max_request_tokens "
                             f"({self.max_request_tokens}): an item cannot be split across parts")
        return self

    def resolved_accelerator(self, cluster_gpus: float) -> Literal["gpu", "cpu"]:
        """gpu or cpu, given `ray.cluster_resources().get("GPU", 0)`; see `resolve_accelerator`."""
        return resolve_accelerator(self.accelerator, cluster_gpus)

    @property
    def queued_token_bound(self) -> int:
        """`max_queued_tokens`, or 64 batches' worth."""
        return self.max_queued_tokens if self.max_queued_tokens is not None else 64 * self.max_batch_tokens

    def engine_torch_device(self, cluster_gpus: float) -> str:
        """The engine replicas' torch device: "cuda" where they reserve a GPU, unless engine_device is cpu."""
        return "cuda" if self.resolved_accelerator(cluster_gpus) == "gpu" and self.engine_device == "auto" else "cpu"

    def task_config(self) -> TaskConfig:
        """What the tasks accept, for the ingress (which encodes) and the engine (its library methods)."""
        from radix_core.tasks import TaskConfig

        return TaskConfig(max_items=self.max_items_per_request, max_tokens=self.max_tokens_per_item,
                          special_tokens_in_user_text=self.special_tokens_in_user_text)

    def resolved_ingress_cpus(self, cluster_gpus: float) -> float:
        if self.ingress_cpus is not None:
            return self.ingress_cpus
        return 1.0 if self.resolved_accelerator(cluster_gpus) == "gpu" else CPU_INGRESS_CPUS

    def resolved_engine_cpus(self, cluster_gpus: float, node_cpus: float) -> float:
        """CPUs per engine replica: as set, else 1 beside a GPU, else `node_cpus` (the largest node's) less the
        ingress's reservation, split between the engine replicas (at least MIN_ENGINE_CPUS each)."""
        if self.engine_cpus is not None:
            return self.engine_cpus
        if self.resolved_accelerator(cluster_gpus) == "gpu":
            return 1.0
        ingress = self.resolved_ingress_cpus(cluster_gpus) * self.ingress_replicas.initial_replicas
        return max(MIN_ENGINE_CPUS, (node_cpus - ingress) / self.engine_replicas.initial_replicas)

    def placeable_engine_replicas(self, cluster_gpus: float, node_cpus: float, cluster_cpus: float) -> int | None:
        """How many CPU engine replicas the cluster's CPUs hold beside the ingress replicas; None on GPUs, where the
        cluster autoscaler adds nodes for replicas that ask for one."""
        engine_cpus = self.resolved_engine_cpus(cluster_gpus, node_cpus)
        if self.resolved_accelerator(cluster_gpus) == "gpu" or engine_cpus <= 0:
            return None
        ingress = self.resolved_ingress_cpus(cluster_gpus) * self.ingress_replicas.initial_replicas
        return int((cluster_cpus - ingress) // engine_cpus)

    def engine_options(self, cluster_gpus: float, node_cpus: float,
                       cluster_cpus: float | None = None) -> dict[str, Any]:
        """`Deployment.options()` for the engine: replicas, routing, queue bounds, health timeout, and the actor's
        resources. With `cluster_cpus`, CPU autoscaling never reaches for more replicas than the cluster can
        place."""
        accelerator = self.resolved_accelerator(cluster_gpus)
        most = None if cluster_cpus is None else self.placeable_engine_replicas(cluster_gpus, node_cpus, cluster_cpus)
        replicas = self.engine_replicas if most is None else self.engine_replicas.capped(most)
        return {
            **replicas.to_serve_options(),
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": -1 if self.max_queued_requests is None else self.max_queued_requests,
            "request_router_config": self.router.to_request_router_config(),
            "health_check_timeout_s": self.engine_health_check_timeout_s,
            "ray_actor_options": {"num_cpus": self.resolved_engine_cpus(cluster_gpus, node_cpus),
                                  "num_gpus": 1 if accelerator == "gpu" else 0},
        }

    def ingress_options(self, cluster_gpus: float) -> dict[str, Any]:
        """`Deployment.options()` for the ingress (CPU only)."""
        return {**self.ingress_replicas.to_serve_options(), "max_ongoing_requests": self.ingress_max_ongoing_requests,
                "ray_actor_options": {"num_cpus": self.resolved_ingress_cpus(cluster_gpus)}}


def resolve_accelerator(accelerator: str, cluster_gpus: float) -> Literal["gpu", "cpu"]:
    """auto -> gpu when the cluster has at least one GPU now, else cpu; gpu and cpu stay as asked.

    An explicit gpu on a cluster without GPUs stays gpu: an autoscaling cluster (KubeRay) adds GPU nodes for
    replicas that ask for one, and until then the replicas wait for resources.
    """
    if accelerator == "auto":
        return "gpu" if cluster_gpus >= 1 else "cpu"
    if accelerator not in ("gpu", "cpu"):
        raise ValueError(f"accelerator must be auto, gpu or cpu, got {accelerator!r}")
    return accelerator
