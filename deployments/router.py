"""`PrefixAffinityRouter`: requests with one prefix key go to one engine replica, within bounded load.

Selected per deployment with

    RequestRouterConfig(request_router_class="deployments.router:PrefixAffinityRouter",
                        request_router_kwargs={"load_factor": 1.25, "virtual_nodes": 128, "min_load_tokens": 8192,
                                               "prefix_cache": True})

Contract with the caller (the ingress): the handle call's first argument is an `EngineRequest`
(`deployments.engine_request`), which Ray hands to the router in `PendingRequest.args` and then to the replica
method unchanged:

    engine.submit.remote(EngineRequest.of(parts, key, priority))

The router reads its `prefix_key` and weighs it by its `cost` (the work the device will do). A request without a
key is ranked least-loaded first; a call without an `EngineRequest` weighs one token.

**Keys stay where their K/V live.** With `prefix_cache` (the engine replicas keep a prefix cache,
`radix_core.prefix_cache`), a key's owner (its home, below) holds the key's shared prefix from the key's first
request there on, so a later request there computes only its own rows: its load on the owner is its `cost` less its
`prefix_cost`, on any other replica (and for the key's first request on its owner) its whole `cost`. Loads are then
what the devices compute, and the owner of a hot key takes its requests until its real outstanding work passes the
bound; counting the prefix on the owner too made it look fuller than it was and spilled requests to a replica that
computes the prefix again (bench/results/prefix_cache_bench.md). Without a cache the owner computes the prefix again
in each batch, so every request counts its whole cost. And a spill off the owner costs that prefix again, so with a
cache an owner that holds the prefix takes a request until its load passes the bound by more than the request's
`prefix_cost` (`HashRing.rank`'s `owner_slack`): a few-shot prompt of 1,024 rows stays with the replica that holds
it unless the imbalance is larger than the prompt, while an 8-document rerank's prefix of ~60 rows spills as the
plain bound says. A key's first request is counted whole and gets no slack: its prefix is nowhere yet. Counted
without its prompt, every request of `bench/prefix_cache_bench.py`'s `no reuse` stream (a new prompt each) weighed a
sixth of its work on its owner and could pass the bound by its prompt: the busier of the two replicas did 0.60 of
the work (0.50 without the cache), and the stream ran at 0.78-0.82x of the cache-off rate. So that a few hot keys do
not leave one replica with more of them than the other, with a prefix cache the key's owner is its home in
`KeyHomes` (`deployments.key_homes`): its ring owner at first, moved to the replica with the least recent work when
that evens the replicas' work out; without a cache every key stays on its ring owner.

Each handle owns one router (one per ingress replica), so loads are this router's view: the tokens it routed
that have not completed. Ray's own queue-length cache adds the replicas' view: a replica the cache says is at
`max_ongoing_requests` is tried last, and Ray skips it if a fresh probe still finds it full. Every rank holds
one replica, so Ray tries them strictly in order and backs off once the whole ranking has been refused. The
router deliberately leaves out Ray's `FIFOMixin`: with it, a replica chosen for one request's key may be handed
to an older request of another key.

`RouterMetrics` exports, from the ingress replica the router lives in, the distinct keys each engine replica got
recently, the keyed requests that spilled off their key's owner, and the keys moved.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from deployments.engine_request import EngineRequest
from deployments.hash_ring import DEFAULT_LOAD_FACTOR, DEFAULT_VIRTUAL_NODES, HashRing
from deployments.key_homes import KeyHomes
from deployments.metrics import RouterMetrics

if TYPE_CHECKING:
    from ray.serve.request_router import ReplicaResult

logger = logging.getLogger("ray.serve")

def engine_request(args: Sequence[Any]) -> EngineRequest | None:
    """The `EngineRequest` a handle call carries as its first argument, or None."""
    return args[0] if args and isinstance(args[0], EngineRequest) else None


def request_key(args: Sequence[Any]) -> str | None:
    """The prefix key a handle call carries, or None when it carries none."""
    request = engine_request(args)
    return request.prefix_key if request is not None and request.prefix_key else None


def request_weight(args: Sequence[Any], on_owner: bool = False) -> float:
    """The work a handle call carries, in tokens (1 when it carries no `EngineRequest`): on its key's owner, whose
    prefix cache holds the key's prefix, without the prefix."""
    request = engine_request(args)
    if request is None:
        return 1.0
    return float(max(request.cost - (request.prefix_cost if on_owner else 0), 1))


class PrefixAffinityRouter(RequestRouter):
    """Consistent hashing with bounded loads over the deployment's replicas, keyed by the request's prefix key."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ring = HashRing(virtual_nodes=DEFAULT_VIRTUAL_NODES)
        self._load_factor = DEFAULT_LOAD_FACTOR
        self._min_load_tokens = 0.0
        self._prefix_cache = False
        self._loads: dict[str, float] = {}  # replica unique_id -> outstanding tokens
        self._homes = KeyHomes()  # read only with a prefix cache
        self.metrics = RouterMetrics()

    def initialize_state(self, load_factor: float = DEFAULT_LOAD_FACTOR,
                         virtual_nodes: int = DEFAULT_VIRTUAL_NODES, min_load_tokens: float = 0,
                         prefix_cache: bool = False, **unknown):
        """Takes `RequestRouterConfig.request_router_kwargs`; `prefix_cache`: whether the replicas keep a prefix cache
        (`deployments.placement` passes it)."""
        if unknown:
            raise ValueError(f"PrefixAffinityRouter got unknown request_router_kwargs {sorted(unknown)}: "
                             "it takes load_factor, virtual_nodes, min_load_tokens, prefix_cache")
        if not load_factor >= 1.0:
            raise ValueError(f"load_factor must be >= 1.0, got {load_factor}")
        if min_load_tokens < 0:
            raise ValueError(f"min_load_tokens must be >= 0, got {min_load_tokens}")
        self._ring = HashRing(self._ring.members, virtual_nodes=virtual_nodes)
        self._load_factor = float(load_factor)
        self._min_load_tokens = float(min_load_tokens)
        self._prefix_cache = bool(prefix_cache)

    @property
    def loads(self) -> dict[str, float]:
        """Outstanding tokens per replica (unique_id) as this router sees them."""
        return dict(self._loads)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._sync_ring()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._sync_ring()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Ranks `[[preferred], [next], ...]`: ring order with bounded load, replicas known to be full last."""
        if not candidate_replicas:
            return []
        if pending_request is None:
            return [candidate_replicas]
        # Back off between full passes over the ranking instead of re-probing at once.
        pending_request.routing_context.should_backoff = True
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        key = request_key(pending_request.args)
        if key is not None:
            home = self._place(key)
            order = self._ring.rank(key, self._loads, self._load_factor, request_weight(pending_request.args),
                                    self._min_load_tokens, self._owner_slack(pending_request.args, key, home), home)
        else:
            order = self._ring.least_loaded(pending_request.metadata.internal_request_id, self._loads)
        ranked = [by_id[i] for i in order if i in by_id]
        on_ring = self._ring.members
        ranked += [r for i, r in by_id.items() if i not in on_ring]  # not on the ring yet
        open_ids = {r.replica_id for r in self.select_available_replicas(ranked)}
        ranked.sort(key=lambda r: r.replica_id not in open_ids)  # stable: full replicas last, order kept
        return [[r] for r in ranked]

    def _place(self, key: str) -> str | None:
        """With a prefix cache, the key's home (moved now if that evens out the replicas' work); else None (its ring
        owner)."""
        order = self._ring.walk(key) if self._prefix_cache else []
        if not order:
            return None
        home, moved = self._homes.home(key, order)
        if moved:
            self.metrics.key_moved()
        return home

    def _owner(self, key: str) -> str | None:
        """Where the key's prefix lives: its home with a prefix cache, else its ring owner (None on an empty ring)."""
        home = self._homes.current(key) if self._prefix_cache else None
        return home if home in self._ring.members else next(iter(self._ring.walk(key)), None)

    def _owner_slack(self, args: Sequence[Any], key: str, home: str | None) -> float:
        """How far past its bounded share a key's owner (`home`) still takes the request: with a prefix cache and the
        prefix held there, the prefix rows a spill would compute again on another replica; else nothing (every
        replica computes them)."""
        request = engine_request(args)
        held = self._prefix_cache and home is not None and self._homes.holds(key, home)
        return float(request.prefix_cost) if held and request is not None else 0.0

    def _fulfill_next_pending_request(self, replica: RunningReplica, request_metadata=None) -> None:
        """Hand `replica` to the oldest unfulfilled request with the routed request's internal id.

        Calls a replica fans out (a tei.v1 call of several queries makes one engine call per query) inherit
        their parent's internal request id, and Ray's base router indexes pending requests by that id, one per
        id: the second call could never be matched and would wait forever. Searching the pending queue by id
        serves each of them. (Private Ray API; Ray is pinned exactly in pyproject.)
        """
        if request_metadata is None:
            return
        wanted = request_metadata.internal_request_id
        for pending in self._pending_requests_to_fulfill:
            if not pending.future.done() and pending.metadata.internal_request_id == wanted:
                self._cancel_routing_task_for_pending_request(pending)
                self._record_queue_wait_time(pending)
                pending.future.set_result(replica)
                self._remove_pending_request_from_indices(pending)
                return

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        """Count the request's tokens against the replica until `result` completes (with a prefix cache, its prefix
        not on the key's owner once the key has been there); export where its key went.

        Released by `result`'s own done callback, not by `on_request_completed`: Ray registers the call's completion
        callback before it awaits the replica's acceptance and calls this hook after, so a call that finishes in the
        meantime (an `info`, a queue-full refusal) was released before it was counted, and stayed counted for good
        (600 fast calls left 18 counted). A done callback added to a finished call runs at once; a rejected attempt
        is never counted, so it has nothing to release."""
        key = request_key(pending_request.args)
        replica = replica_id.unique_id
        owner = self._owner(key) if key is not None else None
        if owner is not None:
            self.metrics.routed(key, replica, owner)
        held = self._prefix_cache and owner == replica and self._homes.holds(key, replica)
        tokens = request_weight(pending_request.args, held)
        self._loads[replica] = self._loads.get(replica, 0.0) + tokens
        if self._prefix_cache:
            self._homes.routed(key, replica, tokens)
        loop = asyncio.get_running_loop()  # the router's: the callback comes on a Ray or gRPC thread
        result.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release, replica, tokens))

    def _release(self, replica: str, tokens: float) -> None:
        """Release a completed call's tokens (nothing when its replica left the ring meanwhile: its load is gone)."""
        if replica not in self._loads:
            return
        left = self._loads[replica] - tokens
        if left > 0:
            self._loads[replica] = left
        else:
            del self._loads[replica]

    def _sync_ring(self) -> None:
        """Make the ring hold exactly the routable replicas; forget the loads of replicas that left."""
        current = {r.unique_id for r in self.curr_replicas}
        if current != self._ring.members:
            logger.info("PrefixAffinityRouter: ring %d -> %d replicas", len(self._ring), len(current))
            self._ring.set_members(current)
        for replica in [r for r in self._loads if r not in current]:
            del self._loads[replica]
        for replica in self._homes.replicas - current:
            self._homes.forget(replica)
        for replica in [r for r in self.metrics.window.counts if r not in current]:
            self.metrics.replica_left(replica)
