"""`TokenBudgetBatcher`: the engine replica's queue of requests, cut into token-budget batches that keep prefixes
together and put interactive work first.

    batcher = TokenBudgetBatcher(run_batch, max_batch_tokens=16384, wait_timeout_s=0.01, prepare=build_index)
    results = await batcher.submit(parts, num_tokens=[...], costs=[...], prefix_key=key, priority=0)

The unit of admission, cancellation and accounting is the request: `submit` takes all of a request's parts at
once and admits them together or refuses them together (`QueueFullError`, with a retry hint), before any of them
computes. A request is never refused while nothing is queued, so every request the request limits accept runs on
an idle replica; beyond that it is refused when the queued work plus its own would pass `max_queued_tokens`, or
when the work ahead of it (running, prepared and queued, at the device's recent rate) passes `max_queue_wait_s`.
Work is counted in `costs`: the rows the device will compute (a shared prefix once), not the input tokens. When
the caller goes away (its task is cancelled) or one of its parts fails, every part still queued leaves the queue,
and a prepared batch holding a part of a finished request is not run: its live parts go back to the queue.

A batch closes when the waiting parts' work (`costs`, the rows the device computes) reaches `max_batch_tokens`, so
every batch is about as long on the device however much of it is shared (`num_tokens`, the input tokens, only
describe the queue and the batches), or when the oldest has waited `wait_timeout_s`,
or at once when requests come one at a time: a request that finds the replica idle (nothing queued, nothing in a
batch) right after the one before it did has no company to wait for, and the wait would only add `wait_timeout_s`
to it (10 ms of the ~35 ms a lone 8-document rerank spent between the proxy and its forward, `bench/host_path.py`).
It is filled by priority class (0 first; a part that has waited `aging_s` counts as class 0, so no class starves),
then with the oldest part's prefix group, then the other groups in the order their oldest part arrived, first fit
within the budget; a part larger than the budget runs alone once it is first. A prepared batch of later classes
only is put back when a class-0 part waits, so such work delays class 0 by at most the batch on the device.

Two stages run as a pipeline so the device never waits for the CPU work of the next batch:

    prepare(items) -> prepared      e.g. build the radix index in an IndexBuilder actor
    run_batch(prepared) -> results  e.g. `Engine.forward` on the device; one result per item, in order

While batch k runs, batch k+1 is formed, as late as lets it be prepared by the time batch k should end (at the
device's recent rate; `_formation_due`), and prepared; it then waits (at most one prepared batch) until batch k
finishes. Without `prepare`, `run_batch` receives the item list. An exception from either stage fails exactly
the requests of that batch (logged once, naming their request ids); the batcher keeps serving. Ray Serve's
`@serve.batch` (with `batch_size_fn`) counts a budget too, but neither groups by key nor admits requests whole.

An `observer` (`BatchObserver`; the engine replica's metrics) hears every change of the queue's size and every
batch's `BatchStats`. The two loops run in a context of their own, not the first caller's, so their log lines
carry no request's id but name the ids of the batch they are about.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployments.batching_config import DEFAULT_PRIORITY_AGING_S

logger = logging.getLogger("ray.serve")
BATCH_STAGES = ("queue", "build", "wait", "forward")  # BatchStats fields `<stage>_s`
LEAD_BATCHES = 16  # recent builds that say how early the next batch is formed (`BatcherStats.build_lead_s`)


class QueueFullError(RuntimeError):
    """The replica's batch queue is at its bound; the caller should retry after about `retry_after_s` (a request
    the limits accepted always fits once the queue has drained)."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message, retry_after_s)  # both in args, so the error pickles across Ray processes
        self.message = message
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class BatchStats:
    """Timings of one batch, in seconds."""

    num_items: int  # parts
    num_tokens: int  # input tokens
    work_tokens: int  # rows the admission priced (costs)
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
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BATCH_STAGES, 0.0))  # all batches'
    recent: deque[BatchStats] = field(init=False)

    def __post_init__(self):
        self.recent = deque(maxlen=self.keep)

    def record(self, batch: BatchStats) -> None:
        self.num_batches += 1
        self.num_items += batch.num_items
        self.num_failed_batches += not batch.ok
        for stage in BATCH_STAGES:
            self.seconds[stage] += getattr(batch, f"{stage}_s")
        self.recent.append(batch)

    def work_per_second(self) -> float | None:
        """Work (priced rows) the device ran per second of forward over the recent batches; None before the
        first."""
        seconds = sum(b.forward_s for b in self.recent if b.ok)
        return sum(b.work_tokens for b in self.recent if b.ok) / seconds if seconds > 0 else None

    def build_lead_s(self) -> float:
        """How long before the running batch's expected end the next one is formed: twice the longest of the last
        `LEAD_BATCHES` builds, so that it is prepared by the time the device is free."""
        return 2 * max((b.build_s for b in itertools.islice(reversed(self.recent), LEAD_BATCHES)), default=0.0)

    def summary(self) -> dict[str, float]:
        """Means over the recent batches (zeros before the first batch), and each stage's seconds over all."""
        n = max(len(self.recent), 1)
        mean = {name: sum(getattr(b, name) for b in self.recent) / n
                for name in ("num_items", "num_tokens", *(f"{stage}_s" for stage in BATCH_STAGES))}
        return {"num_batches": self.num_batches, "num_items": self.num_items,
                "num_failed_batches": self.num_failed_batches, **{f"mean_{k}": v for k, v in mean.items()},
                **{f"total_{stage}_s": s for stage, s in self.seconds.items()}}


@dataclass(eq=False)
class _Request:
    """What a request's parts share: its group, class and arrival; `done` once answered, failed or cancelled, so
    any of its parts still queued or prepared is dropped."""

    group: Hashable  # the prefix key, or a fresh object so keyless requests group with nothing
    priority: int
    enqueued: float
    request_id: str | None
    alone: bool = False  # it and the request before it each found the replica idle: its batch need not wait
    done: bool = False


@dataclass(eq=False, slots=True)
class _Part:
    item: Any
    num_tokens: int
    cost: int
    request: _Request
    seq: int  # arrival order across all requests
    future: asyncio.Future


class TokenBudgetBatcher:
    """Token-budget, prefix-grouping, prioritised, pipelined batching of whole requests for one replica's loop."""

    def __init__(self, run_batch: Callable[[Any], Awaitable[Sequence[Any]]], max_batch_tokens: int,
                 wait_timeout_s: float, *, prepare: Callable[[list[Any]], Awaitable[Any]] | None = None,
                 max_queued_tokens: int | None = None, max_queue_wait_s: float | None = None,
                 aging_s: float = DEFAULT_PRIORITY_AGING_S, observer: BatchObserver | None = None):
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if wait_timeout_s < 0:
            raise ValueError(f"wait_timeout_s must be >= 0, got {wait_timeout_s}")
        self.run_batch = run_batch
        self.prepare = prepare
        self.max_batch_tokens = max_batch_tokens
        self.wait_timeout_s = wait_timeout_s
        self.max_queued_tokens = max_queued_tokens
        self.max_queue_wait_s = max_queue_wait_s
        self.aging_s = aging_s
        self.observer = observer
        self.stats = BatcherStats()
        self._queue: list[_Part] = []  # arrival order (`seq`)
        self._queued_tokens = 0  # input tokens of the queued parts
        self._queued_cost = 0  # their work: admission, and closes a batch at the budget
        self._inflight_cost = 0  # work taken into a batch that has not finished yet
        self._idle_arrival = False  # the last request found nothing queued and nothing in a batch
        self._seq = itertools.count()
        self._arrived: asyncio.Event | None = None  # created on the serving loop, at the first submit
        self._handoff: asyncio.Queue | None = None  # the (at most one) prepared batch waiting for the device
        self._running_end: float | None = None  # when the batch on the device should end, at the recent rate
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    @property
    def queued_items(self) -> int:
        return len(self._queue)

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    async def submit(self, items: Sequence[Any], num_tokens: Sequence[int], costs: Sequence[int] | None = None,
                     prefix_key: str | None = None, request_id: str | None = None, priority: int = 0) -> list[Any]:
        """Admit one request's `items` (`num_tokens` input tokens and `costs` of work each; the cost defaults to
        the tokens) together or refuse them together, and return their results in order once they ran.
        `request_id` names it in the batches' log lines and stats. Cancelling the caller, or a part's failure,
        drops the parts still waiting."""
        costs = num_tokens if costs is None else costs
        self._check_request(items, num_tokens, costs)
        self._admit(sum(costs))
        self._start()
        loop = asyncio.get_running_loop()
        idle = not self._queue and self._inflight_cost == 0
        request = _Request(prefix_key if prefix_key is not None else object(), priority, loop.time(), request_id,
                           alone=idle and self._idle_arrival)
        self._idle_arrival = idle
        parts = [_Part(item, n, cost, request, next(self._seq), loop.create_future())
                 for item, n, cost in zip(items, num_tokens, costs)]
        self._queue.extend(parts)
        self._count_queued(parts, +1)
        self._arrived.set()
        try:
            return list(await asyncio.gather(*(part.future for part in parts)))
        finally:
            request.done = True
            self._drop(request)

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
        self._queued_tokens = self._queued_cost = self._inflight_cost = 0
        self._queue_changed()

    def _check_request(self, items: Sequence[Any], num_tokens: Sequence[int], costs: Sequence[int]) -> None:
        if self._closed:
            raise RuntimeError("the batcher is closed; the replica is shutting down")
        if not items or not len(items) == len(num_tokens) == len(costs):
            raise ValueError(f"a request needs one or more items with a token count and a cost each, got "
                             f"{len(items)} items, {len(num_tokens)} counts, {len(costs)} costs")
        if min(num_tokens) < 1 or min(costs) < 1:
            raise ValueError(f"token counts and costs must be >= 1, got {min(num_tokens)} and {min(costs)}")

    def _admit(self, cost: int) -> None:
        """Refuse the request (QueueFullError) when the queue's bounds leave no room for it; never while nothing
        is queued, so a request the limits accept always runs on an idle replica."""
        if not self._queue:
            return
        if self.max_queued_tokens is not None and self._queued_cost + cost > self.max_queued_tokens:
            retry = self._drain_s()
            raise QueueFullError(f"replica busy: {self._queued_cost} tokens of work queued + {cost} for this request "
                                 f"> max_queued_tokens={self.max_queued_tokens}; retry in about {retry:.1f} s, when "
                                 "the work ahead has drained, or add replicas", retry)
        rate = self.stats.work_per_second()
        if self.max_queue_wait_s is not None and rate:
            ahead = (self._inflight_cost + self._queued_cost) / rate
            if ahead > self.max_queue_wait_s:
                retry = ahead - self.max_queue_wait_s
                raise QueueFullError(f"replica busy: about {ahead:.1f} s of work ahead of this request at its recent "
                                     f"rate (max_queue_wait_s={self.max_queue_wait_s:g}); retry in about "
                                     f"{retry:.1f} s, or add replicas", retry)

    def _drain_s(self) -> float:
        """Seconds the device needs for what is ahead now (running, prepared and queued), at its recent rate (1 s
        before it has one)."""
        rate = self.stats.work_per_second()
        return (self._inflight_cost + self._queued_cost) / rate if rate else 1.0

    def _drop(self, request: _Request) -> None:
        """Take the request's parts out of the queue (it was answered, failed or its caller went away)."""
        gone = [part for part in self._queue if part.request is request]
        if gone:
            self._queue = [part for part in self._queue if part.request is not request]
            self._count_queued(gone, -1)

    def _count_queued(self, parts: Sequence[_Part], sign: int) -> None:
        self._queued_tokens += sign * sum(part.num_tokens for part in parts)
        self._queued_cost += sign * sum(part.cost for part in parts)
        self._queue_changed()

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
            await self._formation_due()
            batch = await self._next_batch()
            closed_at = loop.time()
            queue_s = closed_at - min(part.request.enqueued for part in batch)
            items = [part.item for part in batch]
            try:
                prepared = await self.prepare(items) if self.prepare is not None else items
            except asyncio.CancelledError:
                self._fail(batch, RuntimeError("the batcher closed while this request's batch was prepared"))
                raise
            except Exception as err:  # this batch fails; the next one is unaffected
                self._fail(batch, err)
                self._record(batch, self._stats(batch, queue_s, loop.time() - closed_at, 0.0, 0.0, ok=False), err)
                continue
            await self._handoff.put((batch, prepared, queue_s, loop.time() - closed_at, loop.time()))
            await self._handoff.join()  # at most one prepared batch waits for the device

    async def _run_loop(self) -> None:
        """Run prepared batches one at a time and resolve each part with its own result; a batch that lost a
        request, or holds later classes only while class 0 waits, goes back to the queue instead."""
        loop = asyncio.get_running_loop()
        while True:
            batch, prepared, queue_s, build_s, ready_at = await self._handoff.get()
            started = loop.time()
            self._handoff.task_done()  # lets the next batch be formed and prepared while this one runs
            if self._should_return(batch, started):
                self._return(batch)
                continue
            rate = self.stats.work_per_second()
            self._running_end = started + sum(part.cost for part in batch) / rate if rate else None
            try:
                results = await self.run_batch(prepared)
                if len(results) != len(batch):
                    raise ValueError(f"run_batch returned {len(results)} results for a batch of {len(batch)} items")
            except asyncio.CancelledError:
                self._fail(batch, RuntimeError("the batcher closed while this request's batch ran"))
                raise
            except Exception as err:
                self._device_free()
                self._fail(batch, err)
                self._record(batch, self._stats(batch, queue_s, build_s, started - ready_at, loop.time() - started,
                                                ok=False), err)
                continue
            self._device_free()
            for part, result in zip(batch, results):
                if not part.future.done():
                    part.future.set_result(result)
            self._record(batch, self._stats(batch, queue_s, build_s, started - ready_at, loop.time() - started))

    def _device_free(self) -> None:
        """The batch on the device ended: the next one is formed now, if it is not yet (`_formation_due`)."""
        self._running_end = None
        self._arrived.set()

    async def _formation_due(self) -> None:
        """Return when the next batch should be formed: at once while the device is idle, or has no recent rate
        yet, or the queue already holds a batch's budget; else when the running batch is about to end (its
        expected end, at the recent rate, less `BatcherStats.build_lead_s`) or ends. Formed at the start of the
        batch before it, a batch would hold only the requests queued then, though every request that arrives while
        the device is busy waits for the device anyway: closed-loop clients then split into three small batches
        (running, prepared, forming; 2.7 of 8 clients' 8-document requests a batch, `bench/serve_bench.py`)
        instead of two larger ones that share more."""
        loop = asyncio.get_running_loop()
        while self._running_end is not None and self._queued_cost < self.max_batch_tokens:
            remaining = self._running_end - self.stats.build_lead_s() - loop.time()
            if remaining <= 0 or not await self._woken_within(remaining):
                return

    async def _woken_within(self, seconds: float) -> bool:
        """Wait at most `seconds` for the next arrival or the device's end (`_arrived`, cleared first); False when
        the time ran out. Not `asyncio.wait_for`: cancelled just as the event is set, it returns, the cancellation
        is lost, and `close` waits for the loop forever."""
        self._arrived.clear()
        try:
            async with asyncio.timeout(seconds):
                await self._arrived.wait()
        except TimeoutError:
            return False
        return True

    def _should_return(self, batch: list[_Part], now: float) -> bool:
        """A prepared batch that holds a part of a finished request (cancelled or failed: its work is not done), or
        only later classes while a class-0 part waits."""
        if any(part.request.done for part in batch):
            return True
        return min(self._class(part, now) for part in batch) > 0 and \
            any(self._class(part, now) == 0 for part in self._queue)

    def _return(self, batch: list[_Part]) -> None:
        """Put a prepared batch's live parts back in the queue, in arrival order; it never ran."""
        self._inflight_cost -= sum(part.cost for part in batch)
        live = [part for part in batch if not part.request.done]
        self._queue = sorted(self._queue + live, key=lambda part: part.seq)
        self._count_queued(live, +1)
        if live:
            self._arrived.set()

    async def _next_batch(self) -> list[_Part]:
        """Wait until the budget is reached or the oldest waiting part times out (at once when it came alone), then
        take a batch."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            while self._queue and self._queued_cost < self.max_batch_tokens and not self._queue[0].request.alone:
                remaining = self._queue[0].request.enqueued + self.wait_timeout_s - loop.time()  # arrival order
                if remaining <= 0:
                    break
                if not await self._woken_within(remaining):
                    break
            if self._queue:  # empty when every waiting caller cancelled meanwhile
                return self._take(loop.time())

    def _class(self, part: _Part, now: float) -> int:
        """The part's priority class, 0 once it has waited `aging_s`."""
        return 0 if now - part.request.enqueued >= self.aging_s else part.request.priority

    def _take(self, now: float) -> list[_Part]:
        """By class, then the first group of the class first, then other groups by their oldest part; first fit in
        the budget."""
        classes = [self._class(part, now) for part in self._queue]
        group_rank: dict[tuple[int, Hashable], int] = {}
        for part, klass in zip(self._queue, classes):
            group_rank.setdefault((klass, part.request.group), len(group_rank))
        order = sorted(range(len(self._queue)),
                       key=lambda i: (classes[i], group_rank[classes[i], self._queue[i].request.group], i))
        taken, total = [], 0
        for i in order:
            n = self._queue[i].cost
            if total + n <= self.max_batch_tokens or not taken:  # the first goes even when over budget
                taken.append(i)
                total += n
            if total >= self.max_batch_tokens:
                break
        chosen = set(taken)
        batch = [self._queue[i] for i in taken]
        self._queue = [part for i, part in enumerate(self._queue) if i not in chosen]
        self._inflight_cost += sum(part.cost for part in batch)
        self._count_queued(batch, -1)
        return batch

    def _queue_changed(self) -> None:
        if self.observer is not None:
            self.observer.queue_changed(len(self._queue), self._queued_tokens)

    def _record(self, batch: list[_Part], stats: BatchStats, err: Exception | None = None) -> None:
        """Count the batch, tell the observer, and log it: DEBUG when it ran, WARNING (once for all its requests)
        when it failed."""
        self.stats.record(stats)
        self._inflight_cost -= sum(part.cost for part in batch)
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

    @staticmethod
    def _stats(batch: list[_Part], queue_s: float, build_s: float, wait_s: float, forward_s: float,
               ok: bool = True) -> BatchStats:
        return BatchStats(num_items=len(batch), num_tokens=sum(part.num_tokens for part in batch),
                          work_tokens=sum(part.cost for part in batch),
                          num_keys=len({part.request.group for part in batch}), queue_s=queue_s, build_s=build_s,
                          wait_s=wait_s, forward_s=forward_s, ok=ok,
                          request_ids=tuple(dict.fromkeys(part.request.request_id for part in batch
                                                          if part.request.request_id)))

    @staticmethod
    def _fail(batch: list[_Part], err: BaseException) -> None:
        for part in batch:
            if not part.future.done():
                part.future.set_exception(err)
