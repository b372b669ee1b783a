"""The rows of the prefix cache as one batch's forward sees them (`radix_core.prefix_cache` keeps them): what a
cached row holds (`RowShape`), the cached rows a batch reads in every layer (`CachedPrefix`), and the computed rows
whose K/V and final states it hands to the cache (`KeptRows`). Device tensors only; the tree is elsewhere.

A hybrid model (`radix_core.hybrid_layers`) caches K/V of its attention layers only, and at the end of each cached
segment the Gated DeltaNet layers' recurrent states and convolution tails (`EndShape`): a sequence continues a
cached prefix from the end of a segment, as a trie chain continues from its parent chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radix_core.architectures import Architecture


@dataclass(frozen=True)
class EndShape:
    """What a hybrid model's cached segment holds at its end: per Gated DeltaNet layer the recurrent state (float32,
    as the rule keeps it) and the convolution's last `kernel - 1` inputs (`tail`), in `dtype` on `device`."""

    layers: int
    heads: int
    key_dim: int
    value_dim: int
    tail: int
    conv_dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, arch: Architecture, dtype: torch.dtype, device: torch.device) -> EndShape | None:
        """None for a model without recurrent layers."""
        linear = [layer.linear_attn for layer in arch.layers if hasattr(layer, "linear_attn")]
        if not linear:
            return None
        first = linear[0]
        return cls(len(linear), first.num_v_heads, first.head_k_dim, first.head_v_dim, first.conv_kernel_size - 1,
                   first.conv_dim, dtype, device)

    @property
    def bytes(self) -> int:
        """Bytes of one segment end: per recurrent layer heads x Dk x Dv x 4 + (kernel - 1) x C x element, 2.05 MB a
        layer in bfloat16 for transformers' default Qwen3.5 text configuration (32 value heads of 128 x 128)."""
        element = torch.empty(0, dtype=self.dtype).element_size()
        return self.layers * (self.heads * self.key_dim * self.value_dim * 4 + self.tail * self.conv_dim * element)

    def states(self, ends: int) -> torch.Tensor:
        return torch.empty((self.layers, ends, self.heads, self.key_dim, self.value_dim), dtype=torch.float32,
                           device=self.device)  # (layers, E, Hv, Dk, Dv)

    def tails(self, ends: int) -> torch.Tensor:
        return torch.empty((self.layers, ends, self.tail, self.conv_dim), dtype=self.dtype,
                           device=self.device)  # (layers, E, kernel - 1, C), oldest first


@dataclass(frozen=True)
class RowShape:
    """What one cached row holds: K and V of every (attention) layer, and the final hidden state, in `dtype` on
    `device`; for a hybrid model also what a segment's end holds (`ends`)."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    dtype: torch.dtype
    device: torch.device
    ends: EndShape | None = None

    @classmethod
    def of(cls, arch: Architecture, dtype: torch.dtype, device: torch.device) -> RowShape:
        config = arch.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(len(arch.attention_layers), config.num_key_value_heads, head_dim, arch.hidden_size, dtype, device,
                   EndShape.of(arch, dtype, device))

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
    # hybrid models: the recurrent state where each sequence's cached prefix ends, when it computes rows after it
    end_of_sequence: np.ndarray | None = None  # (B,) int64 index into end_states / end_tails, -1 for none
    end_states: torch.Tensor | None = None  # (layers, P, Hv, Dk, Dv) float32
    end_tails: torch.Tensor | None = None  # (layers, P, kernel - 1, C)

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
    # hybrid models: the rows after which the recurrent state enters the cache (the ends of admitted segments and
    # of cached segments whose end state is missing), and its buffers
    end_rows: np.ndarray | None = None  # (E,) int64
    end_states: torch.Tensor | None = None  # (linear layers, E, Hv, Dk, Dv) float32
    end_tails: torch.Tensor | None = None  # (linear layers, E, kernel - 1, C)
    state_rows: torch.Tensor | None = None  # (A,) int64 where the rows' final states are in the forward's final
    # states when it finishes only some rows (`radix_core.forward.select_final_rows`); None: at `rows`

    def keep_layer(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy the rows' `k`, `v` (R, Hkv, D) of `layer`."""
        torch.index_select(k, 0, self.rows, out=self.kv[layer, 0])
        torch.index_select(v, 0, self.rows, out=self.kv[layer, 1])

    def keep_end(self, layer: int, states: torch.Tensor, tails: torch.Tensor) -> None:
        """Copy the recurrent states (E, Hv, Dk, Dv) and convolution tails (E, kernel - 1, C) at `end_rows` of the
        `layer`-th recurrent layer."""
        self.end_states[layer].copy_(states)
        self.end_tails[layer].copy_(tails)

    def keep_states(self, hidden: torch.Tensor) -> None:
        """Copy the rows' final-normed hidden states from `hidden` (the forward's final rows, hidden)."""
        torch.index_select(hidden, 0, self.rows if self.state_rows is None else self.state_rows, out=self.states)
