"""Shared-prefix (cascade) attention's plan: the radix tree's segments, and which queries read which segment.

In compact space every row is computed once, so every row is a query once. Its keys are its path: the rows of
its history, which the trie shares between the sequences that have that history. Cascade attention reads each
shared part of a path once for all the queries below it, instead of gathering every sequence's whole path:

* A **segment** is a maximal chain of compact rows in which each row's parent (the row of the previous token) is
  the row before it. Rows are numbered in first-appearance order, so a chain one sequence creates is contiguous;
  a segment starts at a root, after a branching row (one with two or more children), or at a row whose parent
  is not the row before it. Every path is therefore a chain of whole segments: its ancestors, then the segment
  holding its row.
* **Self blocks**: each segment's rows attend causally to the segment's own rows (a square causal block).
* **Prefix blocks**: each segment with descendants is one block whose keys are that segment's rows (contiguous,
  read in place) and whose queries are all rows of all its descendant segments, unmasked: they all come after it.

A row's attention is then the log-sum-exp merge of its self block and of one prefix block per ancestor segment,
exactly the softmax over its whole path. The merge touches each (row, ancestor segment) pair once, which is at
most the number of (query, key) pairs attention computes anyway. Built in numpy from the `RadixIndex`, where
the index is built (the serving layer's index builder process), and shipped with the prepared batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radix_core.index import RadixIndex


@dataclass(frozen=True, slots=True)
class CascadePlan:
    """`full` mode's attention as causal self blocks over segments plus unmasked prefix blocks (module docstring)."""

    segments: np.ndarray  # (S+1,) int32 segment boundaries in compact rows, covering 0..N'
    prefix_rows: np.ndarray  # (P,) int64 query rows of the prefix blocks, block after block
    prefix_cu: np.ndarray  # (I+1,) int32 boundaries of the prefix blocks in prefix_rows
    prefix_key_start: np.ndarray  # (I,) int32 first key row of each prefix block: its shared segment's start
    prefix_key_end: np.ndarray  # (I,) int32 and that segment's end

    @property
    def has_prefix(self) -> bool:
        """False when no segment has a descendant (no sharing): the self blocks are the whole attention."""
        return self.prefix_cu.shape[0] > 1


def cascade_plan(index: RadixIndex) -> CascadePlan:
    """The segments of `index`'s trie and the prefix blocks over them."""
    return forest_plan(compact_parents(index))


def forest_plan(parent: np.ndarray) -> CascadePlan:
    """The segments and prefix blocks of the forest of rows whose parents are `parent` (R,) (-1 for a root), rows
    numbered in first-appearance order (each parent before its children). The rows of a batch that the prefix
    cache leaves to compute are such a forest: a row whose parent is cached is a root here."""
    num_rows = parent.shape[0]
    children = np.bincount(parent[parent >= 0], minlength=num_rows)  # (N',)
    rows = np.arange(num_rows)
    starts = parent != rows - 1  # roots and rows not right after their parent
    starts[0] = True
    starts[1:] |= children[:-1] > 1  # the first row after a branching row
    seg_start = np.flatnonzero(starts)  # (S,)
    seg_end = np.append(seg_start[1:], num_rows)  # (S,)
    seg_of_row = np.cumsum(starts) - 1  # (N',)
    first_parent = parent[seg_start]  # (S,)
    seg_parent = np.where(first_parent >= 0, seg_of_row[np.maximum(first_parent, 0)], -1)  # (S,)

    ancestor, descendant = _ancestor_pairs(seg_parent)  # (A,) each, sorted by ancestor then descendant
    lengths = (seg_end - seg_start)[descendant]  # (A,) query rows each pair contributes
    prefix_rows = concat_ranges(seg_start[descendant], lengths)  # (P,)
    blocks, first = np.unique(ancestor, return_index=True)  # (I,) segments with descendants
    prefix_cu = np.zeros(blocks.shape[0] + 1, dtype=np.int64)
    if blocks.size:
        np.cumsum(np.add.reduceat(lengths, first), out=prefix_cu[1:])
    segments = np.append(seg_start, num_rows)
    return CascadePlan(segments.astype(np.int32), prefix_rows, prefix_cu.astype(np.int32),
                       seg_start[blocks].astype(np.int32), seg_end[blocks].astype(np.int32))


def compact_parents(index: RadixIndex) -> np.ndarray:
    """(N',) int64 compact row of each compact row's previous token, -1 for a sequence's first token."""
    scatter = index.scatter.astype(np.int64)  # (N,)
    parent = np.full(index.num_compact, -1, dtype=np.int64)
    inner = np.ones(scatter.shape[0], dtype=bool)
    inner[index.cu_seqlens[:-1].astype(np.int64)] = False  # (N,) tokens with a previous token
    where = np.flatnonzero(inner)
    parent[scatter[where]] = scatter[where - 1]  # equal histories share one row, so duplicates agree
    return parent


def _ancestor_pairs(seg_parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (ancestor segment, descendant segment) pair, ordered by ancestor then descendant; one step up
    the tree per iteration, so as many iterations as the deepest segment has ancestors."""
    descendant = np.arange(seg_parent.shape[0])
    ancestor = seg_parent
    found_a, found_d = [], []
    while True:
        keep = ancestor >= 0
        if not keep.any():
            break
        descendant, ancestor = descendant[keep], ancestor[keep]
        found_a.append(ancestor)
        found_d.append(descendant)
        ancestor = seg_parent[ancestor]
    if not found_a:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ancestor, descendant = np.concatenate(found_a), np.concatenate(found_d)
    order = np.lexsort((descendant, ancestor))
    return ancestor[order], descendant[order]


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(sum(lengths),) int64: `starts[i] .. starts[i] + lengths[i] - 1`, range after range."""
    offsets = np.cumsum(lengths) - lengths  # (A,) where each range begins in the output
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - offsets, lengths)
