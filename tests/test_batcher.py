"""Token-budget batching: budget, timeout, prefix grouping, oversize items, per-request results, failures,
the queue bound, and the prepare/run pipeline (checked with events, not timings)."""

import asyncio
import pickle

import pytest

from deployments.batcher import QueueFullError, TokenBudgetBatcher


def run(coro, timeout_s=10.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


class Recorder:
    """`run_batch` that records each batch and answers `item.upper()` per item."""

    def __init__(self):
        self.batches: list[list[str]] = []

    async def __call__(self, items):
        self.batches.append(list(items))
        return [item.upper() for item in items]


class Held(Recorder):
    """A `Recorder` whose batches stay on the device until `release` is set; `started` lists the batches that
    reached the device, `prepared` those its `prepare` built. `forward_s` of simulated compute runs first, so the
    batcher measures a rate."""

    def __init__(self, forward_s: float = 0.0):
        super().__init__()
        self.forward_s = forward_s
        self.started: list[list[str]] = []
        self.prepared: list[list[str]] = []
        self.release = asyncio.Event()

    async def prepare(self, items):
        self.prepared.append(list(items))
        return items

    async def __call__(self, items):
        self.started.append(list(items))
        await asyncio.sleep(self.forward_s)
        await self.release.wait()
        return await super().__call__(items)


async def until(condition, turns: int = 1000) -> None:
    """Yield to the event loop until `condition()` holds (at most `turns` times): synchronisation on the batcher's
    state, never on the clock."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not reached in {turns} event-loop turns")


async def one(batcher, item, num_tokens, key=None, **options):
    """The result of a request of one part."""
    (result,) = await batcher.submit([item], [num_tokens], prefix_key=key, **options)
    return result


async def submit_all(batcher, requests):
    """Submit one-part requests `(item, tokens, key)` in order, all before the batcher's loop first runs; gather the
    results."""
    tasks = [asyncio.create_task(one(batcher, item, n, key)) for item, n, key in requests]
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_batches_close_at_the_token_budget():
    async def main():
        rec = Recorder()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=6, wait_timeout_s=3600.0)
        tasks = [asyncio.create_task(one(batcher, f"i{k}", 3)) for k in range(4)]
        # counted in event-loop turns, not seconds: a batch that waited for its hour-long timeout never comes
        await until(lambda: len(rec.batches) == 2)
        assert rec.batches == [["i0", "i1"], ["i2", "i3"]]  # each closed when it held exactly the budget
        assert await asyncio.gather(*tasks) == ["I0", "I1", "I2", "I3"]
        await batcher.close()

    run(main())


def test_the_budget_counts_the_work_a_part_computes_not_its_input_tokens():
    """Parts of 80 input tokens whose sequences share a prefix cost 30 rows each: a budget of 90 closes on three of
    them (the rows the device computes), where counting input tokens would run them one by one."""
    async def main():
        rec = Recorder()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=90, wait_timeout_s=3600.0)
        request = asyncio.create_task(batcher.submit([f"p{k}" for k in range(6)], [80] * 6, [30] * 6, "query"))
        await until(lambda: len(rec.batches) == 1)
        assert rec.batches == [["p0", "p1", "p2"]]  # 90 rows: the budget
        assert [stats.num_tokens for stats in batcher.stats.recent] == [240]
        await until(lambda: len(rec.batches) == 2)
        assert rec.batches[1] == ["p3", "p4", "p5"]
        assert await request == [f"P{k}" for k in range(6)]
        await batcher.close()

    run(main())


def test_partial_batch_closes_after_the_timeout():
    async def main():
        rec = Recorder()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=1000, wait_timeout_s=0.05)
        assert await one(batcher, "only", 5, "k") == "ONLY"
        assert rec.batches == [["only"]]
        (stats,) = batcher.stats.recent
        assert stats.queue_s >= 0.045 and stats.num_tokens == 5 and stats.ok
        await batcher.close()

    run(main())


def test_requests_that_come_one_at_a_time_do_not_wait_for_company():
    async def main():
        rec = Recorder()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=10, wait_timeout_s=3600.0)
        assert await one(batcher, "full", 10) == "FULL"  # the budget closes the first: nothing to go by yet
        # it found the replica idle, and so does this one: their traffic is one request at a time
        lone = asyncio.create_task(one(batcher, "lone", 1))
        await until(lambda: len(rec.batches) == 2)  # in event-loop turns, not the hour-long timeout
        assert await lone == "LONE"
        next_lone = asyncio.create_task(one(batcher, "next", 1))
        await until(lambda: len(rec.batches) == 3)
        assert await next_lone == "NEXT"
        await batcher.close()

    run(main())


def test_a_request_that_finds_company_waits_for_its_batch_to_fill():
    async def main():
        rec = Held()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=4, wait_timeout_s=3600.0)
        rec.release.set()
        assert await one(batcher, "full", 4) == "FULL"
        rec.release.clear()
        first = asyncio.create_task(one(batcher, "a", 4))  # alone: runs at once, held on the device
        await until(lambda: len(rec.started) == 2)
        # these arrive while a batch runs: they wait for the budget (or the timeout), not the device's idleness
        waiting = [asyncio.create_task(one(batcher, f"w{i}", 1)) for i in range(3)]
        for _ in range(50):
            await asyncio.sleep(0)
        assert batcher.queued_items == 3
        rec.release.set()
        last = asyncio.create_task(one(batcher, "w3", 1))  # the fourth fills the budget
        assert await asyncio.gather(first, *waiting, last) == ["A", "W0", "W1", "W2", "W3"]
        assert rec.batches[-1] == ["w0", "w1", "w2", "w3"]
        await batcher.close()

    run(main())


def test_same_prefix_key_items_share_a_batch():
    async def main():
        rec = Recorder()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=6, wait_timeout_s=0.05)
        requests = [("a1", 2, "A"), ("b1", 2, "B"), ("a2", 2, "A"), ("c1", 2, "C"), ("b2", 2, "B"), ("a3", 2, "A")]
        results = await submit_all(batcher, requests)
        assert results == ["A1", "B1", "A2", "C1", "B2", "A3"]  # each caller gets its own result
        # the oldest item's group first, then groups in the order their oldest item arrived
        assert rec.batches == [["a1", "a2", "a3"], ["b1", "b2", "c1"]]
        assert [s.num_keys for s in batcher.stats.recent] == [1, 2]
        await batcher.close()

    run(main())


def test_oversize_item_runs_alone():
    async def main():
        rec = Recorder()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=10, wait_timeout_s=0.05)
        results = await submit_all(batcher, [("s1", 3, None), ("big", 25, None), ("s2", 3, None), ("big2", 30, None)])
        assert results == ["S1", "BIG", "S2", "BIG2"]
        # small items do not wait behind the big one; each big one runs alone once it is the oldest
        assert rec.batches == [["s1", "s2"], ["big"], ["big2"]]
        await batcher.close()

    run(main())


def test_a_failing_batch_fails_only_its_own_requests():
    async def run_batch(items):
        if "bad" in items:
            raise RuntimeError("device error")
        return [item.upper() for item in items]

    async def main():
        batcher = TokenBudgetBatcher(run_batch, max_batch_tokens=4, wait_timeout_s=0.05)
        results = await submit_all(batcher, [("x", 2, "K"), ("bad", 2, "K"), ("y", 2, "L"), ("z", 2, "L")])
        assert isinstance(results[0], RuntimeError) and isinstance(results[1], RuntimeError)
        assert results[2:] == ["Y", "Z"]
        assert await one(batcher, "later", 1) == "LATER"  # still serving
        assert batcher.stats.num_failed_batches == 1 and batcher.stats.num_batches == 3
        await batcher.close()

    run(main())


def test_prepare_failure_and_wrong_result_count_fail_that_batch():
    async def prepare(items):
        if "unindexable" in items:
            raise ValueError("index build failed")
        return items

    async def run_batch(items):
        return [] if "short" in items else [item.upper() for item in items]

    async def main():
        batcher = TokenBudgetBatcher(run_batch, max_batch_tokens=2, wait_timeout_s=0.05, prepare=prepare)
        results = await submit_all(batcher, [("unindexable", 2, None), ("short", 2, None), ("ok", 2, None)])
        assert isinstance(results[0], ValueError) and "index build failed" in str(results[0])
        assert isinstance(results[1], ValueError) and "returned 0 results for a batch of 1" in str(results[1])
        assert results[2] == "OK"
        await batcher.close()

    run(main())


def test_next_batch_is_prepared_while_the_current_one_runs():
    async def main():
        prepared: list[list[str]] = []
        batch_prepared = [asyncio.Event() for _ in range(3)]
        running = asyncio.Event()
        release = asyncio.Event()

        async def prepare(items):
            prepared.append(list(items))
            batch_prepared[len(prepared) - 1].set()
            return items

        async def run_batch(items):
            running.set()
            await release.wait()
            return items

        batcher = TokenBudgetBatcher(run_batch, max_batch_tokens=1, wait_timeout_s=0.0, prepare=prepare)
        first = asyncio.create_task(one(batcher, "k0", 1))
        await running.wait()  # batch 0 is on the device, held there
        second = asyncio.create_task(one(batcher, "k1", 1))
        await batch_prepared[1].wait()  # batch 1 was built while batch 0 still runs
        assert not first.done() and running.is_set()
        third = asyncio.create_task(one(batcher, "k2", 1))
        for _ in range(20):  # plenty of loop turns: batch 2 must not be built while batch 1 waits
            await asyncio.sleep(0)
        assert not batch_prepared[2].is_set() and batcher.queued_items == 1
        release.set()
        assert await asyncio.gather(first, second, third) == ["k0", "k1", "k2"]
        assert prepared == [["k0"], ["k1"], ["k2"]]
        assert batcher.stats.recent[1].wait_s > 0  # batch 1 waited for the device: its build was hidden
        await batcher.close()

    run(main())


def test_queue_bound_counts_work_and_refuses_a_request_whole():
    async def main():
        rec = Held()

        batcher = TokenBudgetBatcher(rec, max_batch_tokens=1, wait_timeout_s=0.0, max_queued_tokens=50)
        tasks = [asyncio.create_task(one(batcher, f"r{i}", 1)) for i in range(2)]
        await until(lambda: len(rec.started) == 1 and batcher.queued_items == 0)  # r0 runs (held), r1 waits
        # 60 parts of 10 tokens, priced 1 each (a shared prefix counted once): admitted though over the bound
        big = asyncio.create_task(batcher.submit([f"b{i}" for i in range(60)], [10] * 60, [1] * 60))
        await until(lambda: batcher.queued_items == 60)
        assert batcher.queued_tokens == 600
        with pytest.raises(QueueFullError, match="60 tokens of work queued . 2 for this request > max_queued_tokens=50"
                           ) as refused:
            await batcher.submit(["x", "y"], [1, 1])
        assert batcher.queued_items == 60  # refused whole: none of its parts was queued
        assert refused.value.retry_after_s == 1.0  # no batch has run yet: no rate to estimate from
        again = pickle.loads(pickle.dumps(refused.value))  # it is returned across Ray processes
        assert (str(again), again.retry_after_s) == (str(refused.value), 1.0)
        rec.release.set()
        assert await asyncio.gather(*tasks) == ["R0", "R1"]
        assert await big == [f"B{i}" for i in range(60)]
        await batcher.close()

    run(main())


def test_a_request_larger_than_every_bound_runs_on_an_idle_replica():
    async def main():
        rec = Recorder()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=4, wait_timeout_s=0.0, max_queued_tokens=5,
                                     max_queue_wait_s=0.001)
        assert await one(batcher, "warm", 4) == "WARM"  # a rate, so the wait bound is armed
        assert await batcher.submit(list("abcdefgh"), [2] * 8) == list("ABCDEFGH")
        assert rec.batches[1:] == [["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]]  # cut into budget batches
        await batcher.close()

    run(main())


def test_cancelled_request_leaves_the_queue():
    async def main():
        rec = Recorder()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=100, wait_timeout_s=5.0)
        gone = asyncio.create_task(one(batcher, "gone", 7))
        await until(lambda: batcher.queued_tokens == 7)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert batcher.queued_tokens == 0 and batcher.queued_items == 0
        await batcher.close()
        assert rec.batches == []

    run(main())


def test_close_fails_waiting_requests_and_rejects_new_ones():
    async def main():
        batcher = TokenBudgetBatcher(Recorder(), max_batch_tokens=100, wait_timeout_s=5.0)
        waiting = asyncio.create_task(one(batcher, "w", 1))
        await until(lambda: batcher.queued_items == 1)
        await batcher.close()
        with pytest.raises(RuntimeError, match="closed before this request ran"):
            await waiting
        with pytest.raises(RuntimeError, match="batcher is closed"):
            await one(batcher, "late", 1)

    run(main())


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_batch_tokens"):
        TokenBudgetBatcher(Recorder(), max_batch_tokens=0, wait_timeout_s=0.01)
    batcher = TokenBudgetBatcher(Recorder(), max_batch_tokens=8, wait_timeout_s=0.01)
    with pytest.raises(ValueError, match="token counts and costs must be >= 1"):
        run(batcher.submit(["x"], [0]))
    with pytest.raises(ValueError, match="got 0 items"):
        run(batcher.submit([], []))
    with pytest.raises(ValueError, match="got 2 items, 1 counts"):
        run(batcher.submit(["x", "y"], [1]))


def test_the_retry_hint_is_the_queue_drain_time_at_the_recent_rate():
    async def main():
        rec = Held(forward_s=0.05)
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=100, wait_timeout_s=0.0, max_queued_tokens=150,
                                     prepare=rec.prepare)
        rec.release.set()
        assert await one(batcher, "warm", 100) == "WARM"  # 100 tokens in about 0.05 s of forward
        rec.release.clear()
        rate = batcher.stats.work_per_second()
        held = [asyncio.create_task(one(batcher, "r0", 100))]
        await until(lambda: len(rec.started) == 2)  # r0 runs
        held.append(asyncio.create_task(one(batcher, "r1", 100)))
        await until(lambda: len(rec.prepared) == 3)  # r1 waits for the device
        held.append(asyncio.create_task(one(batcher, "r2", 100)))
        await until(lambda: batcher.queued_tokens == 100)  # r2 is queued
        with pytest.raises(QueueFullError) as refused:
            await one(batcher, "over", 100)
        assert refused.value.retry_after_s == pytest.approx(300 / rate)  # running, prepared and queued
        assert f"retry in about {refused.value.retry_after_s:.1f} s" in str(refused.value)
        rec.release.set()
        assert await asyncio.gather(*held) == ["R0", "R1", "R2"]
        await batcher.close()

    run(main())


def test_work_ahead_beyond_the_wait_bound_is_refused_with_the_time_until_it_fits():
    async def main():
        rec = Held(forward_s=0.1)
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=100, wait_timeout_s=0.0, max_queue_wait_s=0.25)
        rec.release.set()
        assert await one(batcher, "warm", 100) == "WARM"  # about 1000 tokens/s from now on
        rec.release.clear()
        rate = batcher.stats.work_per_second()
        held = [asyncio.create_task(one(batcher, "running", 100))]
        await until(lambda: len(rec.started) == 2)
        # "prepared" arrives at an empty queue; "queued" finds 0.2 s of work ahead (running and queued): admitted
        held += [asyncio.create_task(one(batcher, name, 100)) for name in ("prepared", "queued")]
        await until(lambda: batcher.queued_tokens == 100)  # "prepared" was taken and waits for the device
        with pytest.raises(QueueFullError, match="max_queue_wait_s=0.25") as refused:
            await one(batcher, "fourth", 100)  # 0.3 s ahead
        assert refused.value.retry_after_s == pytest.approx(300 / rate - 0.25)
        rec.release.set()
        assert await asyncio.gather(*held) == ["RUNNING", "PREPARED", "QUEUED"]
        assert await one(batcher, "after", 100) == "AFTER"  # nothing ahead any more
        await batcher.close()

    run(main())


def test_cancelling_a_request_removes_all_its_parts_and_its_prepared_batch_does_not_run():
    async def main():
        rec = Held()

        batcher = TokenBudgetBatcher(rec, max_batch_tokens=2, wait_timeout_s=0.0)
        running = asyncio.create_task(one(batcher, "first", 2))
        await until(lambda: len(rec.started) == 1)
        big = asyncio.create_task(batcher.submit([f"b{i}" for i in range(6)], [1] * 6, prefix_key="K"))
        small = asyncio.create_task(one(batcher, "small", 1, "K"))  # shares big's prepared batch
        await until(lambda: batcher.queued_items == 5)  # b0, b1 prepared and waiting for the device, the rest queued
        big.cancel()
        with pytest.raises(asyncio.CancelledError):
            await big
        assert batcher.queued_items == 1  # only small's part is left
        rec.release.set()
        assert await running == "FIRST" and await small == "SMALL"
        assert rec.batches == [["first"], ["small"]]  # the prepared batch of b0, b1 never ran
        await batcher.close()

    run(main())


def test_a_failed_part_drops_the_rest_of_its_request():
    async def main():
        rec = Recorder()

        async def run_batch(items):
            if "bad" in items:
                raise RuntimeError("device error")
            return await rec(items)

        batcher = TokenBudgetBatcher(run_batch, max_batch_tokens=1, wait_timeout_s=0.0)
        with pytest.raises(RuntimeError, match="device error"):
            await batcher.submit(["bad", "x", "y", "z"], [1] * 4)
        assert batcher.queued_items == 0
        assert await one(batcher, "next", 1) == "NEXT"
        assert ["y"] not in rec.batches and ["z"] not in rec.batches  # at most the prepared part ran
        await batcher.close()

    run(main())


def test_interactive_parts_go_first_and_batch_work_is_put_back_for_them():
    async def main():
        rec = Held()

        batcher = TokenBudgetBatcher(rec, max_batch_tokens=2, wait_timeout_s=0.0)
        bulk = asyncio.create_task(batcher.submit([f"b{i}" for i in range(4)], [1] * 4, priority=1))
        await until(lambda: len(rec.started) == 1 and batcher.queued_items == 0)  # b0, b1 held, b2, b3 prepared
        urgent = asyncio.create_task(batcher.submit(["u0", "u1"], [1, 1]))
        await until(lambda: batcher.queued_items == 2)
        rec.release.set()
        assert await urgent == ["U0", "U1"] and await bulk == ["B0", "B1", "B2", "B3"]
        # the prepared bulk batch was put back: interactive work waited only for the batch on the device
        assert rec.batches == [["b0", "b1"], ["u0", "u1"], ["b2", "b3"]]
        await batcher.close()

    run(main())


def test_batch_priority_ages_into_interactive():
    async def main():
        rec = Recorder()
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=2, wait_timeout_s=0.05, aging_s=0.02)
        bulk = asyncio.create_task(batcher.submit(["old"], [2], priority=1))
        await asyncio.sleep(0.03)  # older than aging_s: it now counts as interactive
        fresh = asyncio.create_task(batcher.submit(["new"], [2]))
        assert await bulk == ["OLD"] and await fresh == ["NEW"]
        assert rec.batches == [["old"], ["new"]]  # arrival order among equals: not starved
        await batcher.close()

    run(main())


def test_requests_that_arrive_while_the_device_is_busy_share_the_next_batch():
    """The next batch is formed when the running one should end (its work at the recent rate), not when it starts:
    two requests that arrive one after the other during the forward run together, where the batch formed at once
    would have held the first alone (`wait_timeout_s` 0)."""
    async def main():
        rec = Held(forward_s=0.5)
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=1000, wait_timeout_s=0.0, prepare=rec.prepare)
        rec.release.set()
        assert await one(batcher, "warm", 100) == "WARM"  # about 200 tokens/s: the next 100 take ~0.5 s
        rec.release.clear()
        held = [asyncio.create_task(one(batcher, "running", 100))]
        await until(lambda: len(rec.started) == 2)
        held.append(asyncio.create_task(one(batcher, "a", 100)))
        await until(lambda: batcher.queued_items == 1)
        for _ in range(10):
            await asyncio.sleep(0)
        assert batcher.queued_items == 1 and rec.prepared[-1] == ["running"]  # "a" is not formed alone
        held.append(asyncio.create_task(one(batcher, "b", 100)))
        for _ in range(1000):  # formed near the running one's end, ~0.5 s from its start (at most 10 s here)
            if rec.prepared[-1] == ["a", "b"]:
                break
            await asyncio.sleep(0.01)
        assert rec.prepared[-1] == ["a", "b"]
        rec.release.set()
        assert await asyncio.gather(*held) == ["RUNNING", "A", "B"]
        assert rec.batches == [["warm"], ["running"], ["a", "b"]]
        await batcher.close()

    run(main())


def test_a_batch_that_ends_before_its_expected_end_has_the_next_one_formed_at_once():
    """The running batch's expected end is an estimate: when the device frees earlier, the waiting request's batch
    is formed then, within a few event-loop turns, not when the estimate says."""
    async def main():
        rec = Held(forward_s=0.5)
        batcher = TokenBudgetBatcher(rec, max_batch_tokens=1000, wait_timeout_s=0.0)
        rec.release.set()
        assert await one(batcher, "warm", 100) == "WARM"  # 200 tokens/s: the next 100 should take 0.5 s
        rec.release.clear()
        rec.forward_s = 0.0
        running = asyncio.create_task(one(batcher, "running", 100))
        await until(lambda: len(rec.started) == 2)
        waiting = asyncio.create_task(one(batcher, "waiting", 100))
        await until(lambda: batcher.queued_items == 1)
        rec.release.set()
        await until(lambda: len(rec.started) == 3)  # ~1,000 turns: far less than the 0.5 s estimate
        assert await running == "RUNNING" and await waiting == "WAITING"
        await batcher.close()

    run(main())
