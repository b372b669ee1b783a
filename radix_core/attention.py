"""Attention backends over ragged batches, for all three engine layouts.

Every mode reduces to at most two kinds of attention call, described by `AttentionMetadata` (built once per
batch) and merged exactly:

* **Causal blocks** (`CausalBlocks`): block `j` is the rows `cu_seqlens[j]:cu_seqlens[j+1]`, attending causally
  to themselves (query `i` of the block sees keys `0..i`). In `off` the blocks are the sequences; in `mlp`
  (RadixMLP as published) q/k/v are first scattered from compact rows to the original layout, the blocks are
  the sequences there, and the output is gathered back with `fold_gather`; in `full` (compact attention) the
  blocks are the radix tree's segments (`radix_core.cascade`).
* **Prefix blocks** (`PrefixBlocks`, `full` mode with sharing): block `j`'s queries are the rows
  `q_rows[cu_seqlens_q[j]:cu_seqlens_q[j+1]]` (every row below one shared segment) and its keys are that
  segment's rows `key_start[j]:key_end[j]`, read in place and unmasked. Each shared prefix's K/V is read once for
  all the queries below it; nothing is gathered per sequence along its path.

Both return the output and the log-sum-exp of each query's scores; `merge_prefix` combines a row's causal
result with its prefix results (one per ancestor segment) into the softmax over its whole path.

Rows whose K/V come from the prefix cache (`radix_core.prefix_cache`) are not rows of the batch: a batch with cache
hits adds **past blocks** (`AttentionMetadata.past`), prefix blocks whose keys are ranges of the cached rows' K/V
(`past`, passed per layer), merged like the others. In `off` and `mlp` their queries are the original tokens the
batch computes, in `full` its compact rows; every backend reads them with its prefix-block call.

Backends: `torch` (CPU and reference: blocks padded to bucket lengths, one attention call per bucket, with the
log-sum-exp), `flash` (flash-attn 4's `flash_attn.cute.flash_attn_varlen_func` on CUDA),
`triton` (`radix_core.kernels.segment_attention`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

from radix_core.engine_config import ATTENTION_CHOICES
from radix_core.padded_blocks import PaddedGroup, PaddedPlan, padded_cascade, padded_prefix

if TYPE_CHECKING:
    from radix_core.invariant_attention import KeyPaths

log = logging.getLogger(__name__)


@dataclass
class CausalBlocks:
    """Blocks of rows, each attending causally to itself; on the engine's device."""

    cu_seqlens: torch.Tensor  # (J+1,) int32 block boundaries, covering every row
    max_seqlen: int


@dataclass
class PrefixBlocks:
    """Queries gathered from anywhere, each block against one contiguous range of key rows, unmasked."""

    q_rows: torch.Tensor  # (P,) int64 rows of q, block after block
    cu_seqlens_q: torch.Tensor  # (J+1,) int32 block boundaries in q_rows
    key_start: torch.Tensor  # (J,) int32 first key row of each block
    key_end: torch.Tensor  # (J,) int32 end of each block's key rows
    max_seqlen_q: int
    max_seqlen_k: int

    @cached_property
    def host(self) -> tuple[np.ndarray, ...]:
        """(q_rows, cu_seqlens_q, key_start, key_end) on the host, for the torch backend's plans."""
        return tuple(t.cpu().numpy() for t in (self.q_rows, self.cu_seqlens_q, self.key_start, self.key_end))

    @cached_property
    def padded(self) -> list[PaddedGroup]:
        """The blocks in chunks of queries padded to bucket key lengths, one dense call per bucket."""
        return padded_prefix(*self.host, self.q_rows.device)

    @cached_property
    def key_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(key rows back to back (K,) int64, their block boundaries (J+1,) int32), for kernels that take K/V
        back to back: the shared segments once each, at most N' rows."""
        starts = self.key_start.long()  # (J,)
        lengths = self.key_end.long() - starts  # (J,)
        cu = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32, device=lengths.device)
        torch.cumsum(lengths, 0, out=cu[1:])
        offsets = torch.repeat_interleave(starts - cu[:-1].long(), lengths)  # (K,)
        return torch.arange(offsets.shape[0], device=offsets.device) + offsets, cu


@dataclass
class AttentionMetadata:
    """What one batch's attention needs, on the engine's device."""

    causal: CausalBlocks
    prefix: PrefixBlocks | None = None  # `full` mode with sharing
    past: PrefixBlocks | None = None  # prefix cache hits: keys are rows of the layer's cached K/V
    qkv_scatter: torch.Tensor | None = None  # (N,) int64 `mlp` mode: compact -> original rows before attention
    out_gather: torch.Tensor | None = None  # (N',) int64 `mlp` mode: original -> compact rows after attention
    paths: KeyPaths | None = None  # batch-invariant mode: each row's keys in fixed chunks (`InvariantAttention`)

    @cached_property
    def padded(self) -> PaddedPlan:
        """The causal and prefix blocks as padded groups, one dense call per bucket, short prefix blocks absorbed
        into the causal ones (`radix_core.padded_blocks`): the torch backend's plan."""
        prefix = None if self.prefix is None else self.prefix.host
        return padded_cascade(self.causal.cu_seqlens.cpu().numpy(), prefix, self.causal.cu_seqlens.device)


PrefixPart = tuple[torch.Tensor, torch.Tensor, torch.Tensor | slice]  # out (P, Hq, D), lse (P, Hq) float32, rows (P,)


def merge_prefix(out: torch.Tensor, lse: torch.Tensor, parts: list[PrefixPart]) -> torch.Tensor:
    """Softmax over a row's whole path from its parts: `out` (R, H, D) and `lse` (R, H) of the causal blocks, and
    prefix parts (out, lse, rows), whose query `i` is row `rows[i]` (a query with lse -inf weighs nothing; `rows`
    a slice for a part on consecutive rows, merged in place rather than through an index). Each part is weighted by
    exp(its lse - the row's largest lse), in float32; returns `out`'s dtype. Consumes its float32 inputs (the
    backends' fresh results): the weighting is done in place."""
    top = lse.clone()  # (R, H) the row's largest lse, for stability
    for _, part_lse, rows in parts:
        if isinstance(rows, slice):
            torch.maximum(top[rows], part_lse, out=top[rows])
        else:
            top.scatter_reduce_(0, rows[:, None].expand(-1, lse.shape[1]), part_lse, "amax")
    weight = (lse - top).exp_()  # (R, H)
    total = out.float().mul_(weight[..., None])  # (R, H, D)
    for part_out, part_lse, rows in parts:
        in_place = isinstance(rows, slice)
        part_weight = (part_lse - (top[rows] if in_place else top.index_select(0, rows))).exp_()  # (P, H)
        weighted = part_out.float().mul_(part_weight[..., None])
        if in_place:
            total[rows] += weighted
            weight[rows] += part_weight
        else:
            total.index_add_(0, rows, weighted)
            weight.index_add_(0, rows, part_weight)
    return total.div_(weight[..., None]).to(out.dtype)


class AttentionBackend:
    """`attention(q (Nq, Hq, D), k (Nk, Hkv, D), v (Nk, Hkv, D), meta, scale, past) -> (Nq, Hq, D)` from two
    primitives: `causal_blocks` returns (out, lse (rows, Hq) float32 natural log) in row order, `prefix_blocks` a
    list of `PrefixPart`s, each saying which query row its outputs belong to. `past`: the layer's cached K/V
    ((C, Hkv, D) each) that `meta.past` reads."""

    name = "abstract"
    # True where `attend` reads short prefix blocks' keys in causal blocks and merges none of them: radix auto's
    # cost model counts only the merges made (`ModeCosts.absorbs`)
    absorbs_short_prefixes = False

    def prepare(self, plan) -> None:
        """Add what this backend reads beyond the plan's blocks to `plan.attention`, once per batch (the
        batch-invariant backend: each row's key path); nothing by default."""

    def __call__(self, q, k, v, meta: AttentionMetadata, scale: float,
                 past: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if meta.qkv_scatter is not None:  # RadixMLP: attention in the original layout
            q, k, v = (t.index_select(0, meta.qkv_scatter) for t in (q, k, v))  # (N, H, D)
        out, lse, parts = self.attend(q, k, v, meta, scale)
        if meta.past is not None:
            parts = parts + self.prefix_blocks(q, *past, meta.past, scale)
        if parts:
            out = merge_prefix(out, lse, parts)
        return out if meta.out_gather is None else out.index_select(0, meta.out_gather)  # (N', Hq, D) in `mlp`

    def attend(self, q, k, v, meta: AttentionMetadata, scale: float) -> tuple[torch.Tensor, torch.Tensor,
                                                                               list[PrefixPart]]:
        """The batch's own blocks: (out, lse) of the causal blocks in row order, and the prefix parts."""
        out, lse = self.causal_blocks(q, k, v, meta.causal, scale)
        return out, lse, [] if meta.prefix is None else self.prefix_blocks(q, k, v, meta.prefix, scale)

    def causal_blocks(self, q, k, v, blocks: CausalBlocks, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def prefix_blocks(self, q, k, v, blocks: PrefixBlocks, scale: float) -> list[PrefixPart]:
        raise NotImplementedError


class TorchAttention(AttentionBackend):
    """Attention with its log-sum-exp over blocks padded to bucket lengths, one dense call per bucket
    (`radix_core.padded_blocks`: at most one call per bucket present, where one per block made ~500 calls a layer
    on a 1,000-document rerank; prefix blocks of a few keys are absorbed into their descendants' causal blocks, and
    one read by 512 queries or more (128 over long keys) runs on its own, unpadded, 4,096 queries a call);
    the CPU path and the reference for the others. On the CPU it calls the kernel that
    `scaled_dot_product_attention` runs there (`_scaled_dot_product_flash_attention_for_cpu`), which also
    returns the log-sum-exp; elsewhere plain matmuls in float32, in query chunks."""

    name = "torch"
    absorbs_short_prefixes = True

    def attend(self, q, k, v, meta, scale):
        plan = meta.padded
        rows = q.shape[0]
        out = q.new_empty(rows + 1, *q.shape[1:])  # (R + 1, Hq, D): the last row takes the dropped queries' outputs
        lse = torch.empty(rows + 1, q.shape[1], dtype=torch.float32, device=q.device)  # (R + 1, Hq)
        for group, group_out, group_lse in _padded_attention(q, k, v, plan.causal, True, scale):
            out.index_copy_(0, group.out_rows, group_out)
            lse.index_copy_(0, group.out_rows, group_lse)
        return out[:rows], lse[:rows], self._prefix_parts(q, k, v, plan.prefix, scale)

    def prefix_blocks(self, q, k, v, blocks, scale):
        return self._prefix_parts(q, k, v, blocks.padded, scale)

    @staticmethod
    def _prefix_parts(q, k, v, groups: list[PaddedGroup], scale: float) -> list[PrefixPart]:
        parts = []
        for group, group_out, group_lse in _padded_attention(q, k, v, groups, False, scale):
            if group.padding is not None:
                group_lse.masked_fill_(group.padding[:, None], float("-inf"))  # copies of real queries weigh nothing
            parts.append((group_out, group_lse, group.out_rows))
        return parts


def _padded_attention(q, k, v, groups: list[PaddedGroup], causal: bool, scale: float):
    """Per group: (the group, out (G * Lq, Hq, D), lse (G * Lq, Hq) float32), one kernel call each."""
    for g in groups:
        out, lse = _attention_with_lse(g.gather(q, g.q_rows, g.q_len), g.gather(k, g.k_rows, g.k_len),
                                       g.gather(v, g.k_rows, g.k_len), causal, scale,
                                       g.additive_mask(q.dtype))  # (G, Hq, Lq, D), (G, Hq, Lq)
        # float64 inputs give a float64 lse
        yield g, out.transpose(1, 2).reshape(-1, *q.shape[1:]), lse.transpose(1, 2).reshape(-1, q.shape[1]).float()


_MATH_CHUNK = 1 << 24  # score elements per step of the matmul fallback (64 MiB of float32)


def _attention_with_lse(q, k, v, causal: bool, scale: float,
                        mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`q` (G, Hq, Lq, D) over `k`, `v` (G, Hkv, Lk, D), grouped-query heads, causal (square blocks) or not, with an
    additive `mask` (G, 1, 1, Lk) in q's dtype -> (out (G, Hq, Lq, D) in q's dtype, lse (G, Hq, Lq) float32)."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask,
                                                                          scale=scale)
    return _math_attention_with_lse(q, k, v, causal, scale, mask)


def _math_attention_with_lse(q, k, v, causal: bool, scale: float, mask: torch.Tensor | None = None,
                             chunk: int = _MATH_CHUNK):
    """`_attention_with_lse` in float32 matmuls, `chunk` score elements at a time (queries split)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1).float() for t in (k, v))  # (G, Hq, Lk, D)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    step = max(1, chunk // max(1, q.shape[0] * q.shape[1] * k.shape[2]))
    for start in range(0, q.shape[2], step):
        scores = q[:, :, start:start + step].float() @ k.transpose(-1, -2) * scale  # (G, Hq, chunk, Lk)
        if mask is not None:
            scores = scores + mask.float()
        if causal:
            visible = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril(start)
            scores = scores.masked_fill(~visible, float("-inf"))
        lse[:, :, start:start + step] = torch.logsumexp(scores, dim=-1)
        out[:, :, start:start + step] = (scores.softmax(dim=-1) @ v).to(q.dtype)
    return out, lse


class FlashAttention(AttentionBackend):
    """flash-attn 4 varlen (CuTe DSL kernels, compiled at first use; compute capability 8.x to 12.x) on CUDA:
    grouped-query heads, int32 `cu_seqlens`, the log-sum-exp returned as (heads, rows)."""

    name = "flash"

    def __init__(self):
        from flash_attn.cute import flash_attn_varlen_func

        self._varlen = flash_attn_varlen_func

    def causal_blocks(self, q, k, v, blocks, scale):
        out, lse = self._varlen(q, k, v, cu_seqlens_q=blocks.cu_seqlens, cu_seqlens_k=blocks.cu_seqlens,
                                max_seqlen_q=blocks.max_seqlen, max_seqlen_k=blocks.max_seqlen,
                                softmax_scale=scale, causal=True, return_lse=True)  # (R, Hq, D), (Hq, R)
        return out, lse.transpose(0, 1)

    def prefix_blocks(self, q, k, v, blocks, scale):
        key_rows, cu_seqlens_k = blocks.key_rows  # the shared segments back to back
        out, lse = self._varlen(q.index_select(0, blocks.q_rows), k.index_select(0, key_rows),
                                v.index_select(0, key_rows), cu_seqlens_q=blocks.cu_seqlens_q,
                                cu_seqlens_k=cu_seqlens_k, max_seqlen_q=blocks.max_seqlen_q,
                                max_seqlen_k=blocks.max_seqlen_k, softmax_scale=scale, causal=False,
                                return_lse=True)  # (P, Hq, D), (Hq, P)
        return [(out, lse.transpose(0, 1), blocks.q_rows)]


class TritonAttention(AttentionBackend):
    """`radix_core.kernels.segment_attention`: queries and K/V read in place (queries of prefix blocks through
    their row index), nothing gathered; compiled on CUDA, interpreted on the CPU under `TRITON_INTERPRET=1`
    (tests)."""

    name = "triton"

    def __init__(self, device: torch.device):
        from radix_core.kernels import segment_attention, triton_available

        if not triton_available(device):
            raise ValueError(f"attention='triton' needs a CUDA device (or TRITON_INTERPRET=1 set before triton is "
                             f"imported, for tests on the CPU); got {device}")
        self._attention = segment_attention

    def causal_blocks(self, q, k, v, blocks, scale):
        cu = blocks.cu_seqlens
        return self._attention(q, k, v, cu, cu[:-1], cu[1:], blocks.max_seqlen, causal=True, scale=scale)

    def prefix_blocks(self, q, k, v, blocks, scale):
        out, lse = self._attention(q, k, v, blocks.cu_seqlens_q, blocks.key_start, blocks.key_end,
                                   blocks.max_seqlen_q, q_rows=blocks.q_rows, causal=False, scale=scale)
        return [(out, lse, blocks.q_rows)]


_FLASH_INSTALL = "pip install 'radixserve[gpu]' (flash-attn-4 with its CUDA 13 CuTe DSL libraries)"


def make_backend(name: str, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    """Pick the attention backend. "auto": torch on the CPU; on CUDA flash-attn (half precision, when it loads),
    else the Triton kernels, saying why in the log when flash-attn was wanted but does not load: not installed,
    or installed without its native libraries, or refused by the CuTe DSL loader (a `RuntimeError`: "install is
    incomplete", "no compatible toolkit flavor"). A kernel that then fails to compile falls back the same way in
    `Engine.warm_up` (`fallback_backend`). Which of flash and Triton is faster on which GPU is what
    `bench/gpu_check.py` measures (bench/results/gpu/NOTES.md); until a GPU run says otherwise, flash-attn comes
    first."""
    if name not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention backend {name!r}: choose one of {', '.join(ATTENTION_CHOICES)}")
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttention()
    if name == "triton":
        return TritonAttention(device)
    flash_fits = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    if name == "flash" and not flash_fits:
        raise ValueError(f"attention='flash' runs on CUDA in float16/bfloat16, not on {device.type} in {dtype}")
    if not flash_fits:
        return TritonAttention(device)
    try:
        return FlashAttention()
    except Exception as err:  # any failure to load: ImportError, OSError, the CuTe DSL loader's RuntimeError
        if name == "flash":
            raise ValueError(f"attention='flash' needs flash-attn 4, which does not import ({_reason(err)}): "
                             f"{_FLASH_INSTALL}") from err
        log.warning("attention='auto' uses the Triton kernels: flash-attn 4 does not import (%s); for flash-attn, "
                    "%s", _reason(err), _FLASH_INSTALL)
    return TritonAttention(device)


def fallback_backend(requested: str, failed: AttentionBackend, device: torch.device,
                     err: Exception) -> AttentionBackend:
    """The backend to use after `failed` raised `err` in its first calls (`Engine.warm_up`), e.g. flash-attn 4
    failing to compile for this GPU or toolkit: the Triton kernels, saying why in the log, when flash-attn was
    only preferred (`attention="auto"`). A backend asked for by name, or one with nothing to fall back to,
    raises: flash-attn with what to do, the others with `err` itself."""
    if failed.name != "flash":
        raise err
    if requested != "auto":
        raise ValueError(f"attention={requested!r}: flash-attn 4 failed its first call ({_reason(err)}); set "
                         f"attention='auto' to fall back to the Triton kernels, or attention='triton'") from err
    log.warning("attention='auto' uses the Triton kernels: flash-attn 4 failed its first call (%s)", _reason(err))
    return TritonAttention(device)


def _reason(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"
