"""The cost model's coefficients measured on the engine's device at start-up (`calibrate`, run by `Engine.warm_up`).

Each coefficient of `radix_core.mode_cost.ModeCosts` is a slope: the time two runs differ by, over the one kind
of work they differ in (other differences taken off with the coefficients known by then):

* `rows`: whole `off` forwards of R and 2R rows as sequences of `SEQUENCE` tokens; they differ in R rows (and in
  those rows' pairs, 1% of the time, counted at the static FLOP ratio).
* `pairs`: one layer's attention, `off`, over R rows as sequences of `SEQUENCE` and of 4 x `SEQUENCE` tokens: the
  same rows, 1.5 x R x `SEQUENCE` more pairs.
* `scattered`: one layer's attention over a batch without sharing, in `off` and in `mlp`: the same rows and pairs,
  2N rows scattered and gathered.
* `merged`: one layer's attention over k sequences behind one `PREFIX`-token prefix, in `full`, and in `off` over
  the same segments as sequences of their own: the k x `SUFFIX` prefix-block rows merged (and the prefix block's
  pairs, taken off).
* `queries`: one layer's attention, `off`, over R and 2R rows as sequences of `SEQUENCE` tokens: R more queries
  (and their pairs, taken off).

Attention runs through the engine's backend on random q/k/v of the model's head shape and dtype, as in the
warm-up, and one layer's time counts once per layer. A slope needs runs well above the timer and the fixed costs
of a call, so each probe doubles its size from small until its larger run takes `TARGET_S`, up to `MAX_ROWS` rows;
then each time is the least over rounds of the two runs alternating (the run other load disturbed least): at
least `REPEATS` rounds, more while a round still lowers one (a busy machine), at most `MAX_REPEATS`.

All of it stays within a budget of seconds (`BUDGET_S`, and at most one run past it; 2.6-3.1 s on 2 CPU cores
with the bench preset, 1.0-1.3 s with the tiny one: bench/results/engine_bench.md). A
coefficient not measured by then, or measured at zero or below (noise larger than the difference), takes its
static FLOP-count ratio to `rows` (`mode_cost.flop_costs`); without `rows` the static model stands. `source` says
which.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np
import torch

from radix_core.architectures import Architecture
from radix_core.attention import AttentionBackend
from radix_core.batch import BatchLimits, prepare_batch
from radix_core.cascade import cascade_plan
from radix_core.forward import BatchPlan, plan_compact, plan_ragged, run_layers
from radix_core.mode_cost import WORK, ModeCosts, ModelShape, ModeWork, causal_pairs, flop_costs, mode_works

log = logging.getLogger(__name__)

BUDGET_S = 4.0  # the whole calibration; the row probe, first, takes most of it on a CPU
TARGET_S = 0.03  # the larger run of a probe at its measured size
MAX_ROWS = 16384  # the largest probe (the serving default `max_batch_tokens`)
REPEATS, MAX_REPEATS = 3, 15  # timed rounds of a probe's two runs: at least, and at most while still lowering
SETTLED = 0.98  # a round that lowers a least time by less than 2% leaves it settled
# tokens: probe sequences, the merge probe's shared prefix (longer than the torch backend absorbs) and its suffixes
SEQUENCE, PREFIX, SUFFIX = 64, 32, 16

Run = tuple[Callable[[], object], ModeWork]  # a timed call and the work it does
Probe = Callable[[int], tuple[Run, Run]]  # size -> (baseline run, run with more of the probed work)


class OutOfTime(Exception):
    """The calibration's budget ran out before a probe finished."""


@dataclass
class Calibration:
    """The probes (module docstring), over the engine's parts, on seeded random tokens and q/k/v."""

    arch: Architecture
    backend: AttentionBackend
    limits: BatchLimits
    device: torch.device
    dtype: torch.dtype
    deadline: float

    def __post_init__(self):
        self.generator = torch.Generator(self.device).manual_seed(0)
        self.ids = np.random.default_rng(0)

    def slope(self, probe: Probe, start: int, unit: str, known: Mapping[str, float] = MappingProxyType({}),
              tied: Mapping[str, float] = MappingProxyType({})) -> float:
        """Seconds per unit of `unit` between the probe's two runs, at the first size (doubling from `start`) whose
        larger run takes `TARGET_S`: other work taken off at its `known` rate, work `tied` to `unit` (a rate as a
        multiple of its) counted with it."""
        size = start
        base, more = probe(size)
        while self.seconds(more[0]) < TARGET_S and 2 * size <= MAX_ROWS:
            size *= 2
            base, more = probe(size)
        low_base, low_more = self.least_seconds(base[0], more[0])
        grew = {name: getattr(more[1], name) - getattr(base[1], name) for name in WORK}  # the work `more` adds
        extra = low_more - low_base - sum(rate * grew[name] for name, rate in known.items())
        return extra / (grew[unit] + sum(ratio * grew[name] for name, ratio in tied.items()))

    def least_seconds(self, base: Callable[[], object], more: Callable[[], object]) -> tuple[float, float]:
        """The least time of each of two runs, alternating after an untimed call of `base` (its first allocates):
        at least `REPEATS` rounds, then until a round lowers neither least time by `SETTLED` (other load spared
        both), at most `MAX_REPEATS`; when the budget runs out after a round, what the rounds so far found."""
        self.seconds(base)
        lows = [float("inf"), float("inf")]
        for round_ in range(MAX_REPEATS):
            try:
                times = [self.seconds(base), self.seconds(more)]
            except OutOfTime:
                if round_ == 0:
                    raise
                break
            lowered = any(t < SETTLED * low for t, low in zip(times, lows))
            lows = [min(t, low) for t, low in zip(times, lows)]
            if round_ + 1 >= REPEATS and not lowered:
                break
        return lows[0], lows[1]

    def seconds(self, run: Callable[[], object]) -> float:
        if time.perf_counter() > self.deadline:
            raise OutOfTime
        self.sync()
        started = time.perf_counter()
        run()
        self.sync()
        return time.perf_counter() - started

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def row_probe(self, size: int) -> tuple[Run, Run]:
        """Whole `off` forwards of `size` and 2 x `size` rows, as sequences of `SEQUENCE` tokens."""
        def run(rows: int) -> Run:
            plan = self.ragged(self.sequences(rows // SEQUENCE, SEQUENCE))
            return (lambda: run_layers(self.arch, plan, self.backend)), ModeWork(rows, causal_pairs(plan.cu_seqlens))
        return run(size), run(2 * size)

    def pair_probe(self, size: int) -> tuple[Run, Run]:
        """Attention over `size` rows as sequences of `SEQUENCE` and of 4 x `SEQUENCE` tokens (at most the model's
        longest)."""
        def run(length: int) -> Run:
            plan = self.ragged(self.sequences(size // length, length))
            return self.attention(plan), ModeWork(plan.num_rows, causal_pairs(plan.cu_seqlens))
        return run(SEQUENCE), run(min(4 * SEQUENCE, self.limits.max_seq_len))

    def scatter_probe(self, size: int) -> tuple[Run, Run]:
        """Attention over a batch without sharing, `size` rows, in `off` and in `mlp` (N' = N)."""
        sequences = self.sequences(size // SUFFIX, SUFFIX)
        mlp = prepare_batch(sequences, "mlp", self.limits)
        works = mode_works(mlp.index, cascade_plan(mlp.index), absorbs=self.backend.absorbs_short_prefixes)
        return ((self.attention(self.ragged(sequences)), works["off"]),
                (self.attention(plan_compact(mlp, self.device)), works["mlp"]))

    def query_probe(self, size: int) -> tuple[Run, Run]:
        """Attention over `size` and 2 x `size` rows as sequences of `SEQUENCE` tokens."""
        def run(rows: int) -> Run:
            plan = self.ragged(self.sequences(rows // SEQUENCE, SEQUENCE))
            return self.attention(plan), ModeWork(0, causal_pairs(plan.cu_seqlens), queries=plan.num_rows)
        return run(size), run(2 * size)

    def merge_probe(self, size: int) -> tuple[Run, Run]:
        """Attention over `size` // `SUFFIX` sequences behind one `PREFIX`-token prefix in `full`, and in `off`
        over the same segments as sequences of their own."""
        prefix = self.ids.integers(0, self.limits.vocab_size, PREFIX).tolist()
        full = prepare_batch(self.sequences(size // SUFFIX, SUFFIX, prefix), "full", self.limits)
        segments = full.cascade.segments.astype(np.int64)  # (S+1,)
        alone = plan_ragged(full.index.compact_input_ids.astype(np.int64), segments, self.device)
        work = mode_works(full.index, full.cascade, absorbs=self.backend.absorbs_short_prefixes)["full"]
        return ((self.attention(alone), ModeWork(work.rows, causal_pairs(segments))),
                (self.attention(plan_compact(full, self.device)), work))

    def sequences(self, count: int, length: int, prefix: Sequence[int] = ()) -> list[list[int]]:
        """`count` sequences of `length` random tokens after `prefix`, each its own from its first token on
        (while `count` is at most the vocabulary)."""
        vocab = self.limits.vocab_size
        firsts = self.ids.permutation(max(count, vocab))[:count] % vocab  # (count,)
        rest = self.ids.integers(0, vocab, (count, length - 1))  # (count, length - 1)
        return [[*prefix, int(first), *tail.tolist()] for first, tail in zip(firsts, rest)]

    def ragged(self, sequences: list[list[int]]) -> BatchPlan:
        prepared = prepare_batch(sequences, "off", self.limits)
        return plan_ragged(prepared.input_ids, prepared.cu_seqlens, self.device)

    def attention(self, plan: BatchPlan) -> Callable[[], object]:
        """One layer's attention over `plan`, on random q/k/v of the first layer's head shape and the dtype."""
        attn = self.arch.attention_layers[0]
        heads, kv_heads = self.arch.config.num_attention_heads, self.arch.config.num_key_value_heads

        def random(num_heads: int) -> torch.Tensor:
            out = torch.randn(plan.num_rows, num_heads, attn.head_dim, generator=self.generator, device=self.device)
            return out.to(self.dtype)  # (R, H, D)

        q, k, v = random(heads), random(kv_heads), random(kv_heads)
        return lambda: self.backend(q, k, v, plan.attention, attn.scaling)


def static_costs(arch: Architecture, device: torch.device, dtype: torch.dtype, absorbs: bool = False) -> ModeCosts:
    """The model's static FLOP-count costs (`mode_cost.flop_costs`): an engine's until it calibrates; `absorbs` as
    its attention backend does."""
    return flop_costs(ModelShape.of(arch.config), device.type, torch.finfo(dtype).bits // 8, absorbs)


@torch.inference_mode()
def calibrate(arch: Architecture, backend: AttentionBackend, limits: BatchLimits, device: torch.device,
              dtype: torch.dtype, budget_s: float = BUDGET_S) -> ModeCosts:
    """`ModeCosts` measured on `device` through `backend` (module docstring), within `budget_s` seconds (and at
    most one run past them)."""
    started = time.perf_counter()
    static = static_costs(arch, device, dtype, backend.absorbs_short_prefixes)
    probes = Calibration(arch, backend, limits, device, dtype, started + budget_s)
    layers = len(arch.attention_layers)  # a hybrid model's attention layers only; none: no attention probe
    measured: dict[str, float] = {}
    try:
        measured["rows"] = probes.slope(probes.row_probe, SEQUENCE, "rows",
                                        tied={"pairs": static.pairs / static.rows})
        if layers:
            measured["pairs"] = layers * probes.slope(probes.pair_probe, 4 * SEQUENCE, "pairs")
            measured["scattered"] = layers * probes.slope(probes.scatter_probe, 4 * SEQUENCE, "scattered")
            pairs = measured["pairs"] if measured["pairs"] > 0 else static.pairs * measured["rows"] / static.rows
            measured["merged"] = layers * probes.slope(probes.merge_probe, 4 * SEQUENCE, "merged",
                                                       known={"pairs": pairs / layers})
            measured["queries"] = layers * probes.slope(probes.query_probe, 4 * SEQUENCE, "queries",
                                                        known={"pairs": pairs / layers})
    except OutOfTime:
        pass
    costs = combined(measured, static, device, time.perf_counter() - started)
    log.info("radix auto cost model: %s", costs)
    return costs


def combined(measured: Mapping[str, float], static: ModeCosts, device: torch.device, seconds: float) -> ModeCosts:
    """The measured coefficients, the others at their static ratio to `rows`; the static model without `rows`."""
    if measured.get("rows", 0.0) <= 0:
        return replace(static, source=f"{static.source}; calibration on {device.type} measured no row cost in "
                                      f"{seconds:.2f} s")
    scale = measured["rows"] / static.rows
    derived = [name for name in WORK if measured.get(name, 0.0) <= 0]
    values = {name: getattr(static, name) * scale if name in derived else measured[name] for name in WORK}
    note = f"; {', '.join(derived)} at the static ratio to rows" if derived else ""
    return ModeCosts(**values, source=f"calibrated on {device.type} in {seconds:.2f} s{note}", absorbs=static.absorbs)
