"""What travels from the ingress to the engine for one request: its price (the work the device will do), its
priority class, and the all-or-none fan-out of a call made of several task calls."""

from __future__ import annotations

import asyncio

import pytest

from deployments.engine_request import EngineRequest, Priority
from deployments.request_path import gather_or_cancel
from radix_core.tasks.rerank import RerankJob
from radix_core.tokens import TokenSequences


def rerank_job(shared: list[int], suffixes: list[list[int]]) -> RerankJob:
    sequences = TokenSequences.from_lists([shared + suffix for suffix in suffixes])
    return RerankJob(sequences, len(shared), answer_ids=None, raw_scores=False, top_n=None, documents=None,
                     chunks=None, pool="max")


def test_a_request_is_priced_with_its_shared_prefix_once_per_part():
    shared = list(range(50))  # template + query
    parts = [rerank_job(shared, [[100 + i] * 10 for i in range(3)]), rerank_job(shared, [[200] * 7])]
    request = EngineRequest.of(parts, "key", Priority.BATCH)
    assert [part.work_tokens for part in parts] == [50 + 30, 50 + 7]
    assert request.cost == 137 and sum(part.num_tokens for part in parts) == 3 * 60 + 57
    assert (request.prefix_key, request.priority) == ("key", Priority.BATCH)


@pytest.mark.parametrize(("value", "priority"), [(None, Priority.INTERACTIVE), ("", Priority.INTERACTIVE),
                                                 ("interactive", Priority.INTERACTIVE), (" Batch ", Priority.BATCH)])
def test_priority_is_parsed_from_its_name(value, priority):
    assert Priority.parse(value) is priority


def test_an_unknown_priority_names_the_choices():
    with pytest.raises(ValueError, match="priority must be 'interactive' or 'batch', got 'urgent'"):
        Priority.parse("urgent")


def test_the_first_failure_cancels_the_other_calls():
    async def main():
        cancelled = asyncio.Event()

        async def slow():
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async def failing():
            await asyncio.sleep(0)
            raise ValueError("query 2: documents[0] is empty")

        with pytest.raises(ValueError, match="query 2"):
            await gather_or_cancel([slow(), failing()])
        await asyncio.wait_for(cancelled.wait(), 1)
        assert await gather_or_cancel([asyncio.sleep(0, result=1), asyncio.sleep(0, result=2)]) == [1, 2]

    asyncio.run(asyncio.wait_for(main(), 10))

