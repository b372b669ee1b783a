"""An exact radix trie over a ragged batch in vectorized numpy: the fallback where `radix-mlp` has no wheel.

The trie is built one depth at a time over the sequences that still share their path with another one. At
depth `d`, a token's node is keyed by (its parent's node, its token id, its position id); `np.unique` over
those keys is exact (no hashing), so different histories can never merge. A sequence whose node at depth `d`
is its own drops out: every later token of it is new, which is its default label. The loop therefore runs
over shared tokens only and costs nothing on a batch without sharing.

Each token is labelled by the first original index of its node; compact order is the order of those labels,
which is first-appearance order, identical to `radix-mlp`'s trie creation order.
"""

from __future__ import annotations

import numpy as np


def fold_and_scatter(ids: np.ndarray, pos: np.ndarray, cu: np.ndarray):
    """uint32 `(N,)` ids and positions, `(B+1,)` cu_seqlens -> (compact ids, compact positions, scatter,
    fold_gather), the same four arrays `radix_mlp.compute_fold_and_scatter` returns."""
    label = _first_occurrence_labels(ids, pos, cu.astype(np.int64))  # (N,) first original index of the node
    is_first = label == np.arange(label.shape[0])  # (N,)
    fold_gather = np.flatnonzero(is_first).astype(np.uint32)  # (N',)
    rank = np.cumsum(is_first, dtype=np.int64) - 1  # (N,) compact index of first occurrences
    scatter = rank[label].astype(np.uint32)  # (N,)
    return ids[fold_gather], pos[fold_gather], scatter, fold_gather


def _first_occurrence_labels(ids: np.ndarray, pos: np.ndarray, cu: np.ndarray) -> np.ndarray:
    packed = (ids.astype(np.int64) << 32) | pos.astype(np.int64)  # (N,) exact (token, position) key
    label = np.arange(ids.shape[0], dtype=np.int64)
    lengths = np.diff(cu)
    active = np.arange(lengths.shape[0])  # sequences whose path so far is shared with another sequence
    depth = 0
    while True:
        active = active[lengths[active] > depth]
        if active.shape[0] < 2:
            return label
        idx = cu[active] + depth  # (A,) original index of each active sequence's token at this depth
        _, pair = np.unique(packed[idx], return_inverse=True)  # (A,) dense id of (token, position)
        parent = label[idx - 1] + 1 if depth else np.zeros_like(idx)  # (A,) parent node, 0 = root
        key = parent * (int(pair.max()) + 1) + pair  # (A,) exact: parent < N + 1, pair < A
        _, first, node, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        label[idx] = idx[first][node]  # active sequences are in order, so `first` is the earliest token
        active = active[counts[node] > 1]
        depth += 1
