"""The radix index of a batch: which tokens are computed once, and what compact attention needs.

A token's hidden state at every layer depends only on its history, the (token id, position id) pairs from
the start of its sequence up to itself. Tokens with equal histories are one node of a prefix trie over the
batch; the `N` original tokens fold to `N' <= N` compact tokens (RadixMLP, arXiv 2601.15013).

Compact tokens are numbered in first-appearance order (trie creation order). Walking the sequences in order,
the tokens a sequence adds to the trie are therefore one contiguous block of compact indices, and a suffix of
its path: once a token is new, every later token of that sequence is new too (`cu_seqlens_q`). A sequence
that adds nothing (an exact duplicate, or a prefix of an earlier sequence) has an empty block. Compact
attention's plan over these rows, the trie's segments, is `radix_core.cascade`.

The trie itself is built by the `radix-mlp` package (the paper authors' exact Rust trie, x86-64 wheels) when
it is installed, and by `radix_core.trie_numpy` otherwise; both give identical results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radix_core import trie_numpy
from radix_core.tokens import TokenSequences

try:
    from radix_mlp import compute_fold_and_scatter as _rust_fold_and_scatter
except ImportError:  # non-x86-64 platforms: the exact numpy builder below takes over
    _rust_fold_and_scatter = None

_UINT32_MAX = np.iinfo(np.uint32).max
BACKENDS = ("auto", "rust", "numpy")


@dataclass(slots=True)
class RadixIndex:
    """Index maps between the original ragged batch (`N` tokens, `B` sequences) and compact space (`N'`).

    Arrays are uint32 numpy, as the trie builds them (cheap to ship between processes); the engine checks the
    ids against its vocabulary and moves them to its device once per batch.
    """

    compact_input_ids: np.ndarray  # (N',) token id of each compact token
    compact_position_ids: np.ndarray  # (N',) position id of each compact token
    fold_gather: np.ndarray  # (N',) first original index of each compact token: x_c = x[fold_gather]
    scatter: np.ndarray  # (N,) compact index of each original token: x = x_c[scatter]
    cu_seqlens: np.ndarray  # (B+1,) original sequence boundaries
    cu_seqlens_q: np.ndarray  # (B+1,) the compact rows each sequence adds, back to back in compact order

    @property
    def num_tokens(self) -> int:
        return int(self.scatter.shape[0])

    @property
    def num_compact(self) -> int:
        return int(self.fold_gather.shape[0])

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1

    @property
    def compression(self) -> float:
        """`N'/N`: the fraction of tokens that must be computed (1.0 = no sharing)."""
        return self.num_compact / self.num_tokens


def flatten_sequences(sequences: TokenSequences | Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """A batch of token-id lists, or `TokenSequences` -> (flat ids `(N,)`, `cu_seqlens` `(B+1,)`), both int64."""
    if len(sequences) == 0:
        raise ValueError("the batch is empty: give at least one sequence")
    packed = isinstance(sequences, TokenSequences)
    lengths = sequences.lengths if packed else np.fromiter((len(s) for s in sequences), dtype=np.int64,
                                                           count=len(sequences))
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise ValueError(f"sequence {int(empty[0])} is empty: every sequence needs at least one token")
    if packed:
        return sequences.ids.astype(np.int64), sequences.cu.astype(np.int64, copy=False)
    cu_seqlens = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu_seqlens[1:])
    input_ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences])
    return input_ids, cu_seqlens


def build_radix_index(input_ids, cu_seqlens, position_ids=None, *, backend: str = "auto") -> RadixIndex:
    """Build the radix index of a flat ragged batch.

    `input_ids` `(N,)` and `position_ids` `(N,)` (default `0..L_s-1` per sequence) and `cu_seqlens` `(B+1,)`
    may be lists, numpy arrays or torch tensors. `backend` picks the trie builder: "rust" (`radix-mlp`),
    "numpy" (`radix_core.trie_numpy`) or "auto" (rust when installed). Raises `ValueError` naming the problem
    for negative or too large ids, malformed `cu_seqlens`, length mismatches and empty sequences.
    """
    ids = _as_uint32(input_ids, "input_ids")
    cu = _as_uint32(cu_seqlens, "cu_seqlens")
    _check_cu_seqlens(cu, ids.shape[0])
    pos = sequence_positions(cu) if position_ids is None else _as_uint32(position_ids, "position_ids")
    if pos.shape[0] != ids.shape[0]:
        raise ValueError(f"position_ids has {pos.shape[0]} entries but input_ids has {ids.shape[0]}")
    compact_ids, compact_pos, scatter, fold_gather = _fold_and_scatter(ids, pos, cu, backend)
    return _with_added_blocks(compact_ids, compact_pos, scatter, fold_gather, cu)


def _fold_and_scatter(ids, pos, cu, backend):
    if backend not in BACKENDS:
        raise ValueError(f"unknown index backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "rust" and _rust_fold_and_scatter is None:
        raise ValueError("index backend 'rust' needs the radix-mlp package: pip install radix-mlp (x86-64 only)")
    if backend == "numpy" or _rust_fold_and_scatter is None:
        return trie_numpy.fold_and_scatter(ids, pos, cu)
    return _rust_fold_and_scatter(ids, pos, cu, None)


def _with_added_blocks(compact_ids, compact_pos, scatter, fold_gather, cu) -> RadixIndex:
    """Derive the added blocks: fold_gather is increasing (first-appearance order), so the compact tokens
    first seen before sequence s starts are exactly the first `searchsorted(fold_gather, cu[s])`."""
    return RadixIndex(
        compact_input_ids=compact_ids,
        compact_position_ids=compact_pos,
        fold_gather=fold_gather,
        scatter=scatter,
        cu_seqlens=cu,
        cu_seqlens_q=np.searchsorted(fold_gather, cu).astype(np.uint32),  # (B+1,); cu[-1] = N maps to N'
    )


def _as_uint32(values, name: str) -> np.ndarray:
    """Any 1-D integer array-like -> contiguous uint32, rejecting negative and over-large values."""
    if type(values) is np.ndarray and values.dtype == np.uint32 and values.ndim == 1:
        return np.ascontiguousarray(values)
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (flat, ragged batch), got shape {tuple(arr.shape)}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint32)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.min() < 0:
        where = int(np.argmax(arr < 0))
        raise ValueError(f"{name} must be non-negative: {name}[{where}] = {int(arr[where])}")
    if arr.max() > _UINT32_MAX:
        raise ValueError(f"{name} values must be below 2**32, got {int(arr.max())}")
    return np.ascontiguousarray(arr, dtype=np.uint32)


def _check_cu_seqlens(cu: np.ndarray, num_tokens: int) -> None:
    if cu.shape[0] < 2:
        raise ValueError(f"cu_seqlens needs at least 2 entries ([0, N] for one sequence), got {cu.shape[0]}")
    if cu[0] == 0 and cu[-1] == num_tokens and (cu[1:] > cu[:-1]).all():
        return
    steps = np.diff(cu.astype(np.int64))  # (B,) sequence lengths
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu[0])}")
    if (steps < 0).any():
        where = int(np.argmax(steps < 0))
        raise ValueError(f"cu_seqlens must be non-decreasing: cu_seqlens[{where + 1}] < cu_seqlens[{where}]")
    if (steps == 0).any():
        raise ValueError(f"sequence {int(np.argmax(steps == 0))} is empty: every sequence needs at least one token")
    raise ValueError(f"cu_seqlens must end at the number of tokens {num_tokens}, got {int(cu[-1])}")


def sequence_positions(cu: np.ndarray) -> np.ndarray:
    """(N,) positions 0..L_s-1 within each sequence, from `cu_seqlens` `(B+1,)`."""
    starts = np.repeat(cu[:-1], np.diff(cu))  # (N,) start of each token's sequence
    return np.arange(cu[-1], dtype=np.uint32) - starts
