"""The ragged, compact-space forward: which rows are computed, and the layer loop over them.

A `BatchPlan` fixes, for one batch and one mode, the rows that position-wise work runs on (original tokens in
`off`, compact tokens in `mlp` and `full`), how each original token maps to a row, and the attention metadata.
`run_layers` then drives the model's own modules over those rows; no tensor is ever padded to `[B, L_max]`.
With the prefix cache (`radix_core.cached_forward`) a plan also reads cached rows (`past`: their K/V in every
layer, their final states after the computed rows') and hands the K/V of admitted rows to the cache (`kept`).

A scoring batch reads few final states: a rerank or a last-token embedding one row per sequence, a continuation
score its continuations' rows. Every row's keys and values feed the last layer's attention, but only the rows read
need what comes after it, the output projection and the MLP: `final_rows` names them (`Engine.run`'s `reads`, and
the rows the cache admits), and the last layer runs its position-wise work after attention on those alone: on the
`bench` preset's 8 layers reranks and embeddings run 1.09-1.10x as fast (`bench/final_rows.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radix_core.architectures import Architecture
from radix_core.attention import AttentionBackend, AttentionMetadata, CausalBlocks, PrefixBlocks
from radix_core.batch import PreparedBatch
from radix_core.cached_rows import CachedPrefix, KeptRows
from radix_core.cascade import CascadePlan
from radix_core.hybrid_layers import run_hybrid_layers
from radix_core.index import sequence_positions
from radix_core.invariant_matmul import row_tile


@dataclass
class BatchPlan:
    """One batch laid out for one mode, on the engine's device. Rows `0..R` are computed; with cache hits the
    cached rows `R..R+C` follow them: the forward's hidden states are the final rows' (every computed row's unless
    `final_rows` names some) then the cached rows' (`state_index`)."""

    mode: str  # "off", "mlp" or "full"
    row_ids: torch.Tensor  # (R,) int64 token id of each computed row
    row_positions: torch.Tensor  # (R,) int64 position id of each computed row
    row_of_token: torch.Tensor  # (N,) int64 row of each original token
    token_rows: np.ndarray  # (N,) int64 the same, on the host
    cu_seqlens: np.ndarray  # (B+1,) int64 original sequence boundaries
    cu_rows: np.ndarray  # (B+1,) int64 boundaries of the rows each sequence computes first (rows are in that order)
    attention: AttentionMetadata
    cached_lengths: np.ndarray | None = None  # (B,) int64 leading tokens of each sequence read from the cache
    past: CachedPrefix | None = None  # the cached rows the batch reads
    kept: KeptRows | None = None  # the computed rows whose K/V and states enter the cache
    final_rows: np.ndarray | None = None  # (F,) int64 sorted computed rows whose final states the forward computes
    # (`select_final_rows`); None: every row's
    final_on_device: torch.Tensor | None = None  # (F,) int64 the same, on the device

    @property
    def num_tokens(self) -> int:
        return int(self.row_of_token.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.row_ids.shape[0])

    def state_index(self, rows: np.ndarray) -> np.ndarray:
        """(P,) int64 where the final states of computed or cached `rows` are in the forward's hidden states (the
        final rows', then the cached rows'); a ValueError for a computed row not among `final_rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.final_rows is None:
            return rows
        computed, finished = rows < self.num_rows, self.final_rows.shape[0]
        index = np.where(computed, np.searchsorted(self.final_rows, rows), rows - self.num_rows + finished)
        found = self.final_rows[np.minimum(index, finished - 1)] == rows if finished else np.zeros_like(computed)
        if (computed & ~found).any():
            raise ValueError(f"the final state of row {int(rows[computed & ~found][0])} was not computed: the batch "
                             f"ran its last layer on the rows its reads named only ({finished} of {self.num_rows})")
        return index

    def final_part(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (R, ...) at the final rows only (F, ...): the last layer's input to its work after the token mixer."""
        return t.index_select(0, self.final_on_device)

    def with_cached(self, states: torch.Tensor) -> torch.Tensor:
        """(F + C, hidden): the final-normed `states` of the computed rows the forward finished, handed to the cache
        where it keeps them, then the cached rows' states."""
        if self.kept is not None:
            self.kept.keep_states(states)
        return states if self.past is None else torch.cat([states, self.past.states()])


def plan_ragged(input_ids: np.ndarray, cu_seqlens: np.ndarray, device: torch.device) -> BatchPlan:
    """`off`: every original token is a row, attention per sequence in place."""
    return BatchPlan(
        mode="off",
        row_ids=upload(input_ids, torch.int64, device),
        row_positions=upload(sequence_positions(cu_seqlens), torch.int64, device),
        row_of_token=torch.arange(int(cu_seqlens[-1]), device=device),
        token_rows=np.arange(int(cu_seqlens[-1])),
        cu_seqlens=cu_seqlens,
        cu_rows=cu_seqlens,
        attention=AttentionMetadata(causal_blocks(cu_seqlens, device)),
    )


def plan_compact(prepared: PreparedBatch, device: torch.device) -> BatchPlan:
    """`mlp` or `full`: compact tokens are the rows; attention as RadixMLP (`mlp`: per sequence in the original
    layout) or in compact space (`full`: causal over the trie's segments plus the shared-prefix blocks)."""
    index, mode = prepared.index, prepared.mode
    scatter = upload(index.scatter, torch.int64, device)  # (N,)
    if mode == "mlp":
        attention = AttentionMetadata(causal_blocks(index.cu_seqlens, device), qkv_scatter=scatter,
                                      out_gather=upload(index.fold_gather, torch.int64, device))
    else:
        attention = cascade_attention(prepared.cascade, device)
    return BatchPlan(
        mode=mode,
        row_ids=upload(index.compact_input_ids, torch.int64, device),
        row_positions=upload(index.compact_position_ids, torch.int64, device),
        row_of_token=scatter,
        token_rows=index.scatter.astype(np.int64),
        cu_seqlens=index.cu_seqlens.astype(np.int64),
        cu_rows=index.cu_seqlens_q.astype(np.int64),  # the added blocks: searchsorted(fold_gather, cu_seqlens)
        attention=attention,
    )


def cascade_attention(cascade: CascadePlan, device: torch.device) -> AttentionMetadata:
    """`full` mode's attention: causal blocks over the segments, and the prefix blocks when there are any."""
    prefix = None
    if cascade.has_prefix:
        prefix = prefix_blocks(cascade.prefix_rows, cascade.prefix_cu, cascade.prefix_key_start,
                               cascade.prefix_key_end, device)
    return AttentionMetadata(causal_blocks(cascade.segments, device), prefix)


def prefix_blocks(q_rows: np.ndarray, cu: np.ndarray, key_start: np.ndarray, key_end: np.ndarray,
                  device: torch.device) -> PrefixBlocks:
    """Prefix blocks from their host arrays: query rows (P,), block boundaries (J+1,), key ranges (J,) each."""
    return PrefixBlocks(upload(q_rows, torch.int64, device), upload(cu, torch.int32, device),
                        upload(key_start, torch.int32, device), upload(key_end, torch.int32, device),
                        int(np.diff(cu).max()), int((key_end - key_start).max()))


def causal_blocks(bounds: np.ndarray, device: torch.device) -> CausalBlocks:
    """Causal blocks over rows `bounds[j]:bounds[j+1]` (sequences, or the trie's segments); none for `[0]`."""
    return CausalBlocks(upload(bounds, torch.int32, device), int(np.diff(bounds).max(initial=0)))


_NUMPY_DTYPES = {torch.int32: np.int32, torch.int64: np.int64}


def select_final_rows(plan: BatchPlan, reads: np.ndarray | None, kept: np.ndarray | None = None) -> None:
    """Set the plan's final rows: the computed rows of the tokens `reads` (indices into the batch's tokens; None:
    every token) and the computed rows `kept` the cache admits (it stores their final states); none where that
    is every row."""
    if reads is None:
        return
    rows = plan.token_rows[reads]
    rows = np.unique(np.concatenate([rows[rows < plan.num_rows], [] if kept is None else kept]).astype(np.int64))
    if rows.shape[0] == plan.num_rows:
        return
    device = plan.row_ids.device
    plan.final_rows, plan.final_on_device = rows, upload(rows, torch.int64, device)
    if plan.kept is not None:
        plan.kept.state_rows = upload(np.searchsorted(rows, kept), torch.int64, device)


def upload(a: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`a` as `dtype` on `device`. To CUDA through pinned memory without blocking: a pageable copy would make the
    host wait for all the work queued before it (batch k's layers) before it can queue batch k+1. The pinned
    buffer is held by torch's host allocator until the copy is done."""
    host = torch.from_numpy(a.astype(_NUMPY_DTYPES[dtype], copy=False))
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def run_layers(arch: Architecture, plan: BatchPlan, backend: AttentionBackend) -> torch.Tensor:
    """(F + C, hidden) final-normed hidden states of the plan's final rows (all R computed rows when it names
    none), then of its cached rows (`BatchPlan.state_index` finds a row's)."""
    if plan.num_rows == 0:  # every token's row is cached
        return plan.past.states()
    if arch.hybrid:  # Gated DeltaNet layers along the trie
        return run_hybrid_layers(arch, plan, backend)
    backend.prepare(plan)
    h = arch.embed_tokens(plan.row_ids)  # (R, hidden)
    cos, sin = arch.rotary_emb(h, plan.row_positions.unsqueeze(0))  # (1, R, head_dim) each
    cos, sin = cos[0], sin[0]  # (R, head_dim)
    chunks = row_chunks(plan.num_rows, chunk_rows(arch, h))
    last = len(arch.layers) - 1
    for i, layer in enumerate(arch.layers):
        out = _attention(arch, i, layer, h, cos, sin, plan, backend, chunks)  # (R, Hq, D)
        if i == last and plan.final_rows is not None:  # after attention, only the rows read
            h, out = plan.final_part(h), plan.final_part(out)  # (F, hidden), (F, Hq, D)
            chunks = row_chunks(h.shape[0], chunk_rows(arch, h))
        for rows in chunks:  # h is this function's own tensor: the residual adds go in place
            part = h[rows]  # (r, hidden) a view
            part += layer.self_attn.o_proj(out[rows].flatten(1))
            part += layer.mlp(layer.post_attention_layernorm(part))
    return plan.with_cached(arch.norm(h))


def _attention(arch, i, layer, h, cos, sin, plan, backend, chunks: list[slice]) -> torch.Tensor:
    """(R, Hq, D) layer `i`'s attention output before its output projection: norm, projections, q/k-norm and
    rotary chunk by chunk of rows, then the backend over all rows (with the cached rows' K/V when the plan reads
    them)."""
    attn = layer.self_attn
    rows, d = h.shape[0], attn.head_dim
    q = h.new_empty(rows, attn.q_proj.out_features // d, d)  # (R, Hq, D)
    k = h.new_empty(rows, attn.k_proj.out_features // d, d)  # (R, Hkv, D)
    v = h.new_empty(rows, attn.v_proj.out_features // d, d)  # (R, Hkv, D)
    for part in chunks:
        x = layer.input_layernorm(h[part])  # (r, hidden)
        qs, ks = attn.q_proj(x).unflatten(1, (-1, d)), attn.k_proj(x).unflatten(1, (-1, d))  # (r, H, D)
        if hasattr(attn, "q_norm"):  # Qwen3
            qs, ks = attn.q_norm(qs), attn.k_norm(ks)
        q[part], k[part] = arch.apply_rotary(qs, ks, cos[part], sin[part], unsqueeze_dim=1)  # cos (r, 1, D)
        v[part] = attn.v_proj(x).unflatten(1, (-1, d))
    if plan.kept is not None:
        plan.kept.keep_layer(i, k, v)
    past = plan.past.kv(i) if plan.attention.past is not None else None  # (C, Hkv, D) each
    return backend(q, k, v, plan.attention, attn.scaling, past)  # (R, Hq, D)


CHUNK_BYTES = 2 << 20  # the widest activation of a chunk of rows (the MLP's intermediate), on the CPU


def chunk_rows(arch: Architecture, h: torch.Tensor) -> int | None:
    """Rows per chunk of position-wise work: on the CPU, as many as keep the MLP's widest activation within
    CHUNK_BYTES, so a chunk's activations stay in the cores' caches between the ops that read them; on an
    accelerator, all rows at once (None). Measured on 2 CPUs (an Intel Xeon), torch 2.13, wall time of a forward,
    prefix cache off: against all rows at once, a 1,000-document rerank of the `tiny` preset (55,000 rows, whose
    elementwise ops ran 2-2.5x slower on all rows than on 125-document batches) 1.34 -> 0.97 s on one thread; the
    `bench` preset's `no sharing` batch in `off` 2.07 -> 1.97 s and MS MARCO rerank in `full` 1.43 -> 1.44 s on two.
    2 MiB against 1 MiB: `bench` 1.97 vs 2.19 s and 1.44 vs 1.59 s on two threads, 3.82 vs 3.88 s and 2.70 vs
    2.78 s on one; `tiny` (7 batches of a 1,000-document rerank) 0.62 s both; 4 MiB within 2% of 2 MiB on `bench`,
    4% slower on `tiny`. Rounded up to a multiple of the batch-invariant mode's gemm tile
    (`invariant_matmul.row_tile`), so that mode pads no chunk but the last."""
    if h.device.type != "cpu":
        return None
    width = max(arch.config.intermediate_size, arch.hidden_size)
    rows, tile = CHUNK_BYTES // (width * h.element_size()), row_tile(h.dtype)
    return max(1, -(-rows // tile)) * tile


def row_chunks(rows: int, chunk: int | None) -> list[slice]:
    """Slices of `chunk` rows covering `0..rows` (one for all rows when `chunk` is None)."""
    if chunk is None or rows <= chunk:
        return [slice(0, rows)]
    return [slice(start, min(start + chunk, rows)) for start in range(0, rows, chunk)]
