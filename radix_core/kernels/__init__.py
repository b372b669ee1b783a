"""Triton kernels for the compact-space forward, each beside its launcher and a plain torch reference.

* `gather_rows(x, index)` — `x[index]` on `(rows, width)`: the fold `x[fold_gather]` and the scatter
  `x_c[scatter]` of the radix index.
* `segment_attention(q, k, v, cu_seqlens_q, key_start, key_end, max_seqlen_q, *, q_rows, causal, scale)` —
  blocks of queries (rows of `q` in place, or through `q_rows`), each over one contiguous range of K/V rows read
  in place, causal (a segment over itself) or unmasked (rows below a shared segment over it); returns the
  output and each query's log-sum-exp, for the exact merge of cascade attention.

Kernels are compiled for CUDA, or run by Triton's CPU interpreter when `TRITON_INTERPRET=1` is set before this
package is imported; `triton_available(device)` says whether they can run on a device.
"""

from radix_core.kernels.capability import triton_available
from radix_core.kernels.row_gather import gather_rows, gather_rows_reference
from radix_core.kernels.segment_attention import (
    AttentionTiles,
    default_tiles,
    segment_attention,
    segment_attention_reference,
)

__all__ = [
    "AttentionTiles",
    "default_tiles",
    "gather_rows",
    "gather_rows_reference",
    "segment_attention",
    "segment_attention_reference",
    "triton_available",
]
