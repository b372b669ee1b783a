"""`EngineRequest`: what the ingress sends the engine deployment for one client request, in one handle call.

    reply = await engine.submit.remote(EngineRequest.of(parts, prefix_key(job), priority, cache_scope()))

One call per client request, whatever its size: the replica admits all of its parts or refuses all of them
(`deployments.batcher`), its batcher cuts them into batches, and cancelling the call (the client went away, its
deadline passed, a sibling call failed) removes every part still queued. The router reads the same object from
the handle call (`PendingRequest.args[0]`) for the prefix key and the work it weighs.

`Priority` is the request's class: `interactive` (the default) runs before `batch` (bulk ingest, offline jobs),
which only fills what interactive work leaves of a batch until it has waited `batch_priority_aging_s`.

`cache_scope` is the tree of the replica's prefix cache the request's sequences read and fill: its API key's digest
(`deployments.auth.cache_scope`), or None for the shared tree.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from radix_core.errors import RequestError
from radix_core.tasks import TaskJob

PRIORITY_HEADER = "x-radixserve-priority"  # HTTP header or gRPC metadata: interactive | batch


class Priority(enum.IntEnum):
    """Lower runs first."""

    INTERACTIVE = 0
    BATCH = 1

    @classmethod
    def parse(cls, value: str | None) -> Priority:
        """`interactive` or `batch` (any case); None or "" is interactive. A RequestError names the choices."""
        if value is None or value == "":
            return cls.INTERACTIVE
        name = value.strip().upper() if isinstance(value, str) else None
        if name not in cls.__members__:
            shown = repr(value[:40]) if isinstance(value, str) else f"a value of type {type(value).__name__}"
            raise RequestError(f"priority must be 'interactive' or 'batch', got {shown}", field="priority")
        return cls[name]


@dataclass(frozen=True)
class EngineRequest:
    """A request's token-bounded parts (`Task.split`), all starting with the request's shared prefix.

    `cost` is the work the device will do for it, in rows: each part's shared prefix once, then every sequence's
    own tokens (`TaskJob.work_tokens`), so a 1000-document rerank of one query is not priced as 1000 copies of
    the query. Admission and the router's load count it; the batch budget counts the parts' input tokens.
    `prefix_cost` is the part of it that is the parts' shared prefixes: what a replica whose prefix cache holds the
    prefix does not compute (the router leaves it out of the load it counts on the key's owner)."""

    parts: tuple[TaskJob, ...]
    prefix_key: str | None  # hash of the shared prefix's token ids; None: placed by load alone
    cost: int
    priority: Priority = Priority.INTERACTIVE
    cache_scope: str | None = None  # the prefix cache tree: the API key's digest; None: the shared one
    prefix_cost: int = 0  # rows of `cost` that are the parts' shared prefixes

    @classmethod
    def of(cls, parts: Sequence[TaskJob], prefix_key: str | None, priority: Priority = Priority.INTERACTIVE,
           cache_scope: str | None = None) -> EngineRequest:
        return cls(tuple(parts), prefix_key, sum(part.work_tokens for part in parts), priority, cache_scope,
                   sum(part.shared_len for part in parts))
