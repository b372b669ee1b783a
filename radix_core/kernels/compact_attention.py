"""Compact attention: causal attention in compact space, keys and values read through the radix index.

Compact tokens are numbered in first-appearance order, so the tokens sequence `s` adds to the trie are one
contiguous block of compact rows, `cu_seqlens_q[s]:cu_seqlens_q[s+1]`, and a suffix of its path. Its keys and
values are its whole path, compact rows `scatter[cu_seqlens_k[s]:cu_seqlens_k[s+1]]`. The kernel loads the
path's compact row numbers tile by tile and reads K/V rows through them, so no gathered copy of K/V is made;
the causal mask is aligned bottom-right (query `j` of a block of `Lq` sees path positions `0..Lk-Lq+j`), as
flash-attn varlen does when `seqlen_q < seqlen_k`. A sequence that adds nothing (an exact duplicate) has
`Lq = 0` and its programs exit at once.

Flash-attention 2 structure (Dao, arXiv 2307.08691; Triton's fused-attention tutorial): one program per
(sequence x query head, query tile), online softmax in base 2 with float32 statistics and accumulator, and
two key stages: the tiles wholly visible to every query of the tile without masks, then the diagonal tiles
with the causal mask. Grouped-query heads read kv head `h // (Hq / Hkv)`, as transformers' `repeat_kv` does.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radix_core.kernels.capability import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    INTERPRETED,
    check_dtype,
    check_ndim,
    check_runnable,
    launch_device,
)

_MAX_HEAD_DIM = 256
_LOG2_E = 1.4426950408889634


@dataclass(frozen=True, slots=True)
class AttentionTiles:
    """Tile sizes and launch shape of the compact attention kernel (powers of two, at least 16)."""

    block_m: int  # queries per program
    block_n: int  # path positions per inner step
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            size = getattr(self, name)
            if size < 16 or size & (size - 1):
                raise ValueError(f"AttentionTiles.{name} must be a power of two >= 16 (tl.dot's minimum), got {size}")


def default_tiles(head_dim: int) -> AttentionTiles:
    """Tiles for this process: 16 x 16 under the interpreter (small tiles make test-sized sequences span
    several tiles), and on the GPU untuned starting points in the range of Triton's fused-attention tutorial;
    `bench/gpu_check.py` times them against alternatives."""
    if INTERPRETED:
        return AttentionTiles(block_m=16, block_n=16)
    if head_dim <= 64:
        return AttentionTiles(block_m=64, block_n=64, num_warps=4, num_stages=3)
    if head_dim <= 128:
        return AttentionTiles(block_m=128, block_n=64, num_warps=8, num_stages=3)
    return AttentionTiles(block_m=64, block_n=32, num_warps=4, num_stages=2)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """`a @ b` accumulated in float32. `WIDEN` multiplies float32 copies instead: Triton's interpreter
    multiplies bfloat16 bit patterns as integers in `tl.dot` (triton-lang/triton#11584, unsupported there);
    widening is exact, as a product of two 16-bit floats fits in float32."""
    if WIDEN:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _attend_tiles(
    acc, m_i, l_i, q, k_base, v_base, path_ptr, path_len, q_pos, offs_d, d_ok, lo, hi,
    stride_kn, stride_vn, qk_scale,
    CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    """Fold path positions `[lo, hi)` into the running softmax (`m_i`, `l_i`) and output (`acc`) of `q`."""
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) path positions
        n_ok = offs_n < path_len
        rows = tl.load(path_ptr + offs_n, mask=n_ok, other=0).to(tl.int64)  # (BLOCK_N,) compact K/V rows
        kv_mask = n_ok[:, None] & d_ok[None, :]  # (BLOCK_N, BLOCK_D)
        k = tl.load(k_base + rows[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), PRECISION, WIDEN) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        if CAUSAL:
            visible = (q_pos[:, None] >= offs_n[None, :]) & n_ok[None, :]  # (BLOCK_M, BLOCK_N)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        alpha = tl.exp2(m_i - m_new)  # (BLOCK_M,) rescales what was summed so far
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + rows[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, WIDEN)  # (BLOCK_M, BLOCK_D)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _compact_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, scatter_ptr, cu_q_ptr, cu_k_ptr, qk_scale,
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_on, stride_oh,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    seq = tl.program_id(0) // NUM_HEADS
    head = tl.program_id(0) % NUM_HEADS
    tile = tl.num_programs(1) - 1 - tl.program_id(1)  # last tiles first: they see the most keys
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:  # past this sequence's block (always, when it adds nothing)
        return
    k_start = tl.load(cu_k_ptr + seq)
    path_len = tl.load(cu_k_ptr + seq + 1) - k_start

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query index within the block
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    q_rows = (q_start + offs_m).to(tl.int64)  # (BLOCK_M,) compact rows of the queries
    q_mask = m_ok[:, None] & d_ok[None, :]  # (BLOCK_M, BLOCK_D)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qn + head * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)

    first = path_len - q_len + tile * BLOCK_M  # path position of the tile's first query
    q_pos = first + tl.arange(0, BLOCK_M)  # (BLOCK_M,) path position of each query: it sees keys 0..q_pos
    unmasked_end = (first // BLOCK_N) * BLOCK_N  # keys below this are visible to every query of the tile
    causal_end = tl.minimum(path_len, first + BLOCK_M)
    kv_head = head // GROUP
    k_base = k_ptr + kv_head * stride_kh
    v_base = v_ptr + kv_head * stride_vh
    path_ptr = scatter_ptr + k_start

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_base, v_base, path_ptr, path_len, q_pos, offs_d, d_ok, 0, unmasked_end,
        stride_kn, stride_vn, qk_scale, CAUSAL=False, BLOCK_N=BLOCK_N, PRECISION=PRECISION, WIDEN=WIDEN,
    )
    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_base, v_base, path_ptr, path_len, q_pos, offs_d, d_ok, unmasked_end, causal_end,
        stride_kn, stride_vn, qk_scale, CAUSAL=True, BLOCK_N=BLOCK_N, PRECISION=PRECISION, WIDEN=WIDEN,
    )
    out = acc / l_i[:, None]  # (BLOCK_M, BLOCK_D)
    out_ptrs = out_ptr + q_rows[:, None] * stride_on + head * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def compact_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scatter: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    scale: float | None = None,
    *,
    tiles: AttentionTiles | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's added block over its whole path, in compact space.

    `q` `(N', Hq, D)`, `k` and `v` `(N', Hkv, D)` (compact rows; fp32, fp16 or bf16; head dim contiguous;
    `Hq % Hkv == 0`), `scatter` `(N,)`, `cu_seqlens_q` and `cu_seqlens_k` `(B+1,)` (int32 or int64, from
    `RadixIndex`), `max_seqlen_q` the largest added block (`RadixIndex.max_seqlen_q`, sizes the grid),
    `scale` the softmax scale (default `D ** -0.5`), `tiles` the launch shape (default `default_tiles(D)`).
    Returns `(N', Hq, D)` in `q`'s dtype; every row is written when the blocks cover `0..N'`. The index values
    are not checked (that would cost a device synchronisation); `compact_attention_reference` checks the
    block lengths.
    """
    _check_attention_args(q, k, v, scatter, cu_seqlens_q, cu_seqlens_k, max_seqlen_q)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (N', Hq, D)
    if out.numel() == 0:
        return out
    num_heads, head_dim = q.shape[1], q.shape[2]
    tiles = tiles or default_tiles(head_dim)
    scale = head_dim**-0.5 if scale is None else scale
    grid = ((cu_seqlens_q.shape[0] - 1) * num_heads, triton.cdiv(max_seqlen_q, tiles.block_m))
    with launch_device(q):
        _compact_attention_kernel[grid](
            q, k, v, out, scatter, cu_seqlens_q, cu_seqlens_k, scale * _LOG2_E,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, GROUP=num_heads // k.shape[1], HEAD_DIM=head_dim,
            BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 stays fp32; 16-bit ignores it
            WIDEN=INTERPRETED and q.dtype == torch.bfloat16,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )
    return out


def compact_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scatter: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    scale: float | None = None,
) -> torch.Tensor:
    """`compact_attention` in plain torch, one sequence at a time: gather the path's K/V, masked softmax.

    Computes in float32 (float64 for float64 inputs) and returns `q`'s dtype. Raises `ValueError` when a
    sequence's block is longer than its path or than `max_seqlen_q` (what the kernel relies on).
    """
    group = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.zeros_like(q)  # (N', Hq, D)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for seq in range(len(cu_q) - 1):
        q_lo, q_hi = cu_q[seq], cu_q[seq + 1]
        path = scatter[cu_k[seq] : cu_k[seq + 1]].long()  # (Lk,) compact rows of the path
        if not q_hi - q_lo <= min(max_seqlen_q, path.shape[0]):
            raise ValueError(
                f"sequence {seq} adds {q_hi - q_lo} queries but max_seqlen_q is {max_seqlen_q} and its path "
                f"has {path.shape[0]} tokens; pass the index's own cu_seqlens_q, cu_seqlens_k and max_seqlen_q"
            )
        if q_hi > q_lo:
            out[q_lo:q_hi] = _attend_path(q[q_lo:q_hi], k[path], v[path], group, scale)
    return out


def _attend_path(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float) -> torch.Tensor:
    """Bottom-right causal attention of `q` `(Lq, Hq, D)` over `k`, `v` `(Lk, Hkv, D)` -> `(Lq, Hq, D)`."""
    compute = torch.promote_types(q.dtype, torch.float32)
    q_len, k_len = q.shape[0], k.shape[0]
    k = k.to(compute).repeat_interleave(group, dim=1)  # (Lk, Hq, D)
    v = v.to(compute).repeat_interleave(group, dim=1)  # (Lk, Hq, D)
    scores = torch.einsum("qhd,khd->hqk", q.to(compute), k) * scale  # (Hq, Lq, Lk)
    q_pos = torch.arange(k_len - q_len, k_len, device=q.device)  # (Lq,) path position of each query
    visible = torch.arange(k_len, device=q.device)[None, :] <= q_pos[:, None]  # (Lq, Lk)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)  # (Hq, Lq, Lk)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)  # (Lq, Hq, D)


def _check_attention_args(q, k, v, scatter, cu_seqlens_q, cu_seqlens_k, max_seqlen_q) -> None:
    """Raise a `ValueError` saying which argument is wrong, before anything reaches the kernel."""
    name = "compact_attention"
    for what, t in (("q", q), ("k", k), ("v", v)):
        check_ndim(name, what, t, 3, "(compact rows, heads, head_dim)")
        check_dtype(name, what, t, FLOAT_DTYPES)
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: {what} must have a contiguous head dim (strides {t.stride()})")
    for what, t in (("scatter", scatter), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_ndim(name, what, t, 1, "1-D")
        check_dtype(name, what, t, INDEX_DTYPES)
        if not t.is_contiguous():
            raise ValueError(f"{name}: {what} must be contiguous; call .contiguous() first")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"{name}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"{name}: k and v must be (N', Hkv, D) with q's N' and D; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{name}: query heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})")
    if not 0 < q.shape[2] <= _MAX_HEAD_DIM:
        raise ValueError(f"{name}: head dim must be in 1..{_MAX_HEAD_DIM}, got {q.shape[2]}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.shape[0] < 2:
        raise ValueError(
            f"{name}: cu_seqlens_q and cu_seqlens_k must both be (B+1,) with B >= 1, got "
            f"{tuple(cu_seqlens_q.shape)} and {tuple(cu_seqlens_k.shape)}"
        )
    if not isinstance(max_seqlen_q, numbers.Integral) or max_seqlen_q < (1 if q.shape[0] else 0):
        raise ValueError(f"{name}: max_seqlen_q must be a positive int (the longest added block), got {max_seqlen_q!r}")
    check_runnable(name, q, k, v, scatter, cu_seqlens_q, cu_seqlens_k)
