"""`TokenBudgetBatcher`: the engine replica's queue, cut into token-budget batches that keep prefixes together.

    batcher = TokenBudgetBatcher(run_batch, max_batch_tokens=16384, wait_timeout_s=0.01, prepare=build_index)
    result = await batcher.submit(item, num_tokens=n, prefix_key=key)

A batch closes when the waiting items hold `max_batch_tokens` or the oldest has waited `wait_timeout_s`.
A request is refused at once (`QueueFullError`, with a retry hint) when the queue holds `max_queued_tokens` or
`max_queued_items`, or when the work ahead of it (running, prepared and queued tokens at the device's recent
rate) exceeds `max_queue_wait_s`: under overload the accepted requests keep their latency and the rest are told
at once when to come back. (The time bound also refuses a fixed set of clients whose requests together hold more
work than it: set it above their concurrency times a request's service time.) It is
filled first with the oldest item's prefix group, then with the other groups in the order their oldest item
arrived, first fit within the budget; an item larger than the budget runs alone once it is the oldest.

Two stages run as a pipeline so the device never waits for the CPU work of the next batch:

    prepare(items) -> prepared      e.g. build the radix index in an IndexBuilder actor
    run_batch(prepared) -> results  e.g. `Engine.forward` on the device; one result per item, in order

While batch k runs, batch k+1 is formed and prepared; it then waits (at most one prepared batch) until batch k
finishes. Without `prepare`, `run_batch` receives the item list. An exception from either stage fails exactly
the requests of that batch (logged once, naming their request ids); the batcher keeps serving. Ray Serve's
`@serve.batch` (with `batch_size_fn`) counts a budget too, but neither groups by key nor splits a batch into
pipelined stages.

An `observer` (`BatchObserver`; the engine replica's metrics) hears every change of the queue's size and every
batch's `BatchStats`. The two loops run in a context of their own, not the first caller's, so their log lines
carry no request's id but name the ids of the batch they are about.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

logger = logging.getLogger("ray.serve")


class QueueFullError(RuntimeError):
    """The replica's batch queue is at its bound; the caller should retry after about `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message, retry_after_s)  # both in args, so the error pickles across Ray processes
        self.message = message
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class BatchStats:
    """Timings of one batch, in seconds."""

    num_items: int
    num_tokens: int
    num_keys: int  # distinct prefix keys (keyless items count one each)
    queue_s: float  # oldest item's wait from submit until its batch closed
    build_s: float  # prepare(): the index build, overlapped with the previous batch's forward
    wait_s: float  # prepared batch waiting for the device (the previous forward still running)
    forward_s: float  # run_batch()
    ok: bool  # False when prepare or run_batch raised
    request_ids: tuple[str, ...] = ()  # distinct ids of the items that gave one, in batch order


class BatchObserver(Protocol):
    """What the batcher reports as it works."""

    def queue_changed(self, items: int, tokens: int) -> None:
        """The queue now holds `items` items of `tokens` tokens in all."""

    def batch_done(self, stats: BatchStats) -> None:
        """A batch finished, or failed (`stats.ok` False)."""


@dataclass
class BatcherStats:
    """Counters and the most recent batches' timings."""

    keep: int = 1024
    num_batches: int = 0
    num_items: int = 0
    num_failed_batches: int = 0
    recent: deque[BatchStats] = field(init=False)

    def __post_init__(self):
        self.recent = deque(maxlen=self.keep)

    def record(self, batch: BatchStats) -> None:
        self.num_batches += 1
        self.num_items += batch.num_items
        self.num_failed_batches += not batch.ok
        self.recent.append(batch)

    def tokens_per_second(self) -> float | None:
        """Tokens the device ran per second of forward over the recent batches; None before the first."""
        seconds = sum(b.forward_s for b in self.recent if b.ok)
        return sum(b.num_tokens for b in self.recent if b.ok) / seconds if seconds > 0 else None

    def summary(self) -> dict[str, float]:
        """Means over the recent batches (zeros before the first batch)."""
        n = max(len(self.recent), 1)
        mean = {name: sum(getattr(b, name) for b in self.recent) / n
                for name in ("num_items", "num_tokens", "queue_s", "build_s", "wait_s", "forward_s")}
        return {"num_batches": self.num_batches, "num_items": self.num_items,
                "num_failed_batches": self.num_failed_batches, **{f"mean_{k}": v for k, v in mean.items()}}


@dataclass(eq=False, slots=True)
class _Waiting:
    item: Any
    num_tokens: int
    group: Hashable  # the prefix key, or a fresh object so keyless items group with nothing
    enqueued: float
    future: asyncio.Future
    request_id: str | None


class TokenBudgetBatcher:
    """Token-budget, prefix-grouping, pipelined batching for one replica's event loop."""

    def __init__(self, run_batch: Callable[[Any], Awaitable[Sequence[Any]]], max_batch_tokens: int,
                 wait_timeout_s: float, *, prepare: Callable[[list[Any]], Awaitable[Any]] | None = None,
                 max_queued_tokens: int | None = None, max_queued_items: int | None = None,
                 max_queue_wait_s: float | None = None, observer: BatchObserver | None = None):
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if wait_timeout_s < 0:
            raise ValueError(f"wait_timeout_s must be >= 0, got {wait_timeout_s}")
        self.run_batch = run_batch
        self.prepare = prepare
        self.max_batch_tokens = max_batch_tokens
        self.wait_timeout_s = wait_timeout_s
        self.max_queued_tokens = max_queued_tokens
        self.max_queued_items = max_queued_items
        self.max_queue_wait_s = max_queue_wait_s
        self.observer = observer
        self.stats = BatcherStats()
        self._queue: list[_Waiting] = []  # arrival order
        self._queued_tokens = 0
        self._inflight_tokens = 0  # taken into a batch that has not finished yet
        self._arrived: asyncio.Event | None = None  # created on the serving loop, at the first submit
        self._handoff: asyncio.Queue | None = None  # the (at most one) prepared batch waiting for the device
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    @property
    def queued_items(self) -> int:
        return len(self._queue)

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    async def submit(self, item: Any, num_tokens: int, prefix_key: str | None = None,
                     request_id: str | None = None) -> Any:
        """Queue `item` (`num_tokens` of work) and return its own result once its batch has run; `request_id`
        names it in the batch's log lines and stats."""
        if self._closed:
            raise RuntimeError("the batcher is closed; the replica is shutting down")
        self._check_room(num_tokens)
        self._start()
        loop = asyncio.get_running_loop()
        entry = _Waiting(item, num_tokens, prefix_key if prefix_key is not None else object(), loop.time(),
                         loop.create_future(), request_id)
        self._queue.append(entry)
        self._queued_tokens += num_tokens
        self._queue_changed()
        self._arrived.set()
        try:
            return await entry.future
        except asyncio.CancelledError:
            if entry in self._queue:  # caller gave up before its batch closed: drop it
                self._queue.remove(entry)
                self._queued_tokens -= entry.num_tokens
                self._queue_changed()
            raise

    async def close(self) -> None:
        """Stop serving: waiting requests and batches in flight fail with a RuntimeError."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        closed = RuntimeError("the batcher closed before this request ran")
        while self._handoff is not None and not self._handoff.empty():
            self._fail(self._handoff.get_nowait()[0], closed)
        self._fail(self._queue, closed)
        self._queue.clear()
        self._queued_tokens = self._inflight_tokens = 0
        self._queue_changed()

    def _check_room(self, num_tokens: int) -> None:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        if self.max_queued_items is not None and len(self._queue) >= self.max_queued_items:
            retry = self._drain_s()
            raise QueueFullError(f"batch queue full: {len(self._queue)} requests waiting (max_queued_items="
                                 f"{self.max_queued_items}); retry in about {retry:.1f} s, add replicas, or raise "
                                 "the bound", retry)
        if self.max_queued_tokens is not None and self._queued_tokens + num_tokens > self.max_queued_tokens:
            retry = self._drain_s()
            raise QueueFullError(f"batch queue full: {self._queued_tokens} tokens waiting + {num_tokens} requested "
                                 f"> max_queued_tokens={self.max_queued_tokens}; retry in about {retry:.1f} s, add "
                                 "replicas, split the request, or raise the bound", retry)
        rate = self.stats.tokens_per_second()
        if self.max_queue_wait_s is not None and rate:
            ahead = (self._inflight_tokens + self._queued_tokens) / rate
            if ahead > self.max_queue_wait_s:
                retry = ahead - self.max_queue_wait_s
                raise QueueFullError(f"replica busy: about {ahead:.1f} s of work ahead of this request at its recent "
                                     f"rate (max_queue_wait_s={self.max_queue_wait_s:g}); retry in about "
                                     f"{retry:.1f} s, add replicas, or raise the bound", retry)

    def _drain_s(self) -> float:
        """Seconds the device needs for what is ahead now (running, prepared and queued), at its recent rate (1 s
        before it has one)."""
        rate = self.stats.tokens_per_second()
        return (self._inflight_tokens + self._queued_tokens) / rate if rate else 1.0

    def _start(self) -> None:
        if not self._tasks:
            self._arrived = asyncio.Event()
            self._handoff = asyncio.Queue(maxsize=1)
            self._tasks = [asyncio.create_task(loop, context=contextvars.Context())  # not the first caller's
                           for loop in (self._prepare_loop(), self._run_loop())]

    async def _prepare_loop(self) -> None:
        """Form and prepare the next batch, hand it to the device loop, wait until the device takes it."""
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            closed_at = loop.time()
            queue_s = closed_at - batch[0].enqueued
            items = [w.item for w in batch]
            try:
                prepared = await self.prepare(items) if self.prepare is not None else items
            except asyncio.CancelledError:
                self._fail(batch, RuntimeError("the batcher closed while this request's batch was prepared"))
                raise
            except Exception as err:  # this batch fails; the next one is unaffected
                self._fail(batch, err)
                self._record(self._stats(batch, queue_s, loop.time() - closed_at, 0.0, 0.0, ok=False), err)
                continue
            await self._handoff.put((batch, prepared, queue_s, loop.time() - closed_at, loop.time()))
            await self._handoff.join()  # at most one prepared batch waits for the device

    async def _run_loop(self) -> None:
        """Run prepared batches one at a time and resolve each request with its own result."""
        loop = asyncio.get_running_loop()
        while True:
            batch, prepared, queue_s, build_s, ready_at = await self._handoff.get()
            started = loop.time()
            self._handoff.task_done()  # lets the next batch be formed and prepared while this one runs
            try:
                results = await self.run_batch(prepared)
                if len(results) != len(batch):
                    raise ValueError(f"run_batch returned {len(results)} results for a batch of {len(batch)} items")
            except asyncio.CancelledError:
                self._fail(batch, RuntimeError("the batcher closed while this request's batch ran"))
                raise
            except Exception as err:
                self._fail(batch, err)
                self._record(self._stats(batch, queue_s, build_s, started - ready_at, loop.time() - started,
                                         ok=False), err)
                continue
            for waiting, result in zip(batch, results):
                if not waiting.future.done():
                    waiting.future.set_result(result)
            self._record(self._stats(batch, queue_s, build_s, started - ready_at, loop.time() - started))

    async def _next_batch(self) -> list[_Waiting]:
        """Wait until the budget is reached or the oldest waiting item times out, then take a batch."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            while self._queue and self._queued_tokens < self.max_batch_tokens:
                remaining = self._queue[0].enqueued + self.wait_timeout_s - loop.time()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            if self._queue:  # empty when every waiting caller cancelled meanwhile
                return self._take()

    def _take(self) -> list[_Waiting]:
        """The oldest item's group first, then other groups by their oldest item; first fit in the budget."""
        group_rank: dict[Hashable, int] = {}
        for w in self._queue:
            group_rank.setdefault(w.group, len(group_rank))
        order = sorted(range(len(self._queue)), key=lambda i: (group_rank[self._queue[i].group], i))
        taken, total = [], 0
        for i in order:
            n = self._queue[i].num_tokens
            if total + n <= self.max_batch_tokens or not taken:  # the oldest goes even when over budget
                taken.append(i)
                total += n
            if total >= self.max_batch_tokens:
                break
        chosen = set(taken)
        batch = [self._queue[i] for i in taken]
        self._queue = [w for i, w in enumerate(self._queue) if i not in chosen]
        self._queued_tokens -= total
        self._inflight_tokens += total
        self._queue_changed()
        return batch

    def _queue_changed(self) -> None:
        if self.observer is not None:
            self.observer.queue_changed(len(self._queue), self._queued_tokens)

    def _record(self, stats: BatchStats, err: Exception | None = None) -> None:
        """Count the batch, tell the observer, and log it: DEBUG when it ran, WARNING (once for all its requests)
        when it failed."""
        self.stats.record(stats)
        self._inflight_tokens -= stats.num_tokens
        if self.observer is not None:
            self.observer.batch_done(stats)
        ids = ", ".join(stats.request_ids) or "none given"
        if err is not None:
            logger.warning("batch of %d items, %d tokens failed (%s: %s); requests: %s", stats.num_items,
                           stats.num_tokens, type(err).__name__, err, ids)
        else:
            logger.debug("batch of %d items, %d tokens, %d prefix keys: queue %.4f s, build %.4f s, wait %.4f s, "
                         "forward %.4f s; requests: %s", stats.num_items, stats.num_tokens, stats.num_keys,
                         stats.queue_s, stats.build_s, stats.wait_s, stats.forward_s, ids)

    def _stats(self, batch: list[_Waiting], queue_s: float, build_s: float, wait_s: float, forward_s: float,
               ok: bool = True) -> BatchStats:
        return BatchStats(num_items=len(batch), num_tokens=sum(w.num_tokens for w in batch),
                          num_keys=len({w.group for w in batch}), queue_s=queue_s, build_s=build_s, wait_s=wait_s,
                          forward_s=forward_s, ok=ok,
                          request_ids=tuple(dict.fromkeys(w.request_id for w in batch if w.request_id)))

    @staticmethod
    def _fail(batch: list[_Waiting], err: BaseException) -> None:
        for waiting in batch:
            if not waiting.future.done():
                waiting.future.set_exception(err)
