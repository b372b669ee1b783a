"""Triton kernels for the compact-space forward, each beside its launcher and a plain torch reference.

* `gather_rows(x, index)` — `x[index]` on `(rows, width)`: the fold `x[fold_gather]` and the scatter
  `x_c[scatter]` of the radix index.
* `compact_attention(q, k, v, scatter, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, scale)` — causal attention
  of each sequence's added block over its whole path, reading K/V through `scatter` (no gathered copy).

Kernels are compiled for CUDA, or run by Triton's CPU interpreter when `TRITON_INTERPRET=1` is set before this
package is imported; `triton_available(device)` says whether they can run on a device.
"""

from radix_core.kernels.capability import triton_available
from radix_core.kernels.compact_attention import (
    AttentionTiles,
    compact_attention,
    compact_attention_reference,
    default_tiles,
)
from radix_core.kernels.row_gather import gather_rows, gather_rows_reference

__all__ = [
    "AttentionTiles",
    "compact_attention",
    "compact_attention_reference",
    "default_tiles",
    "gather_rows",
    "gather_rows_reference",
    "triton_available",
]
