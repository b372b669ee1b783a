"""Which mode runs a batch fastest: a linear cost model of the work each mode does, read from the batch's index.

Before anything runs, the radix index and the cascade plan say how much work of each kind a forward does in each
mode (`ModeWork`, `mode_works`):

| work | off | mlp | full |
|---|---|---|---|
| `rows`: position-wise rows (embedding, norms, projections, MLP) | N | N' | N' |
| `pairs`: (query, key) pairs attention scores | sum of L(L+1)/2 | the same | sum of position + 1 over rows |
| `scattered`: rows q/k/v are scattered to, and the output gathered from | 0 | N + N' | 0 |
| `merged`: prefix-block query rows, gathered and merged by log-sum-exp | 0 | 0 | P (rows x ancestor segments) - A |
| `queries`: attention query rows beyond the computed rows | 0 | N - N' | 0 |

A: the rows of the short prefix blocks the torch backend absorbs into causal blocks (`ModeCosts.absorbs`).
`queries`: a row's cost (`rows`, measured on `off` forwards, where every row is a query) includes its attention's
own per-query work (reading the query, the softmax, writing the output), which `mlp` pays for every token, as
its attention runs in the tokens' layout: on a 1,000-document `tiny` rerank's batch (24,400 tokens, 13,400 compact
rows; Intel Xeon, 2 CPUs) a query cost 6.5e-7 s against 3.0e-6 for a whole row, and without it the model put `mlp`
2-5% behind `full` where it ran 7-21% behind (and 1 calibration in 6 picked it).

`mlp` and `full` compute the same rows; they differ in attention only: `mlp` pays every sequence's whole causal
attention plus the scatter and gather around it, `full` scores each compact row against its path once but merges
one prefix block per ancestor segment. So `full` wins where long prefixes are shared (the 32 x (512 + 64) batch:
4.1M of mlp's 5.3M pairs saved for 2,048 merged rows), and `mlp` can where the shared part is short next to what
follows it (MS MARCO's 50-token template and ~13-token queries: 17% of the pairs saved for 11,645 merged rows).

Predicted time = the sum over the kinds of work of their amount times their coefficient in `ModeCosts`: seconds
of the whole forward (all layers) per row, per pair, per scattered and per merged row, measured on the engine's
device at start-up (`radix_core.mode_calibration`, run by `Engine.warm_up`), or before that `flop_costs`, a
static count of FLOPs and of bytes moved. `ModeCosts.choose` picks the least predicted time, ties to the simpler
mode (off, mlp, full): a batch without sharing (N' = N) runs off, which it pays for with the index build only.
Fixed costs per attention call are left out (the torch backend's one call per bucket of block lengths on the CPU,
microseconds per kernel launch on CUDA): they are small next to a batch's rows.

Rows served from the prefix cache (issue 23) are the place the cache enters: they are compact rows whose K/V
come from the cache, not computed while their keys are still read, so `mode_works` takes their count
(`cached_rows`) off the rows of the compact modes and leaves the pairs; `off` computes every token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from radix_core.cascade import CascadePlan
from radix_core.engine_config import MODES
from radix_core.index import RadixIndex
from radix_core.padded_blocks import merged_rows

FLOPS_PER_BYTE = {"cpu": 10.0}  # matmul FLOPs a device does in the time it moves one byte; others: the next
ACCELERATOR_FLOPS_PER_BYTE = 200.0  # an H100: ~700 TFLOP/s of bf16 matmul against ~3.3 TB/s of memory
MERGE_PASSES = 8  # float32 passes over a merged row's (heads, head_dim): gather, weights, scale, add, divide


@dataclass(frozen=True, slots=True)
class ModeWork:
    """The work of one forward of a batch in one mode (module docstring's table)."""

    rows: int
    pairs: int
    scattered: int = 0
    merged: int = 0
    queries: int = 0


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder that the cost of a forward follows."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    @classmethod
    def of(cls, config) -> ModelShape:
        """From a transformers config (Qwen3, Qwen2, Llama, Mistral; `head_dim` defaults to hidden / heads)."""
        heads = config.num_attention_heads
        return cls(config.hidden_size, config.num_hidden_layers, heads,
                   getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, config.intermediate_size)

    def row_flops(self) -> float:
        """Matmul FLOPs per computed row, all layers: q/k/v/o projections and the gated MLP."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        out = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return 2.0 * (qkv + out + mlp) * self.layers

    def pair_flops(self) -> float:
        """FLOPs per (query, key) pair, all layers: QK^T and PV in every head."""
        return 4.0 * self.heads * self.head_dim * self.layers

    def flops(self, work: ModeWork) -> float:
        return self.row_flops() * work.rows + self.pair_flops() * work.pairs


WORK = tuple(f.name for f in fields(ModeWork))  # the kinds of work, each with its coefficient in ModeCosts


@dataclass(frozen=True)
class ModeCosts:
    """Seconds of a whole forward per unit of each kind of work, named as `ModeWork`'s fields (`flop_costs`:
    FLOPs instead; only their ratios choose). `source` says where the numbers come from, for logs and tables."""

    rows: float
    pairs: float
    scattered: float
    merged: float
    source: str
    absorbs: bool = False  # the backend absorbs short prefix blocks into causal ones (torch): they merge nothing
    queries: float = 0.0  # per attention query past mlp's rows (`ModeWork.queries`); 0: a model without the term

    def predict(self, work: ModeWork) -> float:
        return sum(getattr(self, name) * getattr(work, name) for name in WORK)

    def choose(self, works: Mapping[str, ModeWork]) -> str:
        """The mode of least predicted time among `works`; ties go to the earlier of `MODES`."""
        return min(works, key=lambda mode: (self.predict(works[mode]), MODES.index(mode)))


def flop_costs(shape: ModelShape, device_type: str, element_bytes: int, absorbs: bool = False) -> ModeCosts:
    """The static model of an engine that has not measured its device: matmul and attention FLOPs, and the bytes
    the scatter, the merge and `mlp`'s queries past its rows move, counted as the FLOPs the device does in the same
    time (`FLOPS_PER_BYTE`)."""
    balance = FLOPS_PER_BYTE.get(device_type, ACCELERATOR_FLOPS_PER_BYTE)
    qkv_and_out = (shape.heads + shape.kv_heads) * shape.head_dim * element_bytes * 2  # mean row, read + write
    merge = MERGE_PASSES * shape.heads * shape.head_dim * 4  # float32
    moved = balance * qkv_and_out * shape.layers  # a scattered row's, and a query's past mlp's rows
    return ModeCosts(rows=shape.row_flops(), pairs=shape.pair_flops(), scattered=moved,
                     merged=balance * merge * shape.layers,
                     source=f"static FLOP count ({device_type}, {balance:g} FLOP per byte moved)", absorbs=absorbs,
                     queries=moved)


DEFAULT_COSTS = flop_costs(ModelShape(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
                           "cpu", 4)  # Qwen3-0.6B in float32 on a CPU, for limits made without an engine


def causal_pairs(cu_seqlens: np.ndarray) -> int:
    """(query, key) pairs of causal blocks with boundaries `cu_seqlens` (B+1,): sum of L(L+1)/2."""
    lengths = np.diff(cu_seqlens.astype(np.int64))  # (B,)
    return int((lengths * (lengths + 1) // 2).sum())


def mode_works(index: RadixIndex, cascade: CascadePlan, cached_rows: int = 0,
               absorbs: bool = False) -> dict[str, ModeWork]:
    """The work of each mode (module docstring's table) for the batch `index` holds, `cascade` its `full` plan;
    `cached_rows` of its compact rows served from the prefix cache (not computed by mlp or full, their keys
    still read); `absorbs`: the backend merges only the prefix blocks it does not absorb (`ModeCosts.absorbs`)."""
    merged = int(cascade.prefix_rows.shape[0])
    if absorbs and merged:
        merged = merged_rows(cascade.segments, cascade.prefix_rows, cascade.prefix_cu, cascade.prefix_key_start,
                             cascade.prefix_key_end)
    sequence_pairs = causal_pairs(index.cu_seqlens)
    path_pairs = int(index.compact_position_ids.sum(dtype=np.int64)) + index.num_compact  # row at p sees p + 1
    return {
        "off": ModeWork(index.num_tokens, sequence_pairs),
        "mlp": ModeWork(index.num_compact - cached_rows, sequence_pairs,
                        scattered=index.num_tokens + index.num_compact, queries=index.num_tokens - index.num_compact),
        "full": ModeWork(index.num_compact - cached_rows, path_pairs, merged=merged),
    }
