"""`TokenSequences`: a list of token-id sequences as two flat arrays, the form token ids travel in.

A request's sequences cross processes (ingress -> engine replica -> index builder) as one int32 array of ids and
one offsets array, not as Python lists of ints: pickling 10k tokens is two buffers instead of 10k objects, and the
batch that concatenates several requests is one `np.concatenate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np


@dataclass(frozen=True)
class TokenSequences:
    """Sequence `s` is `ids[cu[s]:cu[s + 1]]`."""

    ids: np.ndarray  # (N,) int32 token ids
    cu: np.ndarray  # (B+1,) int64 sequence boundaries, cu[0] == 0

    @classmethod
    def from_lists(cls, sequences: Sequence[Sequence[int]]) -> TokenSequences:
        """The lists read in C (`map`, `chain`), not token by token in Python: 190k ids in 2 ms, not 23 ms."""
        lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))  # (B,)
        cu = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=cu[1:])
        ids = np.fromiter(chain.from_iterable(sequences), dtype=np.int32, count=int(cu[-1]))
        return cls(ids, cu)

    @classmethod
    def framed(cls, prefix: Sequence[int], middles: Sequence[Sequence[int]], suffix: Sequence[int]) -> TokenSequences:
        """Sequence i is `prefix + middles[i] + suffix`, written by array indexing instead of one list per
        sequence."""
        inner = cls.from_lists(middles)
        cu = inner.cu + np.arange(len(inner) + 1) * (len(prefix) + len(suffix))  # (B+1,)
        heads = cu[:-1, None] + np.arange(len(prefix))  # (B, P) positions of the prefix
        tails = cu[1:, None] - len(suffix) + np.arange(len(suffix))  # (B, S) positions of the suffix
        ids = np.empty(int(cu[-1]), dtype=np.int32)  # (N,)
        own = np.ones(ids.shape[0], dtype=bool)  # (N,) positions of the middles
        own[heads] = own[tails] = False
        ids[heads], ids[tails], ids[own] = prefix, suffix, inner.ids
        return cls(ids, cu)

    @classmethod
    def concat(cls, parts: Sequence[TokenSequences]) -> TokenSequences:
        """The sequences of `parts`, in order."""
        offsets = np.cumsum([0] + [p.num_tokens for p in parts[:-1]])  # (P,)
        cu = np.concatenate([[0]] + [p.cu[1:] + off for p, off in zip(parts, offsets)]).astype(np.int64)
        ids = np.concatenate([p.ids for p in parts]) if parts else np.zeros(0, np.int32)
        return cls(ids, cu)

    def __len__(self) -> int:
        return int(self.cu.shape[0]) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.cu[-1])

    @property
    def lengths(self) -> np.ndarray:
        """(B,) int64."""
        return np.diff(self.cu)

    def select(self, start: int, end: int) -> TokenSequences:
        """Sequences `start .. end - 1` (a view of the ids)."""
        cu = self.cu[start:end + 1]
        return TokenSequences(self.ids[cu[0]:cu[-1]], cu - cu[0])

    def tolists(self) -> list[list[int]]:
        return [ids.tolist() for ids in np.split(self.ids, self.cu[1:-1])]
