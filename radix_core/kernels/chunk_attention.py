"""Chunk attention: batch-invariant mode's attention tiles on CUDA (`radix_core.invariant_attention`).

Each tile is `TQ` queries over one chunk of `CK` keys (a path's positions `[64c, 64c + 64)`), query `i` seeing the
chunk's first `seen[i]` keys. One program per (tile, query head) computes the whole tile in one step: the scores
`q @ k^T` (one `tl.dot` over the head dim), the masked softmax and `p @ v`, with float32 statistics and
accumulator, and stores the output and the natural-log log-sum-exp. There is no loop over keys and no split of any
reduction, every program runs the same code on tiles of one shape, and nothing a program computes for a query
depends on the other queries of its tile (each output element is its own row's dot products): a query's bits
depend only on its own row, its keys and how many it sees, not on the number of tiles or its place in one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radix_core.kernels.capability import INTERPRETED, check_qkv, check_runnable, launch_device
from radix_core.kernels.segment_attention import _LN_2, _LOG2_E, _dot


@triton.jit
def _chunk_attention_kernel(
    q_ptr, k_ptr, v_ptr, seen_ptr, out_ptr, lse_ptr, qk_scale,
    stride_qt, stride_qh, stride_qm, stride_kt, stride_kh, stride_kn, stride_vt, stride_vh, stride_vn,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    TQ: tl.constexpr, CK: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    tile = tl.program_id(0) // NUM_HEADS
    head = tl.program_id(0) % NUM_HEADS
    kv_head = head // GROUP
    offs_m = tl.arange(0, TQ)  # (TQ,)
    offs_n = tl.arange(0, CK)  # (CK,)
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    d_ok = offs_d < HEAD_DIM
    q = tl.load(q_ptr + tile.to(tl.int64) * stride_qt + head * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :], mask=d_ok[None, :], other=0.0)  # (TQ, BLOCK_D)
    k = tl.load(k_ptr + tile.to(tl.int64) * stride_kt + kv_head * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :], mask=d_ok[None, :], other=0.0)  # (CK, BLOCK_D)
    v = tl.load(v_ptr + tile.to(tl.int64) * stride_vt + kv_head * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :], mask=d_ok[None, :], other=0.0)  # (CK, BLOCK_D)
    seen = tl.load(seen_ptr + tile.to(tl.int64) * TQ + offs_m)  # (TQ,) keys each query sees
    s = _dot(q, tl.trans(k), PRECISION, WIDEN) * qk_scale  # (TQ, CK), log2 units
    s = tl.where(offs_n[None, :] < seen[:, None], s, float("-inf"))
    m = tl.max(s, 1)  # (TQ,)
    p = tl.exp2(s - m[:, None])  # (TQ, CK)
    l = tl.sum(p, 1)  # (TQ,)
    out = _dot(p.to(v.dtype), v, PRECISION, WIDEN) / l[:, None]  # (TQ, BLOCK_D)
    rows = (tile.to(tl.int64) * TQ + offs_m) * NUM_HEADS + head  # (TQ,) (query, head) rows, memory (T, TQ, Hq)
    tl.store(out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=d_ok[None, :])
    tl.store(lse_ptr + rows, (m + tl.log2(l)) * _LN_2)


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`q` (T, Hq, TQ, D) over `k`, `v` (T, Hkv, CK, D) (head dim contiguous; TQ and CK powers of two >= 16),
    query `i` of tile `t` seeing keys `0..seen[t, i] - 1` (`seen` (T, TQ) int32, each at least 1) -> (out
    (T, Hq, TQ, D) in q's dtype, lse (T, Hq, TQ) float32 natural log), both laid out query-major in memory (views of
    (T, TQ, Hq, ...), as the CPU kernel's output is), so `.transpose(1, 2)` gives the rows back to back."""
    name = "chunk_attention"
    check_qkv(name, q, k, v, 4, "(tiles, heads, rows, head_dim)")
    tiles, heads, tq, dim = q.shape
    if k.shape != v.shape or k.shape[0] != tiles or k.shape[3] != dim or heads % k.shape[1]:
        raise ValueError(f"{name}: k and v must be (T, Hkv, CK, D) with q's T and D and Hq % Hkv == 0; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if tuple(seen.shape) != (tiles, tq) or seen.dtype != torch.int32 or not seen.is_contiguous():
        raise ValueError(f"{name}: seen must be contiguous int32 (T, TQ) = {(tiles, tq)}, got {seen.dtype} "
                         f"{tuple(seen.shape)}")
    check_runnable(name, q, k, v, seen)
    out = torch.empty((tiles, tq, heads, dim), dtype=q.dtype, device=q.device).transpose(1, 2)  # (T, Hq, TQ, D)
    lse = torch.empty((tiles, tq, heads), dtype=torch.float32, device=q.device).transpose(1, 2)  # (T, Hq, TQ)
    if tiles == 0:
        return out, lse
    with launch_device(q):
        _chunk_attention_kernel[(tiles * heads,)](
            q, k, v, seen, out, lse, scale * _LOG2_E,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            NUM_HEADS=heads, GROUP=heads // k.shape[1], HEAD_DIM=dim, BLOCK_D=max(16, triton.next_power_of_2(dim)),
            TQ=tq, CK=k.shape[2], PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            WIDEN=INTERPRETED and q.dtype == torch.bfloat16,
        )
    return out, lse


def chunk_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor,
                              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_attention` in plain torch, float32: masked softmax and `logsumexp` of the scores."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))  # (T, Hq, CK, D)
    scores = q.float() @ k.transpose(-1, -2) * scale  # (T, Hq, TQ, CK)
    hidden = torch.arange(k.shape[2], device=q.device) >= seen.long()[:, None, :, None]  # (T, 1, TQ, CK)
    scores = scores.masked_fill(hidden, float("-inf"))
    lse = scores.logsumexp(-1)  # (T, Hq, TQ)
    return ((scores - lse[..., None]).exp() @ v).to(q.dtype), lse
