"""`IndexBuilder`: the CPU half of an engine batch that remains after the ingress tokenized every request, in its
own Ray actor so it overlaps the device half.

One actor per engine replica, created by it. For a batch of jobs (token ids, encoded and validated by the
ingress) it concatenates their sequences, checks them against the model's limits, builds the radix index and
resolves the radix mode (`radix_core.batch.prepare_batch`). The replica runs batch k on the device while this
actor builds batch k+1.

It is an async actor that builds in a worker thread, so its `ping` (the replica's health probe of it) is answered
while a build runs: a synchronous actor runs one method at a time, and a long build would get a healthy builder
replaced. (The Rust trie builder holds the GIL for its one call, about 0.2 s per 2 M tokens; the rest releases it
often.)
"""

from __future__ import annotations

import asyncio

from radix_core.batch import BatchLimits, PreparedBatch, prepare_batch
from radix_core.tasks import TaskJob
from radix_core.tokens import TokenSequences


def build_batch(limits: BatchLimits, radix: str, jobs: list[TaskJob]) -> PreparedBatch:
    """The prepared batch of the jobs' concatenated sequences, in job order; the actor's work, callable inline too
    (the pipeline benchmark's baseline)."""
    return prepare_batch(TokenSequences.concat([job.sequences for job in jobs]), radix, limits)


class IndexBuilder:
    """The actor: holds the model's limits and the radix mode; no weights, no tokenizer. What a replica's batches
    computed is counted by the replica (`EngineReplica.info`), which also builds the batches formed while it idles."""

    def __init__(self, limits: BatchLimits, radix: str):
        self.limits = limits
        self.radix = radix

    async def build(self, jobs: list[TaskJob]) -> PreparedBatch:
        return await asyncio.to_thread(build_batch, self.limits, self.radix, jobs)

    def ping(self) -> bool:
        return True
