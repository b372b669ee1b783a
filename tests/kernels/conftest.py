"""Random radix batches for the kernel tests (tests/conftest.py selects Triton's interpreter without CUDA)."""

from __future__ import annotations

import numpy as np
import pytest

from radix_core.index import build_radix_index, flatten_sequences


@pytest.fixture
def radix_batch():
    """`radix_batch(seed, num_sequences=6, max_len=40) -> RadixIndex` of a random batch with shared prefixes.

    Sequences cut two random stems at random points and add random tails, so the batch holds shared prefixes,
    sequences that are prefixes of others, and (always) one exact duplicate: blocks with `Lq == 0`.
    """

    def build(seed: int, num_sequences: int = 6, max_len: int = 40):
        rng = np.random.default_rng(seed)
        stems = [rng.integers(0, 16, max_len).tolist() for _ in range(2)]
        sequences = []
        for _ in range(num_sequences - 1):
            stem = stems[rng.integers(2)][: rng.integers(0, max_len + 1)]
            tail = rng.integers(0, 16, rng.integers(0, 12)).tolist()
            sequences.append((stem + tail)[:max_len] or [0])
        sequences.append(list(sequences[rng.integers(len(sequences))]))
        return build_radix_index(*flatten_sequences(sequences))

    return build
