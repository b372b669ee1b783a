"""Side-by-side timing for the benchmarks: every candidate runs in one process, interleaved per repetition,
so drift of the machine (other load, memory state) touches all of them alike."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def interleaved_medians(runners: dict[str, Callable[[], object]], repeats: int,
                        warmup: bool = True) -> dict[str, float]:
    """Median seconds per runner over `repeats` interleaved rounds (after one warm-up call each)."""
    if warmup:
        for run in runners.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}
