"""The ragged, compact-space forward: which rows are computed, and the layer loop over them.

A `BatchPlan` fixes, for one batch and one mode, the rows that position-wise work runs on (original tokens in
`off`, compact tokens in `mlp` and `full`), how each original token maps to a row, and the attention metadata.
`run_layers` then drives the model's own modules over those rows; no tensor is ever padded to `[B, L_max]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radix_core.architectures import Architecture
from radix_core.attention import AttentionBackend, AttentionMetadata, CausalBlocks, PrefixBlocks
from radix_core.batch import PreparedBatch
from radix_core.index import sequence_positions


@dataclass
class BatchPlan:
    """One batch laid out for one mode, on the engine's device."""

    mode: str  # "off", "mlp" or "full"
    row_ids: torch.Tensor  # (R,) int64 token id of each computed row
    row_positions: torch.Tensor  # (R,) int64 position id of each computed row
    row_of_token: torch.Tensor  # (N,) int64 computed row of each original token
    cu_seqlens: np.ndarray  # (B+1,) int64 original sequence boundaries
    cu_rows: np.ndarray  # (B+1,) int64 boundaries of the rows each sequence computes first (rows are in that order)
    attention: AttentionMetadata

    @property
    def num_tokens(self) -> int:
        return int(self.row_of_token.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.row_ids.shape[0])


def plan_ragged(input_ids: np.ndarray, cu_seqlens: np.ndarray, device: torch.device) -> BatchPlan:
    """`off`: every original token is a row, attention per sequence in place."""
    return BatchPlan(
        mode="off",
        row_ids=_upload(input_ids, torch.int64, device),
        row_positions=_upload(sequence_positions(cu_seqlens), torch.int64, device),
        row_of_token=torch.arange(int(cu_seqlens[-1]), device=device),
        cu_seqlens=cu_seqlens,
        cu_rows=cu_seqlens,
        attention=AttentionMetadata(_causal_blocks(cu_seqlens, device)),
    )


def plan_compact(prepared: PreparedBatch, device: torch.device) -> BatchPlan:
    """`mlp` or `full`: compact tokens are the rows; attention as RadixMLP (`mlp`: per sequence in the original
    layout) or in compact space (`full`: causal over the trie's segments plus the shared-prefix blocks)."""
    index, mode = prepared.index, prepared.mode
    scatter = _upload(index.scatter, torch.int64, device)  # (N,)
    if mode == "mlp":
        attention = AttentionMetadata(_causal_blocks(index.cu_seqlens, device), qkv_scatter=scatter,
                                      out_gather=_upload(index.fold_gather, torch.int64, device))
    else:
        cascade = prepared.cascade
        prefix = None
        if cascade.has_prefix:
            prefix = PrefixBlocks(_upload(cascade.prefix_rows, torch.int64, device),
                                  _upload(cascade.prefix_cu, torch.int32, device),
                                  _upload(cascade.prefix_key_start, torch.int32, device),
                                  _upload(cascade.prefix_key_end, torch.int32, device),
                                  int(np.diff(cascade.prefix_cu).max()),
                                  int((cascade.prefix_key_end - cascade.prefix_key_start).max()))
        attention = AttentionMetadata(_causal_blocks(cascade.segments, device), prefix)
    return BatchPlan(
        mode=mode,
        row_ids=_upload(index.compact_input_ids, torch.int64, device),
        row_positions=_upload(index.compact_position_ids, torch.int64, device),
        row_of_token=scatter,
        cu_seqlens=index.cu_seqlens.astype(np.int64),
        cu_rows=index.cu_seqlens_q.astype(np.int64),  # the added blocks: searchsorted(fold_gather, cu_seqlens)
        attention=attention,
    )


def _causal_blocks(bounds: np.ndarray, device: torch.device) -> CausalBlocks:
    """Causal blocks over rows `bounds[j]:bounds[j+1]` (sequences, or the trie's segments)."""
    return CausalBlocks(_upload(bounds, torch.int32, device), int(np.diff(bounds).max()))


_NUMPY_DTYPES = {torch.int32: np.int32, torch.int64: np.int64}


def _upload(a: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`a` as `dtype` on `device`. To CUDA through pinned memory without blocking: a pageable copy would make the
    host wait for all the work queued before it (batch k's layers) before it can queue batch k+1. The pinned
    buffer is held by torch's host allocator until the copy is done."""
    host = torch.from_numpy(a.astype(_NUMPY_DTYPES[dtype], copy=False))
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def run_layers(arch: Architecture, plan: BatchPlan, backend: AttentionBackend) -> torch.Tensor:
    """(R, hidden) final-normed hidden states of the plan's rows."""
    h = arch.embed_tokens(plan.row_ids)  # (R, hidden)
    cos, sin = arch.rotary_emb(h, plan.row_positions.unsqueeze(0))  # (1, R, head_dim) each
    cos, sin = cos[0], sin[0]  # (R, head_dim)
    for layer in arch.layers:
        h = h + _attention_block(arch, layer, layer.input_layernorm(h), cos, sin, plan.attention, backend)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return arch.norm(h)


def _attention_block(arch, layer, x, cos, sin, meta, backend) -> torch.Tensor:
    """The decoder layer's self-attention on rows: projections, q/k-norm, rotary, backend, output projection."""
    attn = layer.self_attn
    rows = x.shape[0]
    q = attn.q_proj(x).view(rows, -1, attn.head_dim)  # (R, Hq, D)
    k = attn.k_proj(x).view(rows, -1, attn.head_dim)  # (R, Hkv, D)
    v = attn.v_proj(x).view(rows, -1, attn.head_dim)  # (R, Hkv, D)
    if hasattr(attn, "q_norm"):  # Qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = arch.apply_rotary(q, k, cos, sin, unsqueeze_dim=1)  # cos (R, 1, D) against (R, H, D)
    out = backend(q, k, v, meta, attn.scaling)  # (R, Hq, D)
    return attn.o_proj(out.reshape(rows, -1))  # (R, hidden)
