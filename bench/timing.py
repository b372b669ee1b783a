"""Side-by-side timing for the benchmarks: every candidate runs in one process, interleaved per repetition, so
drift of the machine (other load, memory state) touches all of them alike; the order rotates every round, so no
candidate always runs first (after another's allocations) or last."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Seconds of one candidate over the rounds."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.3f} ({self.low:.3f}-{self.high:.3f})"


def interleaved_timings(runners: dict[str, Callable[[], object]], repeats: int, warmup: bool = True,
                        clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Median, min and max seconds per runner over `repeats` rounds (after one warm-up call each); round r runs
    the runners in their order rotated by r. `clock`: wall time, or `time.process_time` for CPU time (relative
    costs on a shared machine, one torch thread)."""
    if warmup:
        for run in runners.values():
            run()
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = clock()
            runners[name]()
            times[name].append(clock() - start)
    return {name: Timing(float(np.median(t)), min(t), max(t)) for name, t in times.items()}
