"""Ragged attention blocks grouped into a few padded batches, so a dense kernel runs once per group, not per block.

The CPU attention kernel (`_scaled_dot_product_flash_attention_for_cpu`) takes a dense batch `(G, H, L, D)`. A
batch's blocks are ragged: the trie of a 1,000-document rerank has ~300 segments with descendants (one prefix
block each) and ~100 distinct segment lengths, so one call per block, or per exact length, is hundreds of calls a
layer, each paying the dispatch and the kernel's buffers for little work (4.4 s of a 6.6 s request at hidden 128).
Here blocks are padded to **bucket lengths**, `BUCKETS_PER_OCTAVE` per doubling (4, 5, ..., 16, 18, 20, ..., 32,
36, ...: at most 1/8 longer), and blocks of one bucket run as one call: a layer makes at most one call per bucket
present, whatever the number of blocks (a 1,000-document rerank in `full`, 1,368 segments and 369 prefix blocks:
37 causal and 26 prefix calls a layer, for 8% and 16% more work than unpadded).

* **Causal blocks** pad at their end. A real query `i` sees keys `0..i` only, all real, so the causal kernel's
  result for it is the block's own; padded query rows (copies of the block's last row) are computed and dropped.
* **Prefix blocks** (unmasked) are cut into chunks of at most `PREFIX_CHUNK` queries (queries are independent, so
  any cut is exact), chunks group by their key bucket and pad their queries to the group's longest chunk; padded
  keys get `-inf` in an additive mask, passed only when a group holds padded keys.

Each group reads its rows with one `index_select` per tensor (or a slice when its blocks are back to back and
unpadded); the groups' outputs are concatenated in group order and one `index_select` (`unpad`) puts every real
row back in the caller's order. Everything here is built once per batch, in numpy, and used by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radix_core.cascade import concat_ranges

BUCKETS_PER_OCTAVE = 8  # padding at most 1 / 8 of a length: +8% causal, +16% prefix work on a 1,000-document rerank
MIN_BUCKET = 4  # shorter blocks pad to 4: their work is the kernel's fixed cost either way
PREFIX_CHUNK = 64  # queries per prefix-block chunk: a block pads at most 63 query rows


@dataclass(frozen=True)
class PaddedGroup:
    """`count` blocks of `q_len` query rows and `k_len` key rows each, run as one dense call."""

    count: int
    q_len: int
    k_len: int
    q_rows: torch.Tensor | slice  # (count * q_len,) rows of the query tensor, block after block
    k_rows: torch.Tensor | slice  # (count * k_len,) rows of the key/value tensors, block after block
    key_mask: torch.Tensor | None  # (count, 1, 1, k_len) bool, False on padded keys; None when there are none

    def gather(self, t: torch.Tensor, rows: torch.Tensor | slice, length: int) -> torch.Tensor:
        """`t` (rows, H, D) -> (count, H, length, D), the group's blocks as a dense batch."""
        picked = t[rows] if isinstance(rows, slice) else t.index_select(0, rows)  # (count * length, H, D)
        return picked.view(self.count, length, *t.shape[1:]).transpose(1, 2)

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The key mask as the kernel takes it: 0 on real keys, -inf on padded ones, in the queries' dtype."""
        if self.key_mask is None:
            return None
        return torch.zeros(self.key_mask.shape, dtype=dtype, device=self.key_mask.device).masked_fill_(
            ~self.key_mask, float("-inf"))


@dataclass(frozen=True)
class PaddedBlocks:
    """A set of blocks as padded groups, and where each real output row lies in the groups' outputs."""

    groups: list[PaddedGroup]
    unpad: torch.Tensor | None  # (rows,) int64 position of each output row in the concatenated group outputs


def bucket_lengths(lengths: np.ndarray) -> np.ndarray:
    """(n,) int64: each length rounded up to its bucket, `BUCKETS_PER_OCTAVE` per doubling, at least `MIN_BUCKET`."""
    n = np.maximum(lengths.astype(np.int64), MIN_BUCKET)
    octave = np.floor(np.log2(n - 1)).astype(np.int64)  # 2**octave < n <= 2**(octave + 1)
    step = np.left_shift(1, np.maximum(octave - int(np.log2(BUCKETS_PER_OCTAVE)), 0))
    return -(-n // step) * step


def padded_causal(bounds: np.ndarray, device: torch.device) -> PaddedBlocks:
    """Causal blocks `bounds[j]:bounds[j+1]` (every row in exactly one block) padded at their ends; `unpad` in row
    order."""
    starts, lengths = bounds[:-1].astype(np.int64), np.diff(bounds).astype(np.int64)  # (J,) each
    return _padded(starts, lengths, starts, lengths, bucket_lengths(lengths), device, causal=True)


def padded_prefix(q_rows: np.ndarray, cu: np.ndarray, key_start: np.ndarray, key_end: np.ndarray,
                  device: torch.device) -> PaddedBlocks:
    """Prefix blocks (queries `q_rows[cu[j]:cu[j+1]]` over keys `key_start[j]:key_end[j]`) in chunks of
    `PREFIX_CHUNK` queries, grouped by key bucket; `unpad` in the order of `q_rows`."""
    q_lengths = np.diff(cu).astype(np.int64)  # (J,)
    chunks = -(-q_lengths // PREFIX_CHUNK)  # (J,)
    block = np.repeat(np.arange(q_lengths.shape[0]), chunks)  # (C,) block of each chunk
    first = np.cumsum(chunks) - chunks  # (J,) first chunk of each block
    offset = (np.arange(block.shape[0]) - first[block]) * PREFIX_CHUNK  # (C,) chunk start within its block
    chunk_len = np.minimum(q_lengths[block] - offset, PREFIX_CHUNK)  # (C,)
    k_start = key_start.astype(np.int64)[block]
    k_len = (key_end.astype(np.int64) - key_start.astype(np.int64))[block]
    return _padded(cu[:-1].astype(np.int64)[block] + offset, chunk_len, k_start, k_len, bucket_lengths(k_len),
                   device, causal=False, q_index=q_rows.astype(np.int64))


def _padded(q_start, q_len, k_start, k_len, k_pad, device, causal: bool, q_index=None) -> PaddedBlocks:
    """Blocks `j` of queries `q_start[j] + (0..q_len[j])` and keys `k_start[j] + (0..k_len[j])`, grouped by `k_pad`
    (their padded key length). Causal blocks pad their queries to it too; prefix chunks to the group's longest.
    The blocks' queries, in block order, are the output rows in order. Query positions go through `q_index` when
    given (prefix queries are rows picked from anywhere)."""
    order = np.argsort(k_pad, kind="stable")  # (J,) blocks grouped by bucket, in block order within one
    sizes, first = np.unique(k_pad[order], return_index=True)
    counts = np.diff(np.append(first, order.shape[0]))  # (B,) blocks per group
    groups, slot, base = [], np.empty(order.shape[0], dtype=np.int64), 0  # slot: each block's first output row
    for lk, start, count in zip(sizes.tolist(), first.tolist(), counts.tolist()):
        members = order[start:start + count]  # (G,)
        lq = lk if causal else int(q_len[members].max())
        slot[members] = base + np.arange(count) * lq
        base += count * lq
        q_pos = _padded_rows(q_start[members], q_len[members], lq)  # (G * lq,)
        keys = _padded_rows(k_start[members], k_len[members], lk)  # (G * lk,)
        mask = None if (k_len[members] == lk).all() else np.arange(lk) < k_len[members][:, None, None, None]
        groups.append(PaddedGroup(count, lq, lk, _as_index(q_pos if q_index is None else q_index[q_pos], device),
                                  _as_index(keys, device), None if mask is None else torch.from_numpy(mask).to(device)))
    unpad = concat_ranges(slot, q_len)  # (rows,) each block's real query rows, block after block
    identity = unpad.shape[0] == base and (unpad == np.arange(base)).all()
    return PaddedBlocks(groups, None if identity else torch.from_numpy(unpad).to(device))


def _padded_rows(starts: np.ndarray, lengths: np.ndarray, padded: int) -> np.ndarray:
    """(G * padded,) `starts[g] + i` for `i < padded`, positions past a block's end repeating its last row."""
    return (starts[:, None] + np.minimum(np.arange(padded), lengths[:, None] - 1)).reshape(-1)


def _as_index(rows: np.ndarray, device: torch.device) -> torch.Tensor | slice:
    """Rows as a slice when they are consecutive (read in place), else an int64 index tensor."""
    if rows.shape[0] and rows[-1] - rows[0] == rows.shape[0] - 1 and (np.diff(rows) == 1).all():
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return torch.from_numpy(np.ascontiguousarray(rows)).to(device)
