"""Attention backends over ragged batches, for all three engine layouts.

Every mode reduces to one problem, described by `AttentionMetadata` (built once per batch): sequence `s`
attends with query rows `cu_seqlens_q[s]:cu_seqlens_q[s+1]` of `q` to key/value rows `kv_index[k_s:k_e]`
(`k_s, k_e = cu_seqlens_k[s], cu_seqlens_k[s+1]`) of `k`/`v`, causal and aligned bottom-right (query `j` of
`Lq` sees path positions `0 .. Lk - Lq + j`). Every sequence in the metadata has `Lq >= 1`: a sequence that
adds no queries (`full` mode's duplicates) is left out when the plan is built (`RadixIndex.attention_blocks`).

* `off`: rows are the original tokens; `kv_index` is None (rows in place), `cu_q == cu_k`.
* `mlp` (RadixMLP as published): q/k/v are first scattered from compact rows to the original layout, attention
  runs there as in `off`, and the output is gathered back with `fold_gather`.
* `full` (compact attention): queries are the compact rows themselves (each sequence's added block);
  `kv_index` is `scatter` over the sequences that add queries, so keys/values are each one's whole path read
  from compact K/V.

Backends: `torch` (CPU and reference: one `scaled_dot_product_attention` per group of equal shapes), `flash`
(flash-attn 4's `flash_attn.cute.flash_attn_varlen_func` on CUDA over gathered K/V), `triton`
(`radix_core.kernels.compact_attention`, reading K/V through the path index).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


@dataclass
class AttentionMetadata:
    """What one batch's attention needs, on the engine's device."""

    cu_seqlens_q: torch.Tensor  # (B+1,) int32 query row boundaries, no empty block
    cu_seqlens_k: torch.Tensor  # (B+1,) int32 key boundaries in kv_index (or in rows, when kv_index is None)
    max_seqlen_q: int
    max_seqlen_k: int
    kv_index: torch.Tensor | None = None  # (total_k,) int64 rows of k/v forming each sequence's path
    qkv_scatter: torch.Tensor | None = None  # (N,) int64 `mlp` mode: compact -> original rows before attention
    out_gather: torch.Tensor | None = None  # (N',) int64 `mlp` mode: original -> compact rows after attention

    @cached_property
    def bounds(self) -> list[tuple[int, int, int, int]]:
        """Per sequence (q_start, q_end, k_start, k_end) as Python ints, for backends that loop."""
        q = self.cu_seqlens_q.tolist()
        k = self.cu_seqlens_k.tolist()
        return [(q[s], q[s + 1], k[s], k[s + 1]) for s in range(len(q) - 1)]

    @cached_property
    def shape_groups(self) -> list[ShapeGroup]:
        """Sequences with equal (Lq, Lk), each group one batched attention call without padding. Key rows count
        along the keys' layout (`cu_seqlens_k`), i.e. after gathering through `kv_index`. Built once per batch,
        used by every layer."""
        by_shape: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for q_start, q_end, k_start, k_end in self.bounds:
            by_shape.setdefault((q_end - q_start, k_end - k_start), []).append((q_start, k_start))
        return [self._group(lq, lk, starts) for (lq, lk), starts in by_shape.items()]

    def _group(self, lq: int, lk: int, starts: list[tuple[int, int]]) -> ShapeGroup:
        """Rows as slices where they are back to back (views, no copy), else as index tensors."""
        device = self.cu_seqlens_q.device
        q_rows = _rows([q for q, _ in starts], lq, device)
        k_rows = _rows([k for _, k in starts], lk, device)
        mask = None if lq == lk else torch.ones(lq, lk, dtype=torch.bool, device=device).tril(lk - lq)
        return ShapeGroup(lq, lk, len(starts), q_rows, k_rows, mask)


def _rows(starts: list[int], length: int, device) -> torch.Tensor | slice:
    """The rows of blocks of `length` starting at `starts`: a slice when they are back to back."""
    if all(b - a == length for a, b in zip(starts, starts[1:])):
        return slice(starts[0], starts[0] + len(starts) * length)
    return (torch.tensor(starts, device=device)[:, None] + torch.arange(length, device=device)).reshape(-1)


@dataclass
class ShapeGroup:
    """`count` sequences with `lq` queries and `lk` keys each: their query rows and key/value rows, back to back."""

    lq: int
    lk: int
    count: int
    q_rows: torch.Tensor | slice  # (count*lq,) rows of q
    k_rows: torch.Tensor | slice  # (count*lk,) rows of the keys' layout
    mask: torch.Tensor | None  # (lq, lk) bool, bottom-right causal; None when lq == lk (plain causal)


class AttentionBackend:
    """`attend(q (Nq, Hq, D), k (Nk, Hkv, D), v (Nk, Hkv, D), meta, scale) -> (Nq, Hq, D)`."""

    name = "abstract"

    def __call__(self, q, k, v, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if meta.qkv_scatter is not None:  # RadixMLP: attention in the original layout
            q, k, v = (t.index_select(0, meta.qkv_scatter) for t in (q, k, v))  # (N, H, D)
            return self.attend(q, k, v, meta, scale).index_select(0, meta.out_gather)  # (N', Hq, D)
        return self.attend(q, k, v, meta, scale)

    def attend(self, q, k, v, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        raise NotImplementedError


class TorchAttention(AttentionBackend):
    """`scaled_dot_product_attention` per group of equal-shape sequences (`AttentionMetadata.shape_groups`), over
    K/V gathered once per layer along the sequences' paths; the CPU path and the reference for the others."""

    name = "torch"

    def attend(self, q, k, v, meta, scale):
        if meta.kv_index is not None:
            k, v = k.index_select(0, meta.kv_index), v.index_select(0, meta.kv_index)  # (total_k, Hkv, D)
        out = torch.empty_like(q)  # (Nq, Hq, D); every query row belongs to exactly one sequence
        heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
        for g in meta.shape_groups:
            qs = q[g.q_rows].view(g.count, g.lq, heads, dim).transpose(1, 2)  # (G, Hq, Lq, D)
            ks = k[g.k_rows].view(g.count, g.lk, kv_heads, dim).transpose(1, 2)  # (G, Hkv, Lk, D)
            vs = v[g.k_rows].view(g.count, g.lk, kv_heads, dim).transpose(1, 2)  # (G, Hkv, Lk, D)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=g.mask, is_causal=g.mask is None, scale=scale,
                                               enable_gqa=heads != kv_heads)  # (G, Hq, Lq, D)
            out[g.q_rows] = o.transpose(1, 2).reshape(-1, heads, dim)
        return out


class FlashAttention(AttentionBackend):
    """flash-attn 4 varlen (CuTe DSL kernels, compiled at first use; compute capability 8.x to 12.x) on CUDA:
    causal masks align bottom-right when `seqlen_q < seqlen_k`, grouped-query heads, int32 `cu_seqlens`."""

    name = "flash"

    def __init__(self):
        from flash_attn.cute import flash_attn_varlen_func

        self._varlen = flash_attn_varlen_func

    def attend(self, q, k, v, meta, scale):
        if meta.kv_index is not None:
            k, v = k.index_select(0, meta.kv_index), v.index_select(0, meta.kv_index)  # (total_k, Hkv, D)
        out, _ = self._varlen(q, k, v, cu_seqlens_q=meta.cu_seqlens_q, cu_seqlens_k=meta.cu_seqlens_k,
                              max_seqlen_q=meta.max_seqlen_q, max_seqlen_k=meta.max_seqlen_k, softmax_scale=scale,
                              causal=True)  # (Nq, Hq, D) and the log-sum-exp (None unless asked)
        return out


class TritonAttention(AttentionBackend):
    """`radix_core.kernels.compact_attention`: K/V read through the path index inside the kernel, no gathered
    copy; compiled on CUDA, interpreted on the CPU under `TRITON_INTERPRET=1` (tests)."""

    name = "triton"

    def __init__(self, device: torch.device):
        from radix_core.kernels import compact_attention, triton_available

        if not triton_available(device):
            raise ValueError(f"attention='triton' needs a CUDA device (or TRITON_INTERPRET=1 set before triton is "
                             f"imported, for tests on the CPU); got {device}")
        self._attention = compact_attention

    def attend(self, q, k, v, meta, scale):
        rows = meta.kv_index if meta.kv_index is not None else torch.arange(k.shape[0], device=k.device)
        return self._attention(q, k, v, rows, meta.cu_seqlens_q, meta.cu_seqlens_k, meta.max_seqlen_q, scale)


ATTENTION_CHOICES = ("auto", "torch", "flash", "triton")


_FLASH_INSTALL = "pip install 'radixserve[gpu]' (flash-attn-4 with its CUDA 13 CuTe DSL libraries)"


def make_backend(name: str, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    """Pick the attention backend. "auto": torch on the CPU; on CUDA flash-attn (half precision, when it imports),
    else the Triton kernels, saying why in the log when flash-attn was wanted but does not import. Which of
    flash and Triton is faster on which GPU is what `bench/gpu_check.py` measures (bench/results/gpu/NOTES.md);
    until a GPU run says otherwise, flash-attn comes first."""
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
    except (ImportError, OSError) as err:  # not installed, or installed without its native libraries
        if name == "flash":
            raise ValueError(f"attention='flash' needs flash-attn 4, which does not import ({err}): "
                             f"{_FLASH_INSTALL}") from err
        log.warning("attention='auto' uses the Triton kernels: flash-attn 4 does not import (%s); for flash-attn, "
                    "%s", err, _FLASH_INSTALL)
    return TritonAttention(device)
