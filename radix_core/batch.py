"""A batch checked, indexed and laid out for one mode on the CPU, before the device sees it.

`prepare_batch` is everything the engine does before the forward that needs no model weights: flatten the
token-id lists, check them against the model's limits, build the radix index and choose the mode. It returns
numpy only, so it can run in another process (the serving layer's index builder prepares batch k+1 while
batch k runs on the device) and travel by pickle.

`auto` chooses per batch: a batch whose compression N'/N is above `radix_threshold` runs `off`; any other runs
the mode of least predicted time under the engine's cost model (`radix_core.mode_cost`, calibrated on its device
by `Engine.warm_up`), which sends a batch without sharing to `off` too. Its limits carry the model, so the index
builder's process chooses as the engine would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from radix_core.cascade import CascadePlan, cascade_plan
from radix_core.engine_config import RADIX_CHOICES
from radix_core.index import RadixIndex, build_radix_index, flatten_sequences
from radix_core.mode_cost import DEFAULT_COSTS, ModeCosts, mode_works
from radix_core.tokens import TokenSequences


@dataclass(frozen=True)
class BatchLimits:
    """What a batch must respect, from the loaded model, and how `auto` chooses."""

    vocab_size: int
    max_seq_len: int
    radix_threshold: float  # `auto` runs "off" when N'/N is above this, else the mode `costs` predicts fastest
    costs: ModeCosts = DEFAULT_COSTS  # the engine's own: calibrated on its device, or its static FLOP count


@dataclass
class PreparedBatch:
    """One batch ready for the forward: flat ids, boundaries, the mode to run and (unless "off") its index."""

    input_ids: np.ndarray  # (N,) int64
    cu_seqlens: np.ndarray  # (B+1,) int64
    mode: str  # "off", "mlp" or "full" ("auto" already resolved)
    index: RadixIndex | None  # None in "off" mode
    cascade: CascadePlan | None = None  # "full" mode's attention plan

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1


def prepare_batch(sequences: TokenSequences | Sequence[Sequence[int]], mode: str,
                  limits: BatchLimits) -> PreparedBatch:
    """Check `sequences` against `limits`, index them and resolve `mode` ("auto": `auto_mode`)."""
    if mode not in RADIX_CHOICES:
        raise ValueError(f"unknown radix mode {mode!r}: choose one of {', '.join(RADIX_CHOICES)}")
    input_ids, cu_seqlens = flatten_sequences(sequences)
    check_tokens(input_ids, cu_seqlens, limits)
    if mode == "off":
        return PreparedBatch(input_ids, cu_seqlens, "off", None)
    index = build_radix_index(input_ids, cu_seqlens)
    if mode == "auto":
        mode, cascade = auto_mode(index, limits)
    else:
        cascade = cascade_plan(index) if mode == "full" else None
    return PreparedBatch(input_ids, cu_seqlens, mode, index if mode != "off" else None,
                         cascade if mode == "full" else None)


def auto_mode(index: RadixIndex, limits: BatchLimits) -> tuple[str, CascadePlan | None]:
    """The mode `auto` runs for the batch `index` holds, and the cascade plan it built to choose (None when it
    did not): "off" when the compression is above `limits.radix_threshold`, else the mode of least predicted time
    under `limits.costs`."""
    if index.compression > limits.radix_threshold:
        return "off", None
    cascade = cascade_plan(index)
    return limits.costs.choose(mode_works(index, cascade, absorbs=limits.costs.absorbs)), cascade


def check_tokens(input_ids: np.ndarray, cu_seqlens: np.ndarray, limits: BatchLimits) -> None:
    """Token ids inside the vocabulary and lengths within the model's limit, else a ValueError saying which."""
    bad = np.flatnonzero((input_ids < 0) | (input_ids >= limits.vocab_size))
    if bad.size:
        seq = int(np.searchsorted(cu_seqlens, bad[0], side="right") - 1)
        raise ValueError(f"sequence {seq} has token id {int(input_ids[bad[0]])} outside the vocabulary "
                         f"[0, {limits.vocab_size})")
    lengths = np.diff(cu_seqlens)
    too_long = np.flatnonzero(lengths > limits.max_seq_len)
    if too_long.size:
        s = int(too_long[0])
        raise ValueError(f"sequence {s} has {int(lengths[s])} tokens; the limit is {limits.max_seq_len}")
