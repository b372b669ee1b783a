"""`Engine`: a transformers checkpoint run over ragged batches, with shared prefixes computed once.

    engine = Engine.from_pretrained("Qwen/Qwen3-Reranker-0.6B")
    engine.warm_up()  # on a GPU: compile every attention kernel variant now, not in the first requests
    states = engine.hidden_states([[1, 2, 3], [1, 2, 4]])  # each (L_i, hidden), final-normed
    ranked = engine.rerank("what is a radix tree", ["A trie ...", "Bread ..."]).results

The text tasks (`rerank`, `embed`, `classify`, `score`, `predict`) live in `radix_core.tasks`. Each method here
takes its task's request fields (`engine.rerank(query, documents, top_n=1)` is
`engine.answer(RerankRequest(query, documents, top_n=1))`): the fields and their defaults are the request type's.

Modes (`radix`): "off" (ragged baseline), "mlp" (RadixMLP: position-wise work on compact rows), "full"
(attention in compact space too), "auto" (per batch: the mode of least predicted time under a cost model of the
batch's work, `radix_core.mode_cost`, measured on the device by `warm_up`; "off" when the compression `N'/N` is
above `radix_threshold`; a batch without sharing runs "off" and pays only the index build).

With `batch_invariant` (`EngineConfig`), a sequence's outputs are bitwise the same whatever shares its batch, in
every mode, with or without the prefix cache: every `F.linear` (projections, MLP, heads) runs in fixed row tiles
(`radix_core.invariant_matmul`) and attention over keys split at fixed positions
(`radix_core.invariant_attention`).

Across batches, `engine.prefix_cache` (`radix_core.prefix_cache`, budget `prefix_cache_bytes`, None when 0) keeps
the K/V of prefixes seen twice; every mode reads them instead of computing those rows (`radix_core.cached_forward`).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import torch

from radix_core.architectures import Architecture, ModelLoadError, load_architecture
from radix_core.attention import fallback_backend, make_backend
from radix_core.batch import BatchLimits, PreparedBatch, prepare_batch
from radix_core.cached_forward import run_with_cache
from radix_core.cached_rows import RowShape
from radix_core.engine_config import EngineConfig
from radix_core.finish import finish_jobs, read_tokens
from radix_core.forward import BatchPlan, plan_compact, plan_ragged, run_layers, select_final_rows
from radix_core.forward_result import ForwardResult
from radix_core.invariant_attention import InvariantAttention
from radix_core.invariant_matmul import RowTiledLinear
from radix_core.mode_calibration import calibrate, static_costs
from radix_core.prefix_cache import Origins, PrefixCache, cache_budget
from radix_core.prompt_encoding import PromptTokenizer, load_prompt_tokenizer
from radix_core.tasks import (
    ClassifyRequest,
    ClassifyResult,
    EmbedRequest,
    EmbedResult,
    PredictRequest,
    PredictResult,
    RerankRequest,
    RerankResult,
    ScoreRequest,
    ScoreResult,
    TaskConfig,
    TaskContext,
    TaskJob,
    TaskRequest,
    task_for,
)
from radix_core.tasks.context import task_context
from radix_core.tokens import TokenSequences

WARM_UP_LONG = 512  # rows of warm_up's long blocks: past every flash-attn 4 query tile (at most 2 x 192 rows)
WARM_UP_MANY = 257  # blocks of warm_up's many-block batches: past flash-attn 4's BIN_BATCH_SEARCH_THRESH (256)
M = TypeVar("M", bound=Callable)


def takes(request: type[TaskRequest]) -> Callable[[M], M]:
    """Give a task method the signature of its request's fields (`help(Engine.rerank)`, `inspect.signature`): the
    method takes them as `request(*args, **kwargs)` does."""
    def with_signature(method: M) -> M:
        self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        fields = list(inspect.signature(request).parameters.values())
        method.__signature__ = inspect.Signature([self, *fields], return_annotation=method.__annotations__["return"])
        return method
    return with_signature


class Engine:
    """Loads a Qwen3 / Qwen2 / Llama / Mistral / Qwen3.5 / Qwen3-Next checkpoint and scores ragged batches of token
    ids."""

    def __init__(self, arch: Architecture, device: torch.device, dtype: torch.dtype, config: EngineConfig,
                 model: str = "", prompts: PromptTokenizer | None = None, task_config: TaskConfig | None = None):
        """`device` and `dtype` as `config` resolves them (`from_pretrained`); `config` checked when it was made."""
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.radix = config.radix
        self.radix_threshold = config.radix_threshold
        self.attention = config.attention  # as asked for; `backend` is what runs
        if config.batch_invariant and arch.hybrid:
            raise ModelLoadError(
                f"batch_invariant does not cover hybrid models ({arch.family!r}): their Gated DeltaNet recurrence "
                f"runs in chunks that start where the batch's trie branches. Turn batch_invariant off for this model")
        self.batch_invariant = config.batch_invariant
        self.backend = InvariantAttention(device) if config.batch_invariant else make_backend(config.attention, device,
                                                                                        dtype)
        self.model = model
        self.prompts = prompts  # the tokenizer, for the text tasks; None for a model without one
        self.task_config = task_config or TaskConfig()
        # how radix "auto" chooses; warm_up measures them
        self.mode_costs = static_costs(arch, device, dtype, self.backend.absorbs_short_prefixes)
        shape = RowShape.of(arch, dtype, device)
        budget = cache_budget(config.prefix_cache_bytes, shape)
        self.prefix_cache = PrefixCache(shape, budget) if budget else None  # K/V of prefixes across batches

    @classmethod
    def from_pretrained(cls, model: str, config: EngineConfig | None = None,
                        tasks: TaskConfig | Mapping | None = None, **settings: Any) -> Engine:
        """Load `model` (local directory or hub id) and its tokenizer. `config`: device, dtype, radix mode and
        attention backend (`EngineConfig`, its defaults when None), or any of its fields as keywords
        (`device="cpu"`, which replace the config's). `tasks`: limits and template overrides for the text tasks,
        a `TaskConfig` or its dict."""
        config = replace(config or EngineConfig(), **settings)
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        arch = load_architecture(model, device, dtype, packed=not config.batch_invariant, lean=True)
        task_config = TaskConfig.from_dict(tasks) if isinstance(tasks, Mapping) else tasks
        return cls(arch, device, dtype, config, model=model, prompts=load_prompt_tokenizer(model),
                   task_config=task_config)

    @property
    def info(self) -> dict:
        return {
            "model": self.model,
            "family": self.arch.family,
            "head": self.arch.head,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention": self.backend.name,
            "radix": self.radix,
            "radix_threshold": self.radix_threshold,
            "radix_costs": self.mode_costs.source,  # where auto's cost model comes from (calibrated or static)
            "max_seq_len": self.arch.max_seq_len,
            "prefix_cache_bytes": self.prefix_cache.budget_bytes if self.prefix_cache is not None else 0,
            "batch_invariant": self.batch_invariant,
        }

    @property
    def context(self) -> TaskContext:
        """What the CPU half of the text tasks reads (`Task.encode`), picklable, no weights."""
        return task_context(self.model, self.arch.config, self.prompts, self.task_config)

    @property
    def limits(self) -> BatchLimits:
        return BatchLimits(self.arch.vocab_size, self.arch.max_seq_len, self.radix_threshold, self.mode_costs)

    def check_device(self) -> None:
        """One tiny kernel and a copy back: raises when the device is unusable (a sticky CUDA error leaves every
        later batch failing while the process looks alive)."""
        if torch.ones(1, device=self.device).add_(1).item() != 2:
            raise RuntimeError(f"device {self.device} computed 1 + 1 wrong")

    def warm_up(self) -> float:
        """Run every attention kernel variant this engine's batches can select once, so that kernels compile now
        rather than in the first requests; returns the seconds it took. Call it before serving (`EngineReplica`
        does, before it reports ready).

        On a GPU each kernel compiles at its first call: flash-attn 4 per (call, dtype, tile and scheduler
        choice), in-process and holding the GIL, and Triton per call kind. The variants a batch selects depend on
        its shape, so the batches of `warm_up_batches` cover them all: the causal and the prefix call, short
        blocks and one past every query tile, few blocks and more than 256, in each mode this engine runs (`off`
        and `full` for radix "auto"; `full` too with the prefix cache, whose hits make prefix calls in every mode),
        in the engine's dtype. They run through the attention backend alone, on random q/k/v of the model's head
        shape (50 ms on a CPU with the tiny test model: nothing compiles there; Triton's interpreter, for tests
        only, takes minutes), then one small batch runs through the whole model, twice with the prefix cache (the
        second reads the first's prefix from it, and the cache is then emptied).
        When flash-attn was only preferred (`attention="auto"`) and one of its kernels fails, the engine falls
        back to the Triton kernels (`fallback_backend`, logged once) and warms those. With radix "auto" it then
        measures the cost model auto chooses by on this device (`radix_core.mode_calibration`, at most ~4 s).

        flash-attn 4 keeps its kernels in memory only, unless `FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1` (then in
        `FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`); Triton keeps them in `TRITON_CACHE_DIR` (default
        `~/.triton/cache`). With both on a persistent disk a restart loads instead of compiling (the Dockerfile
        sets them; bench/results/gpu/NOTES.md has the timings).
        """
        started = time.perf_counter()
        try:
            self._warm_attention()
        except Exception as err:  # a kernel that does not compile here: Triton, if flash-attn was only preferred
            self.backend = fallback_backend(self.attention, self.backend, self.device, err)
            self._warm_attention()
        self.forward([[1, 2, 3], [1, 2, 4]])
        if self.prefix_cache is not None:  # the same again reads [1, 2] from the cache; then the cache starts cold
            self.forward([[1, 2, 3], [1, 2, 4]])
            self.prefix_cache.clear()
        self.check_device()  # waits for the queued work
        if self.radix == "auto" and not self.batch_invariant:  # its probes time the default backends' calls
            self.mode_costs = calibrate(self.arch, self.backend, self.limits, self.device, self.dtype)
        return time.perf_counter() - started

    @torch.inference_mode()
    def _warm_attention(self) -> None:
        """Each batch of `warm_up_batches` in each mode this engine runs, through the attention backend on random
        q/k/v (seeded, the global generator left alone) of the first attention layer's head shape, in the engine's
        dtype."""
        if not self.arch.attention_layers:  # a hybrid model of Gated DeltaNet layers only
            return
        attn = self.arch.attention_layers[0]
        heads, kv_heads = self.arch.config.num_attention_heads, self.arch.config.num_key_value_heads
        generator = torch.Generator(self.device).manual_seed(0)

        def random(rows: int, num_heads: int) -> torch.Tensor:
            out = torch.randn(rows, num_heads, attn.head_dim, generator=generator, device=self.device)  # (R, H, D)
            return out.to(self.dtype)

        modes = ("off", "full") if self.radix == "auto" else (self.radix,)
        if self.prefix_cache is not None and "full" not in modes:  # cache hits make prefix calls in every mode
            modes += ("full",)
        for sequences in warm_up_batches(self.arch.max_seq_len):
            for mode in modes:
                plan = self._plan(self.prepare(sequences, mode))
                self.backend.prepare(plan)
                rows = plan.num_rows
                self.backend(random(rows, heads), random(rows, kv_heads), random(rows, kv_heads), plan.attention,
                             attn.scaling)

    def prepare(self, sequences: TokenSequences | Sequence[Sequence[int]], mode: str | None = None) -> PreparedBatch:
        """The CPU half of a forward: check, index and choose the mode (`radix_core.batch.prepare_batch`)."""
        return prepare_batch(sequences, self.radix if mode is None else mode, self.limits)

    @torch.inference_mode()
    def run(self, prepared: PreparedBatch, scopes: Sequence[Hashable] | None = None,
            origins: Origins | None = None, reads: np.ndarray | None = None) -> ForwardResult:
        """The device half: lay the prepared batch out on the device and run the layers. With the prefix cache,
        rows it holds are read instead of computed (`radix_core.cached_forward`); `scopes`: the cache tree of each
        sequence (e.g. its API key), None for one shared tree; `origins`: each sequence's request, which the cache
        admits by (`PrefixCache.lease`; None: each sequence a request of its own); `reads`: (T,) int64 the tokens
        (indices into the batch's tokens) whose final states the caller reads, None for every token's: the last
        layer's work after attention runs on their rows only (`radix_core.forward.select_final_rows`)."""
        with self.numerics():
            if self.prefix_cache is None:
                plan = self._plan(prepared)
                select_final_rows(plan, reads)
                hidden = run_layers(self.arch, plan, self.backend)
            else:
                plan, hidden = run_with_cache(self.arch, self.backend, self.prefix_cache, prepared, scopes, origins,
                                              reads)
        return ForwardResult(prepared, plan, hidden, self.arch.head_module)

    def numerics(self) -> contextlib.AbstractContextManager:
        """The context the model's matmuls run in: fixed row tiles in batch-invariant mode, else as torch runs
        them."""
        return RowTiledLinear() if self.batch_invariant else contextlib.nullcontext()

    def _plan(self, prepared: PreparedBatch) -> BatchPlan:
        """The prepared batch laid out on the device for its mode."""
        if prepared.mode == "off":
            return plan_ragged(prepared.input_ids, prepared.cu_seqlens, self.device)
        return plan_compact(prepared, self.device)

    def forward(self, sequences: Sequence[Sequence[int]], mode: str | None = None) -> ForwardResult:
        """Run a batch of token-id lists; `mode` overrides the engine's radix mode for this call."""
        return self.run(self.prepare(sequences, mode))

    def hidden_states(self, sequences, mode: str | None = None) -> list[torch.Tensor]:
        """Per sequence its final-normed hidden states `(L_i, hidden)`."""
        result = self.forward(sequences, mode)
        per_token = result.hidden.index_select(0, result.plan.row_of_token)  # (N, hidden)
        return list(per_token.split(np.diff(result.plan.cu_seqlens).tolist()))

    def last_hidden_states(self, sequences, mode: str | None = None) -> torch.Tensor:
        """(B, hidden) final-normed hidden state of each sequence's last token."""
        result = self.forward(sequences, mode)
        rows = result.rows(np.arange(len(sequences)), np.full(len(sequences), -1))  # (B,)
        return result.hidden.index_select(0, torch.from_numpy(rows).to(result.hidden.device))

    def lm_logits(self, sequences, positions: Sequence[Sequence[int]] | None = None,
                  mode: str | None = None) -> list[torch.Tensor]:
        """Per sequence `(P_i, vocab)` float32 LM logits at `positions[i]` (default: the last token), computed once
        per distinct compact row."""
        result = self.forward(sequences, mode)
        positions = positions if positions is not None else [[-1]] * len(sequences)
        return self._head_at(result, positions)

    def classification_scores(self, sequences, mode: str | None = None) -> torch.Tensor:
        """(B, num_labels) float32 sequence-classification logits at each sequence's last token."""
        result = self.forward(sequences, mode)
        return torch.cat(self._head_at(result, [[-1]] * len(sequences)))

    def run_jobs(self, jobs: Sequence[TaskJob], prepared: PreparedBatch | None = None,
                 scopes: Sequence[Hashable] | None = None) -> list[Any]:
        """Run the jobs' sequences as one batch and finish each (`Task.finish`); partial results in job order.

        `prepared`: the batch prepared elsewhere (e.g. in an index-building process) from exactly the jobs'
        concatenated sequences; checked by sequence lengths. Without it the engine prepares the batch.
        `scopes`: one per job, the prefix cache tree its sequences read and fill (None: the shared one).
        """
        sequences = TokenSequences.concat([job.sequences for job in jobs])
        if prepared is None:
            prepared = self.prepare(sequences)
        elif not np.array_equal(np.diff(prepared.cu_seqlens), sequences.lengths):
            raise ValueError(f"the prepared batch ({prepared.num_sequences} sequences, {prepared.num_tokens} "
                             f"tokens) is not these jobs' sequences ({len(sequences)}, {sequences.num_tokens} "
                             f"tokens): prepare exactly the concatenation of the jobs' sequences, in job order")
        if scopes is not None:
            scopes = [scope for job, scope in zip(jobs, scopes) for _ in range(len(job.sequences))]
        result = self.run(prepared, scopes, Origins.of(jobs), read_tokens(jobs, prepared.cu_seqlens))
        with self.numerics():
            return finish_jobs(result, jobs)

    def answer(self, request: TaskRequest) -> Any:
        """The result of one request of any task (`RerankRequest`, ...) as a batch of its own: `Task.encode`,
        `run_jobs`, `Task.merge`."""
        task = task_for(request)
        job = task.encode(self.context, request)
        return task.merge(job, self.run_jobs([job]))

    @takes(RerankRequest)
    def rerank(self, *args, **kwargs) -> RerankResult:
        """`documents` by relevance to `query`, best first (`radix_core.tasks.rerank.RerankRequest`)."""
        return self.answer(RerankRequest(*args, **kwargs))

    @takes(EmbedRequest)
    def embed(self, *args, **kwargs) -> EmbedResult:
        """(n, d) embeddings of `texts` (`radix_core.tasks.embed.EmbedRequest`)."""
        return self.answer(EmbedRequest(*args, **kwargs))

    @takes(ClassifyRequest)
    def classify(self, *args, **kwargs) -> ClassifyResult:
        """Per input a probability over `labels` after `prefix + template(input)`
        (`radix_core.tasks.scoring.ClassifyRequest`)."""
        return self.answer(ClassifyRequest(*args, **kwargs))

    @takes(ScoreRequest)
    def score(self, *args, **kwargs) -> ScoreResult:
        """Log-probabilities of each continuation after `context` (`radix_core.tasks.scoring.ScoreRequest`)."""
        return self.answer(ScoreRequest(*args, **kwargs))

    @takes(PredictRequest)
    def predict(self, *args, **kwargs) -> PredictResult:
        """Per input the sequence-classification head's labels, best first
        (`radix_core.tasks.predict.PredictRequest`)."""
        return self.answer(PredictRequest(*args, **kwargs))

    def _head_at(self, result: ForwardResult, positions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per sequence `(P_i, out)` head outputs at `positions[i]`, from one head pass over distinct rows."""
        if self.arch.head_module is None:
            raise ValueError(f"model {self.model!r} is a base model without an LM or score head")
        counts = [len(p) for p in positions]
        sequences = np.repeat(np.arange(len(positions)), counts)  # (P,)
        flat = np.array([p for ps in positions for p in ps], dtype=np.int64)  # (P,)
        with self.numerics():
            out = torch.from_numpy(result.head_outputs(result.rows(sequences, flat)))  # (P, out)
        return list(out.split(counts))


def warm_up_batches(max_seq_len: int) -> list[list[list[int]]]:
    """Token batches whose attention calls, in every mode, select each kernel variant by shape (`Engine.warm_up`).

    Blocks are short (at most 3 rows) or long (`WARM_UP_LONG` rows, at most `max_seq_len` - 2): flash-attn 4
    compiles another kernel once a block's queries times the GQA ratio pass its query tile. There are few blocks,
    or more than 256 (`many_blocks_batch`): past 256 blocks flash-attn 4's scheduler takes a batch-lookup aid,
    another kernel. Every sequence shares a prefix with another, so `full` mode makes prefix blocks of each kind
    too."""
    few_short = [[1, 2, 3], [1, 2, 4]]  # full: causal [1, 2], [3], [4]; prefix [1, 2] for 2 rows
    few_long = [[1, 2, 3], [1, 2] + [4] * min(WARM_UP_LONG, max_seq_len - 2)]  # prefix [1, 2] for 1 + long rows
    return [few_short, few_long, many_blocks_batch(), many_blocks_batch() + few_long]


def many_blocks_batch(count: int = WARM_UP_MANY) -> list[list[int]]:
    """`count` one-token prefixes, each shared by two two-token sequences: 2 x `count` blocks of 2 rows in `off`
    and `mlp`, 3 x `count` blocks of one row in `full`'s causal call (each prefix and its two tails), `count`
    blocks of 2 queries in its prefix call. Token ids below 3 + `count` (260 by default, inside every real
    vocabulary)."""
    return [[first, last] for first in range(3, 3 + count) for last in (1, 2)]


def resolve_device(device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"unknown dtype {dtype!r}: use float32, bfloat16, float16 or a torch dtype")
    return resolved
