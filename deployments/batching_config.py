"""`BatchingConfig`: how an engine replica batches, queues and refuses work (`batching:` in `serve_config.yaml`).

The batcher (`deployments.batcher.TokenBudgetBatcher`) and the replica that runs it (`deployments.engine_replica`)
read it; each default is written here once.
"""

from __future__ import annotations

from dataclasses import dataclass

INDEX_BUILDERS = ("actor", "inline")
DEFAULT_PRIORITY_AGING_S = 30.0
QUEUED_BATCHES = 64  # max_queued_tokens when unset: this many full batches of work


@dataclass(frozen=True)
class BatchingConfig:
    """The engine replica's batching, checked when made.

    `max_batch_tokens`: budget of one engine batch, in the rows it computes: each request part's input tokens with
    its shared prefix counted once, less the rows of that prefix the replica's prefix cache holds. A batch the engine
    runs without sharing (mode `off`), or whose attention it runs per sequence (`mlp`), holds every input token in
    its attention: more than the budget where much of the batch is shared. `batch_wait_timeout_s`: longest a request
    waits for its batch to fill (0 to 10 s). `index_builder`: "actor" indexes batch k+1 in a per-replica actor
    while batch k runs (a batch formed while none runs on the replica's compute thread); "inline" builds each batch
    just before running it (for comparison).

    `max_queued_tokens`: work one replica queues before refusing more requests at once with RESOURCE_EXHAUSTED
    and a retry hint, in rows the device will compute (a request's shared prefix counts once). A request is
    admitted or refused whole, and never while the replica's queue is empty, so any request the request limits
    accept runs on an idle replica. None: QUEUED_BATCHES x `max_batch_tokens`.
    `max_queue_wait_s`: a replica refuses a request at once (RESOURCE_EXHAUSTED with a retry hint) when more than
    this many seconds of work are ahead of it (running, prepared and queued work at its recent rate) and its
    queue is not empty: the queueing an accepted request may see under overload (a latency bound: lower it where
    latency matters more than full batches). None: bounded by `max_queued_tokens` only.
    `batch_priority_aging_s`: requests sent with priority batch run after interactive ones (they only fill what
    interactive work leaves of a batch) until they have waited this long; then they count as interactive, so bulk
    work is never starved.
    """

    max_batch_tokens: int = 16384
    batch_wait_timeout_s: float = 0.01
    index_builder: str = "actor"
    max_queued_tokens: int | None = None
    max_queue_wait_s: float | None = None
    batch_priority_aging_s: float = DEFAULT_PRIORITY_AGING_S

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be at least 1, got {self.max_batch_tokens}")
        if not 0.0 <= self.batch_wait_timeout_s <= 10.0:
            raise ValueError(f"batch_wait_timeout_s must be between 0 and 10 s, got {self.batch_wait_timeout_s}")
        if self.index_builder not in INDEX_BUILDERS:
            raise ValueError(f"unknown index_builder {self.index_builder!r}: choose one of {', '.join(INDEX_BUILDERS)}")
        if self.max_queued_tokens is not None and self.max_queued_tokens < 1:
            raise ValueError(f"max_queued_tokens must be at least 1 (or unset), got {self.max_queued_tokens}")
        for name in ("max_queue_wait_s", "batch_priority_aging_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be above 0 s, got {value}")

    @property
    def queued_token_bound(self) -> int:
        """`max_queued_tokens`, or QUEUED_BATCHES batches' worth."""
        return self.max_queued_tokens if self.max_queued_tokens is not None else QUEUED_BATCHES * self.max_batch_tokens

    @property
    def pipelined(self) -> bool:
        """Whether an IndexBuilder actor builds the next batch while one runs (`index_builder: actor`)."""
        return self.index_builder == "actor"
