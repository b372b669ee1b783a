"""Ragged attention blocks grouped into a few padded batches, so a dense kernel runs once per group, not per block.

The CPU attention kernel (`_scaled_dot_product_flash_attention_for_cpu`) takes a dense batch `(G, H, L, D)`. A
batch's blocks are ragged: the trie of a 1,000-document rerank has ~300 segments with descendants (one prefix
block each) and ~100 distinct segment lengths, so one call per block, or per exact length, is hundreds of calls a
layer, each paying the dispatch and the kernel's buffers for little work (4.4 s of a 6.6 s request at hidden 128).
Here blocks are padded to **bucket lengths**, multiples of 16 up to 128 and `BUCKETS_PER_OCTAVE` per doubling
above (16, 32, ..., 128, 144, 160, ..., 256, 288, ...), and blocks of one bucket run as one call: a layer makes at
most one call per bucket present, whatever the number of blocks. Multiples of 16 cost the kernel less than the
unpadded lengths around them (one thread, 4 heads of 16: 500 x 64 queries over 16 keys 8.8 ms, over 8 keys 17.6
ms, over 60 keys 25.5 ms, over 64 keys 17.6 ms; causal blocks of 64 rows 18.9 ms, of 60 rows 23.4 ms; the same
at 64 dimensions).

* **Causal blocks** pad at their end. A real query `i` sees keys `0..i` only, all real, so the causal kernel's
  result for it is the block's own without a mask; padded query rows (copies of the block's last row) are computed
  and dropped. (A key mask there would cost the kernel 6% of its time for nothing: 40.2 against 37.8 ms a layer
  of a 1,000-document `tiny` rerank.)
* **Prefix blocks** (unmasked) are cut into chunks of at most `PREFIX_CHUNK` queries (queries are independent, so
  any cut is exact), chunks group by their key bucket and pad their queries to the group's longest chunk; padded
  keys get `-inf` in an additive mask, passed only when a group holds padded keys. A block of at least
  `SOLO_BLOCK` queries over more than `EXACT_KEYS` keys, or of at least `SOLO_SHORT_BLOCK` over fewer (a rerank's
  shared prompt over its ~75,000 document rows, the cached template they all read, a cached few-shot prompt read by
  its request's ~200 rows) runs on its own instead: calls of `SOLO_CHUNK` queries,
  none padded, the queries a view of their rows where they are consecutive (else gathered once), the keys the
  block's own rows in place at their exact length (above `EXACT_KEYS`; fewer are padded to their bucket, which the
  kernel runs faster), each output merged on its rows. Chunks would copy the keys once per chunk and pad queries
  and keys: a cached 1,036-token prompt read by 204 queries took 6.1 ms a layer in four padded chunks of 64 against
  3.5 ms on its own (hidden 512, 8 heads of 64, 4 K/V heads; one thread of an Intel Xeon, torch 2.13); on a
  1,000-document `tiny` rerank the cached template's pass took 66 -> 30 ms a layer read in place. Nor one call for
  the whole of a huge block: in 4,096-query calls the template's pass took 48 ms instead of 75 per 1,000-document
  `tiny` rerank (both layers; calls of 2,048 to 16,384 queries alike), 203 instead of 329 ms per 300-document
  `bench` rerank (8 layers). A block over few keys is cheap to chunk (a chunk copies a few keys and pads at most 63
  queries) and dear as a call of its own: a 1,000-document rerank's trie has ~145 blocks of 128-511 queries over
  16-48 keys (a word shared by a few hundred documents), which as calls of their own took a layer's attention to
  167 ms against 149 ms chunked (`tiny`; 300 against 279 ms at hidden 128, 31 against 29 ms on 200 documents; one
  layer's q/k/v, both threads of an Intel Xeon, median of 8, torch 2.13).

Each group reads its rows with one `index_select` per tensor (or a slice when its blocks are back to back and
unpadded), and says where each of its output rows goes (`out_rows`): causal outputs are copied to their rows, a
padded query's to a scratch row past the end; prefix outputs are merged straight from the group's result, a
padded query (a copy of a real one) with its log-sum-exp set to -inf, so it weighs nothing. No group's output is
concatenated or gathered again. Everything here is built once per batch, in numpy, and used by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radix_core.cascade import concat_ranges

BUCKETS_PER_OCTAVE = 8  # above 128, padding at most 1 / 8 of a length
ALIGN = 16  # every bucket a multiple of 16: the CPU kernel runs 16 keys faster than 8 or 12, 64 than 56 or 60
PREFIX_CHUNK = 64  # queries per prefix-block chunk: a block pads at most 63 query rows
SOLO_BLOCK = 128  # a prefix block of at least this many queries over more than EXACT_KEYS keys runs on its own
SOLO_SHORT_BLOCK = 512  # ... and one of at least this many over fewer keys; smaller ones are chunked
SOLO_CHUNK = 4096  # queries per call of such a block
EXACT_KEYS = ALIGN * BUCKETS_PER_OCTAVE  # a solo block of more keys reads them at their exact length, in place
SHORT_PREFIX = ALIGN  # a prefix block of at most this many keys is absorbed into its descendants' causal blocks
ABSORB_LIMIT = ALIGN  # the most keys a causal block takes in from its ancestors


@dataclass(frozen=True)
class PaddedGroup:
    """`count` blocks of `q_len` query rows and `k_len` key rows each, run as one dense call."""

    count: int
    q_len: int
    k_len: int
    q_rows: torch.Tensor | slice  # (count * q_len,) rows of the query tensor, block after block
    k_rows: torch.Tensor | slice  # (count * k_len,) rows of the key/value tensors, block after block
    key_mask: torch.Tensor | None  # (count, 1, 1, k_len) bool, False on padded keys; None when there are none
    # or the group is causal (no real query sees a padded key)
    out_rows: torch.Tensor | slice  # (count * q_len,) int64 output row of each query; causal padding: the scratch
    # row; a slice for a solo prefix block on consecutive rows (`_solo_block`)
    padding: torch.Tensor | None  # (count * q_len,) bool, True on padded queries; None when there are none

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


def bucket_lengths(lengths: np.ndarray) -> np.ndarray:
    """(n,) int64: each length rounded up to a multiple of `ALIGN`, and above `ALIGN * BUCKETS_PER_OCTAVE` to one of
    `BUCKETS_PER_OCTAVE` buckets per doubling."""
    n = np.maximum(lengths.astype(np.int64), 2)
    octave = np.floor(np.log2(n - 1)).astype(np.int64)  # 2**octave < n <= 2**(octave + 1)
    step = np.maximum(np.left_shift(1, np.maximum(octave - int(np.log2(BUCKETS_PER_OCTAVE)), 0)), ALIGN)
    return -(-n // step) * step


@dataclass(frozen=True)
class PaddedPlan:
    """A batch's own blocks as padded groups: causal blocks (with the short ancestors they absorbed) and the prefix
    blocks left."""

    causal: list[PaddedGroup]
    prefix: list[PaddedGroup]


def padded_cascade(bounds: np.ndarray, prefix: tuple[np.ndarray, ...] | None, device: torch.device) -> PaddedPlan:
    """Causal blocks `bounds[j]:bounds[j+1]` and prefix blocks `prefix` = (q_rows, cu, key_start, key_end) as padded
    groups. A prefix block of at most `SHORT_PREFIX` keys is absorbed into its descendants' causal blocks, nearest
    ancestor first while a segment takes in at most `ABSORB_LIMIT` keys: the descendant's block reads those keys
    first (its own queries see all of them, as they come before it on its path) and their queries' outputs go to
    the scratch row. Exact: a row's softmax is still over its whole path, split differently."""
    starts, lengths = bounds[:-1].astype(np.int64), np.diff(bounds).astype(np.int64)  # (S,) each
    if prefix is None:
        return PaddedPlan(_padded(None, starts, lengths, None, starts, lengths, device, scratch=int(bounds[-1])), [])
    q_rows, cu, key_start, key_end = (a.astype(np.int64) for a in prefix)
    pair_block, pair_seg, pair_len, absorbed = _pairs(starts, q_rows, cu, key_start, key_end)
    # causal blocks: each segment's absorbed ancestors' rows, then its own
    seg = np.concatenate([pair_seg[absorbed], np.arange(starts.shape[0])])
    range_len = np.concatenate([pair_len[absorbed], lengths])
    order = np.lexsort((np.arange(seg.shape[0]) >= absorbed.sum(), seg))  # by segment, ancestors first
    range_start = np.concatenate([key_start[pair_block[absorbed]], starts])
    flat = concat_ranges(range_start[order], range_len[order])  # rows of every block, block after block
    block_len = np.bincount(seg, weights=range_len).astype(np.int64)  # (S,)
    skip = np.bincount(pair_seg[absorbed], weights=pair_len[absorbed], minlength=starts.shape[0]).astype(np.int64)
    offsets = np.cumsum(block_len) - block_len
    causal = _padded(flat, offsets, block_len, flat, offsets, block_len, device, scratch=int(bounds[-1]), skip=skip)
    # prefix blocks left: each with the descendants that did not absorb it
    kept = ~absorbed
    if not kept.any():
        return PaddedPlan(causal, [])
    blocks = np.unique(pair_block[kept])
    kept_rows = np.bincount(pair_block[kept], weights=lengths[pair_seg[kept]])[blocks].astype(np.int64)
    kept_cu = np.concatenate([[0], np.cumsum(kept_rows)])
    kept_q = concat_ranges(starts[pair_seg[kept]], lengths[pair_seg[kept]])
    return PaddedPlan(causal, padded_prefix(kept_q, kept_cu, key_start[blocks], key_end[blocks], device))


def merged_rows(bounds: np.ndarray, q_rows: np.ndarray, cu: np.ndarray, key_start: np.ndarray,
                key_end: np.ndarray) -> int:
    """Prefix-block query rows the torch backend still merges after `padded_cascade` absorbs the short blocks:
    the `merged` work of the cost model (`radix_core.mode_cost`)."""
    starts, lengths = bounds[:-1].astype(np.int64), np.diff(bounds).astype(np.int64)
    _, pair_seg, _, absorbed = _pairs(starts, *(a.astype(np.int64) for a in (q_rows, cu, key_start, key_end)))
    return int(lengths[pair_seg[~absorbed]].sum())


def _pairs(starts, q_rows, cu, key_start, key_end) -> tuple[np.ndarray, ...]:
    """(A,) each: the (prefix block, descendant segment) pairs (a block's queries are its descendants' rows, whole
    segment after segment; segments start at `starts`), the ancestor's key count, and whether it is absorbed."""
    segment = np.searchsorted(starts, q_rows, side="right") - 1  # (P,)
    first = np.flatnonzero(q_rows == starts[segment])  # (A,) where each descendant segment begins
    pair_block = np.searchsorted(cu, first, side="right") - 1  # (A,)
    pair_seg = segment[first]  # (A,)
    pair_len = (key_end - key_start)[pair_block]  # (A,) the ancestor's keys
    return pair_block, pair_seg, pair_len, _absorbed(pair_seg, pair_len, key_start[pair_block])


def _absorbed(pair_seg: np.ndarray, pair_len: np.ndarray, ancestor_start: np.ndarray) -> np.ndarray:
    """(A,) bool: which (ancestor block, descendant segment) pairs are absorbed. Rows are numbered parent before
    child, so along a path a nearer ancestor starts at a later row: per segment, short ancestors from the latest
    start back, while their keys add up to at most `ABSORB_LIMIT`."""
    short = np.flatnonzero(pair_len <= SHORT_PREFIX)
    short = short[np.lexsort((-ancestor_start[short], pair_seg[short]))]  # by segment, nearest ancestor first
    taken = np.cumsum(pair_len[short])
    new_segment = np.flatnonzero(np.diff(pair_seg[short], prepend=-1) != 0)
    before = np.repeat(taken[new_segment] - pair_len[short][new_segment], np.diff(np.append(new_segment, short.size)))
    absorbed = np.zeros(pair_seg.shape[0], dtype=bool)
    absorbed[short[taken - before <= ABSORB_LIMIT]] = True
    return absorbed


def padded_prefix(q_rows: np.ndarray, cu: np.ndarray, key_start: np.ndarray, key_end: np.ndarray,
                  device: torch.device) -> list[PaddedGroup]:
    """Prefix blocks (queries `q_rows[cu[j]:cu[j+1]]` over keys `key_start[j]:key_end[j]`) in chunks of at most
    `PREFIX_CHUNK` queries, grouped by key bucket; a padded query repeats its chunk's last. A block of at least
    `SOLO_BLOCK` queries over more than `EXACT_KEYS` keys, or `SOLO_SHORT_BLOCK` over fewer, runs on its own
    (`_solo_block`)."""
    q_rows, cu = q_rows.astype(np.int64), cu.astype(np.int64)
    q_lengths = np.diff(cu)  # (J,)
    solo = np.flatnonzero(q_lengths >= np.where(key_end - key_start > EXACT_KEYS, SOLO_BLOCK, SOLO_SHORT_BLOCK))
    groups = [group for j in solo.tolist() for group in
              _solo_block(q_rows[cu[j]:cu[j + 1]], int(key_start[j]), int(key_end[j]), device)]
    if solo.size:
        rest = np.setdiff1d(np.arange(q_lengths.shape[0]), solo)
        q_rows = q_rows[concat_ranges(cu[:-1][rest], q_lengths[rest])]
        cu, key_start, key_end = np.concatenate([[0], np.cumsum(q_lengths[rest])]), key_start[rest], key_end[rest]
    return groups + _chunked_prefix(q_rows, cu, key_start, key_end, device)


def _solo_block(rows: np.ndarray, key_start: int, key_end: int, device: torch.device) -> list[PaddedGroup]:
    """A prefix block whose queries are `rows` as dense calls of at most `SOLO_CHUNK` queries, none padded: each
    reads its queries in place where they are consecutive (a view, no copy), else gathers them, and the same keys:
    more than `EXACT_KEYS` in place at their length, fewer padded to their bucket."""
    k_len = key_end - key_start
    k_pad = k_len if k_len > EXACT_KEYS else int(bucket_lengths(np.array([k_len]))[0])
    keys = _as_index(key_start + np.minimum(np.arange(k_pad), k_len - 1), device)
    mask = None if k_pad == k_len else _tensor((np.arange(k_pad) < k_len)[None, None, None], device)
    groups = []
    for start in range(0, rows.shape[0], SOLO_CHUNK):
        queries = _as_index(rows[start:start + SOLO_CHUNK], device)
        q_len = min(SOLO_CHUNK, rows.shape[0] - start)
        groups.append(PaddedGroup(1, q_len, k_pad, queries, keys, mask, queries, None))
    return groups


def _chunked_prefix(q_rows: np.ndarray, cu: np.ndarray, key_start: np.ndarray, key_end: np.ndarray,
                    device: torch.device) -> list[PaddedGroup]:
    """`padded_prefix` for blocks in chunks."""
    q_lengths = np.diff(cu).astype(np.int64)  # (J,)
    chunks = -(-q_lengths // PREFIX_CHUNK)  # (J,)
    block = np.repeat(np.arange(q_lengths.shape[0]), chunks)  # (C,) block of each chunk
    first = np.cumsum(chunks) - chunks  # (J,) first chunk of each block
    offset = (np.arange(block.shape[0]) - first[block]) * PREFIX_CHUNK  # (C,) chunk start within its block
    chunk_len = np.minimum(q_lengths[block] - offset, PREFIX_CHUNK)  # (C,)
    k_start = key_start.astype(np.int64)[block]
    k_len = (key_end.astype(np.int64) - key_start.astype(np.int64))[block]
    return _padded(q_rows.astype(np.int64), cu[:-1].astype(np.int64)[block] + offset, chunk_len, None, k_start,
                   k_len, device)


def _padded(q_index, q_start, q_len, k_index, k_start, k_len, device, scratch: int | None = None,
            skip: np.ndarray | None = None) -> list[PaddedGroup]:
    """Blocks `j` of queries `q_index[q_start[j] + (0..q_len[j])]` and keys `k_index[k_start[j] + (0..k_len[j])]`
    (an index None: the identity), grouped by their key length's bucket. Causal blocks (`scratch` given) pad their
    queries to it too, need no key mask, and send the outputs of padded queries and of their first `skip[j]` queries
    to row `scratch`; prefix chunks pad to the group's longest, their padded keys masked. A padded query or key
    repeats its block's last."""
    k_pad = bucket_lengths(k_len)
    order = np.argsort(k_pad, kind="stable")  # (J,) blocks grouped by bucket, in block order within one
    sizes, first = np.unique(k_pad[order], return_index=True)
    counts = np.diff(np.append(first, order.shape[0]))  # (B,) blocks per group
    groups = []
    for lk, start, count in zip(sizes.tolist(), first.tolist(), counts.tolist()):
        members = order[start:start + count]  # (G,)
        lq = lk if scratch is not None else int(q_len[members].max())
        rows = _padded_rows(q_index, q_start[members], q_len[members], lq)  # (G * lq,) rows of the query tensor
        keys = _padded_rows(k_index, k_start[members], k_len[members], lk)  # (G * lk,)
        padding = (np.arange(lq) >= q_len[members][:, None]).reshape(-1)  # (G * lq,)
        out_rows = rows
        if scratch is not None:
            dropped = padding if skip is None else padding | (np.arange(lq) < skip[members][:, None]).reshape(-1)
            out_rows = np.where(dropped, scratch, rows)
        padded_keys = scratch is None and not (k_len[members] == lk).all()
        mask = np.arange(lk) < k_len[members][:, None, None, None] if padded_keys else None
        groups.append(PaddedGroup(count, lq, lk, _as_index(rows, device), _as_index(keys, device),
                                  _tensor(mask, device), _tensor(out_rows, device),
                                  _tensor(padding if padding.any() else None, device)))
    return groups


def _tensor(a: np.ndarray | None, device: torch.device) -> torch.Tensor | None:
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(device)


def _padded_rows(index: np.ndarray | None, starts: np.ndarray, lengths: np.ndarray, padded: int) -> np.ndarray:
    """(G * padded,) `index[starts[g] + i]` for `i < padded` (`index` None: the identity), positions past a block's
    end repeating its last."""
    positions = (starts[:, None] + np.minimum(np.arange(padded), lengths[:, None] - 1)).reshape(-1)
    return positions if index is None else index[positions]


def _as_index(rows: np.ndarray, device: torch.device) -> torch.Tensor | slice:
    """Rows as a slice when they are consecutive (read in place), else an int64 index tensor."""
    if rows.shape[0] and rows[-1] - rows[0] == rows.shape[0] - 1 and (np.diff(rows) == 1).all():
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return _tensor(rows, device)
