"""`ComputeThread`: the one thread on which an engine replica runs its torch work (loading, warm-up, every batch).
The device health probe runs beside it, so that a long batch does not fail the probe: its one-element op starts no
parallel region, so it makes no team of its own.

Why one: libgomp, the OpenMP runtime of torch's CPU wheels, gives each thread that starts a parallel region a team
of worker threads of its own. Once a process holds more such workers than it has CPUs (two threads that ever ran
torch on a 2-CPU node are enough), libgomp throttles every team: its workers no longer spin at a barrier, they
sleep on a futex, and each of a forward's thousands of short parallel regions pays a wake-up. `asyncio.to_thread`
picks any thread of the loop's default executor, so over a replica's life several of them ran torch. Measured on
2 CPUs (torch 2.13, `tiny` preset, a 1,000-document rerank run as 7 batches of ~143 documents, prefix cache off):
0.55-0.58 s on the thread that first ran torch; 1.0 s on a second thread, and 1.0 s on the first one too once the
second had run a parallel region (CPU time per wall second 1.3 instead of 2). One compute thread keeps one team.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class ComputeThread:
    """A single worker thread; `call` blocks on it (the replica's constructor), `run` awaits it (everything else).
    Both carry the caller's context variables (the request id the log lines name), as `asyncio.to_thread` does."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixserve-compute")

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._executor.submit(_in_context(fn, *args, **kwargs)).result()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, _in_context(fn, *args, **kwargs))


def _in_context(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Callable[[], T]:
    return functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
