"""The engine benchmark's workloads, by name: the shapes of docs/ARCHITECTURE.md section 7, the paper's long shared
prefix, and the batches of the scaling part. Every process (the benchmark, its memory cells, engine_profile.py)
rebuilds a batch from its name with the same seed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

VOCAB = 2000
SCALING_PREFIX, SCALING_SUFFIX, SCALING_COUNTS = 1024, 64, (8, 32, 128)

Builder = Callable[[np.random.Generator], list[list[int]]]


def tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(0, VOCAB, n).tolist()


def msmarco_rerank(rng) -> list[list[int]]:
    """64 sequences: 8 queries x 8 passages; 50 shared template tokens, the query shared by its passages,
    passages of 40-120 tokens, a 10-token assistant suffix."""
    template, suffix = tokens(rng, 50), tokens(rng, 10)
    batch = []
    for _ in range(8):
        query = tokens(rng, int(rng.integers(8, 20)))
        batch += [template + query + tokens(rng, int(rng.integers(40, 121))) + suffix for _ in range(8)]
    return batch


def synthetic_prefix(rng, prefix: int = 512, suffix: int = 64, batch: int = 32) -> list[list[int]]:
    shared = tokens(rng, prefix)
    return [shared + tokens(rng, suffix) for _ in range(batch)]


def embedding_instruction(rng) -> list[list[int]]:
    """64 texts of 50-200 tokens behind one 20-token instruction."""
    instruction = tokens(rng, 20)
    return [instruction + tokens(rng, int(rng.integers(50, 201))) for _ in range(64)]


def no_sharing(rng) -> list[list[int]]:
    return [tokens(rng, int(rng.integers(128, 385))) for _ in range(32)]


@dataclass(frozen=True)
class Shape:
    """One row group of the shapes table."""

    make: Builder
    # Over a minute per `off` forward on 2 cores: timed over --long-repeats rounds, and without the padded
    # transformers reference (about 4 GB peak and off's time per forward at 32 x 2304 tokens).
    long: bool = False


SHAPES = {
    "msmarco-rerank 64 seqs": Shape(msmarco_rerank),
    "synthetic 32x(512+64)": Shape(synthetic_prefix),
    "synthetic 32x(2048+256)": Shape(partial(synthetic_prefix, prefix=2048, suffix=256), long=True),
    "embed 64x(20+50..200)": Shape(embedding_instruction),
    "no sharing 32x(128..384)": Shape(no_sharing),
}


def scaling_name(count: int) -> str:
    return f"shared {count}x({SCALING_PREFIX}+{SCALING_SUFFIX})"


def suffixes_name(count: int) -> str:
    return f"suffixes {count}x{SCALING_SUFFIX}"


# Every named batch: the shapes, and the scaling part's batches; the memory cells and engine_profile.py rebuild a
# batch by its name.
BATCHES: dict[str, Builder] = {
    **{name: shape.make for name, shape in SHAPES.items()},
    **{scaling_name(n): partial(synthetic_prefix, prefix=SCALING_PREFIX, suffix=SCALING_SUFFIX, batch=n)
       for n in SCALING_COUNTS},
    **{suffixes_name(n): partial(synthetic_prefix, prefix=0, suffix=SCALING_SUFFIX, batch=n) for n in SCALING_COUNTS},
}


def make_batch(name: str) -> list[list[int]]:
    """The batch `name` of `BATCHES`, the same in every process."""
    return BATCHES[name](np.random.default_rng(0))
