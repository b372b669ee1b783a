"""`BatchView`: what one job reads of a batch's forward, its own slice of sequences (`Task.finish`); the engine
makes one per job (`radix_core.finish`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radix_core.forward_result import ForwardResult
from radix_core.tasks.usage import Usage


@dataclass(frozen=True)
class BatchView:
    """A `ForwardResult` restricted to sequences `[first, first + count)`: what one job reads."""

    result: ForwardResult
    first: int
    count: int
    head: np.ndarray | None = None  # the answer to the job's HeadQuery: (P, C) outputs or (P,) log-probabilities

    @property
    def lengths(self) -> np.ndarray:
        """(count,) int64 lengths of the slice's sequences."""
        return np.diff(self._cu_seqlens)

    def rows(self, sequences: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """(P,) int64 computed rows of the local `sequences` at `positions` (negative from the end)."""
        return self.result.rows(np.asarray(sequences) + self.first, positions)

    def last_hidden(self) -> torch.Tensor:
        """(count, hidden) float32 state of each sequence's last token, on the device."""
        return self.result.hidden_at(self.rows(np.arange(self.count), np.full(self.count, -1)))

    def mean_hidden(self) -> torch.Tensor:
        """(count, hidden) float32 mean state over each sequence's tokens, on the device."""
        start, end = self._cu_seqlens[[0, -1]].tolist()
        per_token = self.result.hidden_at(self.result.row_of_token[start:end])  # (n, hidden)
        owner = torch.from_numpy(np.repeat(np.arange(self.count), self.lengths)).to(per_token.device)  # (n,)
        sums = torch.zeros(self.count, per_token.shape[1], device=per_token.device).index_add_(0, owner, per_token)
        return sums / torch.from_numpy(self.lengths).to(sums)[:, None]

    @property
    def usage(self) -> Usage:
        """The slice's tokens, and the computed rows its sequences created first. Rows are numbered in the order
        sequences first create them (`BatchPlan.cu_rows`), so over the slices of a batch these sum to
        `ForwardResult.num_computed`; a prefix shared with an earlier slice counts there. Cached: the tokens of
        its sequences read from the prefix cache."""
        cu_rows = self.result.plan.cu_rows[[self.first, self.first + self.count]]
        cached = self.result.cached_lengths[self.first:self.first + self.count]
        return Usage(int(self.lengths.sum()), int(cu_rows[1] - cu_rows[0]), int(cached.sum()))

    @property
    def _cu_seqlens(self) -> np.ndarray:
        return self.result.prepared.cu_seqlens[self.first:self.first + self.count + 1]  # (count+1,)
