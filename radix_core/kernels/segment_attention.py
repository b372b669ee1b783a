"""Segment attention: the one attention primitive of shared-prefix (cascade) attention, with its log-sum-exp.

In compact space the rows of the radix tree split into segments, contiguous ranges of compact rows. A row's
attention over its whole path is the exact log-sum-exp merge (shared torch code, not here) of two kinds of call
of this one primitive:

* **self** (`causal=True`): each segment's rows attend causally to the segment itself: block `j` is the square
  block of rows `cu_seqlens_q[j]:cu_seqlens_q[j+1]`, and query `i` of the block sees its keys `0..i`.
* **prefix** (`causal=False`): block `j`'s queries are the rows `q_rows[cu_seqlens_q[j]:cu_seqlens_q[j+1]]` of `q`
  (every row below one shared segment) and its keys are that segment's rows `key_start[j]:key_end[j]`, all
  visible.

K/V rows are one contiguous range per block, read in place: no index is loaded and no copy is gathered. Each call
returns the output and the natural-log log-sum-exp of each query's scaled scores over its visible keys, what
the merge weighs the parts by. A block without queries has programs that exit at once.

Flash-attention 2 structure (Dao, arXiv 2307.08691; Triton's fused-attention tutorial): one program per
(block x query head, query tile), online softmax in base 2 with float32 statistics and accumulator, and two key
stages: the key tiles every query of the tile sees whole, without masks, then the tiles at the causal diagonal
(self) or at the end of the key range (prefix) with the mask. Grouped-query heads read kv head `h // (Hq / Hkv)`,
as transformers' `repeat_kv` does.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radix_core.kernels.capability import (
    INDEX_DTYPES,
    INTERPRETED,
    check_dtype,
    check_ndim,
    check_qkv,
    check_runnable,
    launch_device,
)

_MAX_HEAD_DIM = 256
_LOG2_E = 1.4426950408889634
_LN_2 = tl.constexpr(0.6931471805599453)


@dataclass(frozen=True, slots=True)
class AttentionTiles:
    """Tile sizes and launch shape of the segment attention kernel (powers of two, at least 16)."""

    block_m: int  # queries per program
    block_n: int  # keys per inner step
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            size = getattr(self, name)
            if size < 16 or size & (size - 1):
                raise ValueError(f"AttentionTiles.{name} must be a power of two >= 16 (tl.dot's minimum), got {size}")


def default_tiles(head_dim: int, dtype: torch.dtype) -> AttentionTiles:
    """Tiles for this process: 16 x 16 under the interpreter (small tiles make test-sized blocks span several
    tiles), and on the GPU untuned starting points in the range of Triton's fused-attention tutorial;
    `bench/gpu_check.py` times them against alternatives. float32 tiles of head dim 128 take 2 stages, not 3:
    K/V read in place pipeline fully, and 3 stages need 229,888 B of shared memory on sm_90 (its limit is
    232,448 B, sm_80's 167,936 B), 2 stages 164,352 B (`tests/kernels/compile_sm90.py`)."""
    if INTERPRETED:
        return AttentionTiles(block_m=16, block_n=16)
    if head_dim <= 64:
        return AttentionTiles(block_m=64, block_n=64, num_warps=4, num_stages=3)
    if head_dim <= 128:
        return AttentionTiles(block_m=128, block_n=64, num_warps=8, num_stages=2 if dtype == torch.float32 else 3)
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
    acc, m_i, l_i, q, k_base, v_base, k_len, last, offs_d, d_ok, lo, hi,
    stride_kn, stride_vn, qk_scale,
    MASKED: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    """Fold the block's keys `[lo, hi)` into the running softmax (`m_i`, `l_i`) and output (`acc`) of `q`;
    `MASKED` hides key `n` from query `i` unless `n <= last[i]`."""
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key index within the block
        kv_mask = (offs_n < k_len)[:, None] & d_ok[None, :]  # (BLOCK_N, BLOCK_D)
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), PRECISION, WIDEN) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        if MASKED:
            s = tl.where(offs_n[None, :] <= last[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        alpha = tl.exp2(m_i - m_new)  # (BLOCK_M,) rescales what was summed so far
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, WIDEN)  # (BLOCK_M, BLOCK_D)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _segment_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, q_rows_ptr, cu_q_ptr, key_start_ptr, key_end_ptr, qk_scale,
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_on, stride_oh,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    WIDEN: tl.constexpr,
):
    block = tl.program_id(0) // NUM_HEADS
    head = tl.program_id(0) % NUM_HEADS
    tile = tl.num_programs(1) - 1 - tl.program_id(1)  # last tiles first: causally they see the most keys
    q_start = tl.load(cu_q_ptr + block)
    q_len = tl.load(cu_q_ptr + block + 1) - q_start
    if tile * BLOCK_M >= q_len:  # past this block's queries (always, when it has none)
        return
    k_start = tl.load(key_start_ptr + block)
    k_len = tl.load(key_end_ptr + block) - k_start

    first = tile * BLOCK_M  # the tile's first query, within the block
    offs_m = first + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query index within the block
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    out_rows = (q_start + offs_m).to(tl.int64)  # (BLOCK_M,) the call's query index: the output row
    if q_rows_ptr is None:
        rows = out_rows  # (BLOCK_M,) queries in place
    else:
        rows = tl.load(q_rows_ptr + out_rows, mask=m_ok, other=0).to(tl.int64)  # (BLOCK_M,) rows of q
    q_mask = m_ok[:, None] & d_ok[None, :]  # (BLOCK_M, BLOCK_D)
    q = tl.load(q_ptr + rows[:, None] * stride_qn + head * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)

    if CAUSAL:  # square block: query i sees keys 0..i
        last = offs_m  # (BLOCK_M,) last key each query sees
        unmasked_end = (first // BLOCK_N) * BLOCK_N  # keys below this are visible to every query of the tile
        masked_end = tl.minimum(k_len, first + BLOCK_M)
    else:  # every query sees the whole key range
        last = tl.zeros((BLOCK_M,), tl.int32) + (k_len - 1)  # (BLOCK_M,)
        unmasked_end = (k_len // BLOCK_N) * BLOCK_N  # whole key tiles; the partial last one is masked
        masked_end = k_len
    kv_head = head // GROUP
    k_base = k_ptr + k_start.to(tl.int64) * stride_kn + kv_head * stride_kh
    v_base = v_ptr + k_start.to(tl.int64) * stride_vn + kv_head * stride_vh

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_base, v_base, k_len, last, offs_d, d_ok, 0, unmasked_end,
        stride_kn, stride_vn, qk_scale, MASKED=False, BLOCK_N=BLOCK_N, PRECISION=PRECISION, WIDEN=WIDEN,
    )
    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_base, v_base, k_len, last, offs_d, d_ok, unmasked_end, masked_end,
        stride_kn, stride_vn, qk_scale, MASKED=True, BLOCK_N=BLOCK_N, PRECISION=PRECISION, WIDEN=WIDEN,
    )
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # (BLOCK_M, BLOCK_D); 0 for a block without keys
    out_ptrs = out_ptr + out_rows[:, None] * stride_on + head * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    lse = (m_i + tl.log2(l_i)) * _LN_2  # (BLOCK_M,) natural log; -inf for a block without keys
    tl.store(lse_ptr + out_rows * NUM_HEADS + head, lse, mask=m_ok)


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    key_start: torch.Tensor,
    key_end: torch.Tensor,
    max_seqlen_q: int,
    *,
    q_rows: torch.Tensor | None = None,
    causal: bool,
    scale: float | None = None,
    tiles: AttentionTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `J` blocks of queries, each over one contiguous range of key rows; with the log-sum-exp.

    `q` `(Nq, Hq, D)`, `k` and `v` `(Nk, Hkv, D)` (fp32, fp16 or bf16; head dim contiguous; `Hq % Hkv == 0`).
    Block `j`'s queries are the call's queries `cu_seqlens_q[j]:cu_seqlens_q[j+1]`: rows of `q` in place, or
    `q_rows` `(P,)` of them; its keys and values are the rows `key_start[j]:key_end[j]` of `k` and `v`.
    `causal=True` needs square blocks (query `i` sees keys `0..i`); `causal=False` shows every query all its
    block's keys. `cu_seqlens_q` `(J+1,)`, `key_start`, `key_end` `(J,)` and `q_rows` are int32 or int64;
    `max_seqlen_q` is the largest block's query count (sizes the grid), `scale` the softmax scale (default
    `D ** -0.5`), `tiles` the launch shape (default `default_tiles(D, q.dtype)`).

    Returns `out` `(P, Hq, D)` in `q`'s dtype, row `i` the call's query `i` (`P = len(q_rows)`, or `Nq` in
    place), and `lse` `(P, Hq)` float32, the natural-log log-sum-exp of that query's scaled scores over its
    visible keys (0 and -inf for a block without keys). The blocks must cover the queries, `cu_seqlens_q` rising
    from 0 to `P`. The index values are not checked (that would cost a device synchronisation);
    `segment_attention_reference` checks them.
    """
    num_queries = _check_attention_args(q, k, v, cu_seqlens_q, key_start, key_end, max_seqlen_q, q_rows)
    out = torch.empty((num_queries, *q.shape[1:]), dtype=q.dtype, device=q.device)  # (P, Hq, D)
    lse = torch.empty(out.shape[:2], dtype=torch.float32, device=q.device)  # (P, Hq)
    if out.numel() == 0:
        return out, lse
    num_heads, head_dim = q.shape[1], q.shape[2]
    tiles = tiles or default_tiles(head_dim, q.dtype)
    scale = head_dim**-0.5 if scale is None else scale
    grid = (key_start.shape[0] * num_heads, triton.cdiv(max_seqlen_q, tiles.block_m))
    with launch_device(q):
        _segment_attention_kernel[grid](
            q, k, v, out, lse, q_rows, cu_seqlens_q, key_start, key_end, scale * _LOG2_E,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, GROUP=num_heads // k.shape[1], HEAD_DIM=head_dim,
            BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
            CAUSAL=bool(causal), PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # 16-bit ignores it
            WIDEN=INTERPRETED and q.dtype == torch.bfloat16,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )
    return out, lse


def segment_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    key_start: torch.Tensor,
    key_end: torch.Tensor,
    max_seqlen_q: int,
    *,
    q_rows: torch.Tensor | None = None,
    causal: bool,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`segment_attention` in plain torch, one block at a time: masked softmax and `logsumexp` of the scores.

    Computes in float32 (float64 for float64 inputs) and returns (`out` in `q`'s dtype, `lse` float32). Raises
    `ValueError` when the index values break what the kernel relies on (`_check_blocks`).
    """
    group = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    rows = torch.arange(q.shape[0], device=q.device) if q_rows is None else q_rows.long()  # (P,) q row per query
    cu, starts, ends = cu_seqlens_q.tolist(), key_start.tolist(), key_end.tolist()
    _check_blocks(cu, starts, ends, rows, q.shape[0], k.shape[0], max_seqlen_q, causal)
    out = q.new_zeros((rows.shape[0], *q.shape[1:]))  # (P, Hq, D)
    lse = torch.full(out.shape[:2], float("-inf"), device=q.device)  # (P, Hq)
    for q_lo, q_hi, k_lo, k_hi in zip(cu, cu[1:], starts, ends):
        if q_hi > q_lo:
            block_q = q.index_select(0, rows[q_lo:q_hi])  # (Lq, Hq, D)
            out[q_lo:q_hi], lse[q_lo:q_hi] = _attend_block(block_q, k[k_lo:k_hi], v[k_lo:k_hi], group, scale, causal)
    return out, lse


def _attend_block(q, k, v, group: int, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`q` `(Lq, Hq, D)` over `k`, `v` `(Lk, Hkv, D)` -> (out `(Lq, Hq, D)`, lse `(Lq, Hq)`)."""
    compute = torch.promote_types(q.dtype, torch.float32)
    k = k.to(compute).repeat_interleave(group, dim=1)  # (Lk, Hq, D)
    v = v.to(compute).repeat_interleave(group, dim=1)  # (Lk, Hq, D)
    scores = torch.einsum("qhd,khd->hqk", q.to(compute), k) * scale  # (Hq, Lq, Lk)
    if causal:
        hidden = torch.ones(scores.shape[1:], dtype=torch.bool, device=q.device).triu(1)  # (Lq, Lk) keys after i
        scores = scores.masked_fill(hidden, float("-inf"))
    lse = scores.logsumexp(dim=-1)  # (Hq, Lq); -inf without keys
    probs = (scores - lse[..., None]).exp()  # (Hq, Lq, Lk)
    out = torch.einsum("hqk,khd->qhd", probs, v)  # (Lq, Hq, D)
    return out.to(q.dtype), lse.T.float()


def _check_blocks(cu, starts, ends, rows, num_q, num_k, max_seqlen_q, causal) -> None:
    """Raise a `ValueError` naming the first block whose index values the kernel cannot take."""
    name = "segment_attention_reference"
    num_queries = rows.shape[0]
    if cu[0] != 0 or cu[-1] != num_queries or any(hi < lo for lo, hi in zip(cu, cu[1:])):
        raise ValueError(
            f"{name}: cu_seqlens_q must rise from 0 to the number of queries {num_queries} (len(q_rows), or q's "
            f"rows in place), got {cu[0]} .. {cu[-1]}"
        )
    if num_queries and not 0 <= rows.min().item() <= rows.max().item() < num_q:
        raise ValueError(f"{name}: q_rows must be rows of q (0..{num_q - 1}), got {rows.min()} .. {rows.max()}")
    for j, (q_lo, q_hi, k_lo, k_hi) in enumerate(zip(cu, cu[1:], starts, ends)):
        if q_hi - q_lo > max_seqlen_q:
            raise ValueError(
                f"{name}: block {j} has {q_hi - q_lo} queries but max_seqlen_q is {max_seqlen_q}; pass the largest "
                "block's query count"
            )
        if not 0 <= k_lo <= k_hi <= num_k:
            raise ValueError(f"{name}: block {j}'s keys {k_lo}:{k_hi} are not a range of k's {num_k} rows")
        if causal and q_hi - q_lo != k_hi - k_lo:
            raise ValueError(
                f"{name}: causal block {j} has {q_hi - q_lo} queries and {k_hi - k_lo} keys; a causal block must "
                "be square (a segment attending to itself), pass causal=False for a prefix block"
            )


def _check_attention_args(q, k, v, cu_seqlens_q, key_start, key_end, max_seqlen_q, q_rows) -> int:
    """Raise a `ValueError` saying which argument is wrong, before anything reaches the kernel; return the
    number of queries `P`."""
    name = "segment_attention"
    check_qkv(name, q, k, v, 3, "(rows, heads, head_dim)")
    indices = {"cu_seqlens_q": cu_seqlens_q, "key_start": key_start, "key_end": key_end}
    if q_rows is not None:
        indices["q_rows"] = q_rows
    for what, t in indices.items():
        check_ndim(name, what, t, 1, "1-D")
        check_dtype(name, what, t, INDEX_DTYPES)
        if not t.is_contiguous():
            raise ValueError(f"{name}: {what} must be contiguous; call .contiguous() first")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"{name}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"{name}: k and v must both be (Nk, Hkv, D) with q's D; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{name}: query heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})")
    if not 0 < q.shape[2] <= _MAX_HEAD_DIM:
        raise ValueError(f"{name}: head dim must be in 1..{_MAX_HEAD_DIM}, got {q.shape[2]}")
    num_blocks = key_start.shape[0]
    if num_blocks < 1 or key_end.shape[0] != num_blocks or cu_seqlens_q.shape[0] != num_blocks + 1:
        raise ValueError(
            f"{name}: cu_seqlens_q must be (J+1,) and key_start, key_end (J,) for J >= 1 blocks, got "
            f"{tuple(cu_seqlens_q.shape)}, {tuple(key_start.shape)} and {tuple(key_end.shape)}"
        )
    num_queries = q.shape[0] if q_rows is None else q_rows.shape[0]
    if not isinstance(max_seqlen_q, numbers.Integral) or max_seqlen_q < (1 if num_queries else 0):
        raise ValueError(f"{name}: max_seqlen_q must be a positive int (the largest block's queries), got "
                         f"{max_seqlen_q!r}")
    check_runnable(name, q, k, v, *indices.values())
    return num_queries
