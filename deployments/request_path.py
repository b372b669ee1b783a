"""The one path every request takes, whatever transport brought it: encode -> key -> submit -> merge.

    result = await path.answer(RerankRequest(query, documents), Priority.INTERACTIVE)

1. encode (a worker thread): the request's task (found by the request's type) checks it, renders its template and
   tokenizes it once (`Task.encode`), then cuts it into parts of at most `max_request_tokens` (`Task.split`);
   a bad request raises a `RequestError` here, before anything is queued;
2. key: `prefix_key`, a hash of the token ids every sequence of the request starts with (`TaskJob.shared_ids`: the
   template's system prompt, instruction and query for rerank, the instruction for embed, the few-shot prefix for
   classify, the context for score), exactly what the radix trie deduplicates. `PrefixAffinityRouter` sends one
   key to one engine replica (`placement.topology: split`), where the batcher puts the parts of one prefix into one
   batch;
3. submit: all parts in one engine call (`EngineRequest`: admitted, refused and cancelled as one), with the call's
   prefix cache scope (`deployments.auth.cache_scope`: its API key's digest, so tenants never read each other's
   cached K/V); the replica returns an overload refusal as a value (`QueueFullError`), raised here;
4. merge (a worker thread): the parts' results joined as if the request had run whole (`Task.merge`), its tokens
   counted into the request being metered (`count_usage`).

This module knows no transport: it takes a typed request (`radix_core.tasks.TaskRequest`) and a `Priority`, and
returns the task's result or raises. Each transport (`deployments.grpc_api`, `deployments.http`) maps its wire
format to a request and the errors to its own codes and field names.

A call cancelled by its client (a gRPC deadline or cancel, an HTTP disconnect: Ray Serve cancels the ingress call,
and with it the engine call it awaits) leaves the engine's queue; `answer_all`, for a client request made of several
task requests (a tei.v1 stream over several queries, TEI's /predict), cancels the others when one fails.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Sequence
from typing import Any

from deployments.auth import cache_scope
from deployments.batcher import QueueFullError
from deployments.engine_link import EngineLink
from deployments.engine_request import EngineRequest, Priority
from deployments.metrics import StageTrace, count_usage
from radix_core.tasks import Task, TaskContext, TaskJob, TaskRequest, task_for


class RequestPath:
    """The path of a request from its typed value to its result, over the `engine` link (`deployments.engine_link`:
    the engine deployment, or an engine replica in this process)."""

    def __init__(self, engine: EngineLink, context: TaskContext, max_request_tokens: int, trace: StageTrace):
        """`trace`: where each call's encode, engine and merge seconds go (`IngressMetrics.stages`)."""
        self.engine = engine
        self.context = context
        self.max_request_tokens = max_request_tokens
        self.trace = trace
        self.submitted_parts = 0  # parts sent to the engine by this replica

    async def answer(self, request: TaskRequest, priority: Priority = Priority.INTERACTIVE) -> Any:
        """The request's result: encode, key, submit, merge (the module docstring's steps), each stage timed."""
        task = task_for(request)
        with self.trace.stage("encode"):
            job, parts = await asyncio.to_thread(self._encode, task, request)
        self.submitted_parts += len(parts)
        with self.trace.stage("engine"):
            reply = await self.engine.submit(EngineRequest.of(parts, prefix_key(job), priority, cache_scope()))
        if isinstance(reply, QueueFullError):
            raise reply
        with self.trace.stage("merge"):
            result = await asyncio.to_thread(task.merge, job, reply)
        count_usage(result.usage)  # into the metered request this call answers (IngressMetrics)
        return result

    def _encode(self, task: Task, request: TaskRequest) -> tuple[TaskJob, list[TaskJob]]:
        job = task.encode(self.context, request)
        return job, task.split(job, self.max_request_tokens)


def prefix_key(job: TaskJob) -> str | None:
    """A stable hash (unlike Python's `hash`) of the ids every sequence of the job starts with; None without
    any, so requests that share nothing are placed by load alone."""
    shared = job.shared_ids
    if shared.size == 0:
        return None
    return hashlib.blake2b(shared.astype("<i4").tobytes(), digest_size=16).hexdigest()


async def answer_all(answer, requests: Sequence[TaskRequest], priority: Priority) -> list[Any]:
    """The results of several requests that answer one client call, all at once (`answer`: a `RequestPath.answer`
    or the server's); the first failure cancels the others."""
    return await gather_or_cancel([answer(request, priority) for request in requests])


async def gather_or_cancel(calls: list[Awaitable[Any]]) -> list[Any]:
    """`asyncio.gather(*calls)`, except that the first failure cancels the calls still running (gather lets them
    run on, computing for a request that has already failed)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
