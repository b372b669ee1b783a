"""The rows of the prefix cache as one batch's forward sees them (`radix_core.prefix_cache` keeps them): what a
cached row holds (`RowShape`), the cached rows a batch reads in every layer (`CachedPrefix`), and the computed rows
whose K/V and final states it hands to the cache (`KeptRows`). Device tensors only; the tree is elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radix_core.architectures import Architecture


@dataclass(frozen=True)
class RowShape:
    """What one cached row holds: K and V of every layer, and the final hidden state, in `dtype` on `device`."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, arch: Architecture, dtype: torch.dtype, device: torch.device) -> RowShape:
        attn = arch.attention_layers[0]
        return cls(len(arch.layers), attn.k_proj.out_features // attn.head_dim, attn.head_dim, arch.hidden_size,
                   dtype, device)

    @property
    def bytes(self) -> int:
        """Bytes of one row: 2 x 28 x 8 x 128 + 1024 values, 116,736 bytes in bfloat16, for Qwen3-0.6B."""
        width = 2 * self.layers * self.kv_heads * self.head_dim + self.hidden
        return width * torch.empty(0, dtype=self.dtype).element_size()

    def kv(self, rows: int) -> torch.Tensor:
        return torch.empty((self.layers, 2, rows, self.kv_heads, self.head_dim), dtype=self.dtype,
                           device=self.device)  # (layers, 2, rows, Hkv, D)

    def states(self, rows: int) -> torch.Tensor:
        return torch.empty((rows, self.hidden), dtype=self.dtype, device=self.device)  # (rows, hidden)


@dataclass
class CachedPrefix:
    """The cached rows one batch reads: the cache segments it uses, their rows back to back (the cached rows
    `0..C`), and per sequence the ranges of them its cached prefix reads, root to leaf."""

    segments: list[tuple[torch.Tensor, torch.Tensor, int]]  # per segment used: its K/V, states, leading rows used
    pair_cu: np.ndarray  # (B+1,) int64 each sequence's ranges in pair_start / pair_end
    pair_start: np.ndarray  # (T,) int64 first cached row of each (sequence, segment) range
    pair_end: np.ndarray  # (T,) int64 end of each range

    @property
    def num_rows(self) -> int:
        return sum(used for _, _, used in self.segments)

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(C, Hkv, D) K and V of the cached rows in `layer`: the segment itself when one is used, no copy."""
        parts = [kv[layer, :, :used] for kv, _, used in self.segments]  # (2, used, Hkv, D) each
        both = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # (2, C, Hkv, D)
        return both[0], both[1]

    def states(self) -> torch.Tensor:
        """(C, hidden) final-normed hidden states of the cached rows."""
        parts = [states[:used] for _, states, used in self.segments]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass
class KeptRows:
    """The computed rows of a batch that enter the cache at commit, and the buffers the forward copies their K/V
    (layer by layer) and final hidden states into."""

    rows: torch.Tensor  # (A,) int64 computed rows, in admission order
    kv: torch.Tensor  # (layers, 2, A, Hkv, D)
    states: torch.Tensor  # (A, hidden)

    def keep_layer(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy the rows' `k`, `v` (R, Hkv, D) of `layer`."""
        torch.index_select(k, 0, self.rows, out=self.kv[layer, 0])
        torch.index_select(v, 0, self.rows, out=self.kv[layer, 1])

    def keep_states(self, hidden: torch.Tensor) -> None:
        """Copy the rows' final-normed hidden states from `hidden` (R, hidden)."""
        torch.index_select(hidden, 0, self.rows, out=self.states)
