"""Consistent hashing with bounded loads: which replica a prefix key goes to, and where it spills.

Each replica owns `virtual_nodes` points on a 64-bit ring; a key belongs to the first point clockwise from its
own hash. Removing a replica moves only the keys it owned (to their next replica clockwise); adding one moves
only the keys that now land on its points. Points come from blake2b, so every process (each ingress replica
runs its own router) builds the same ring from the same member ids, whatever order they arrive in.

Bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018): a replica
whose outstanding work is above `load_factor` times the mean (this request included) is skipped, so a hot key
spills clockwise to the next replica instead of piling up; when loads are balanced the ring decides alone.
`min_load` keeps small absolute imbalances from spilling: a replica holding less than one engine batch of
queued tokens would batch a same-prefix request with the ones it already has, so sending it elsewhere only
costs the shared prefix a second time. `owner_slack` lets the key's owner hold that much more than the bound: what
moving the request off it costs (with a prefix cache on the replicas, the prefix the owner holds, computed again
elsewhere), so a spill happens only when the imbalance outweighs the work it adds.

Pure logic, no Ray: `deployments.router` feeds it replica ids and per-replica outstanding tokens.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Mapping

DEFAULT_VIRTUAL_NODES = 128
DEFAULT_LOAD_FACTOR = 1.25


def stable_hash(text: str) -> int:
    """64-bit point on the ring; the same in every process (unlike `hash()`, which is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """A ring of member ids (replica ids) with `virtual_nodes` points each."""

    def __init__(self, members: Iterable[str] = (), virtual_nodes: int = DEFAULT_VIRTUAL_NODES):
        if not isinstance(virtual_nodes, int) or virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be a positive int, got {virtual_nodes!r}")
        self.virtual_nodes = virtual_nodes
        self._points: list[tuple[int, str]] = []  # sorted (point, member); member breaks (unlikely) point ties
        self._keys: list[int] = []  # the points alone, for bisect
        self._members: set[str] = set()
        self.set_members(members)

    @property
    def members(self) -> frozenset[str]:
        return frozenset(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def add(self, member: str) -> None:
        """Put `member` on the ring (no-op if present); only keys landing on its new points move to it."""
        if member not in self._members:
            self._members.add(member)
            self._points.extend((stable_hash(f"{member}#{i}"), member) for i in range(self.virtual_nodes))
            self._reindex()

    def remove(self, member: str) -> None:
        """Take `member` off the ring (no-op if absent); only its keys move, each to its next member clockwise."""
        if member in self._members:
            self._members.discard(member)
            self._points = [p for p in self._points if p[1] != member]
            self._reindex()

    def set_members(self, members: Iterable[str]) -> None:
        """Make the ring hold exactly `members`, adding and removing the difference."""
        wanted = set(members)
        for member in sorted(self._members - wanted):
            self.remove(member)
        for member in sorted(wanted - self._members):
            self.add(member)

    def walk(self, key: str) -> list[str]:
        """Every member once, in ring order clockwise from the key's point; `walk(key)[0]` owns the key."""
        if not self._points:
            return []
        start = bisect.bisect_right(self._keys, stable_hash(key))
        order: list[str] = []
        seen: set[str] = set()
        for i in range(len(self._points)):
            member = self._points[(start + i) % len(self._points)][1]
            if member not in seen:
                seen.add(member)
                order.append(member)
                if len(order) == len(self._members):
                    break
        return order

    def rank(self, key: str, loads: Mapping[str, float], load_factor: float = DEFAULT_LOAD_FACTOR,
             weight: float = 1.0, min_load: float = 0.0, owner_slack: float = 0.0,
             owner: str | None = None) -> list[str]:
        """Members in preference order for a request of `weight` with this key.

        Ring order from the key's point, `owner` first when given (a member the key was moved to; by default the
        key's owner is the first in ring order), except that a member whose load is above its bounded fair share,
        `max(load_factor * (total_load + weight) / n, min_load)` (plus `owner_slack` for the key's owner), moves
        to the end; those come last, least loaded first, ring order breaking ties. Members missing from `loads`
        count as idle.
        """
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be >= 1 (1 = perfectly even, 1.25 = 25% over the mean), "
                             f"got {load_factor}")
        order = self.walk(key)
        if not order:
            return []
        if owner in order:
            order.remove(owner)
            order.insert(0, owner)
        load = [float(loads.get(m, 0.0)) for m in order]
        capacity = max(load_factor * (sum(load) + weight) / len(order), min_load)
        bound = [capacity + owner_slack] + [capacity] * (len(order) - 1)
        fits = [m for m, x, b in zip(order, load, bound) if x <= b]
        over = sorted((x, i) for i, (x, b) in enumerate(zip(load, bound)) if x > b)
        return fits + [order[i] for _, i in over]

    def least_loaded(self, key: str, loads: Mapping[str, float]) -> list[str]:
        """Members by load, lightest first; ties in ring order from `key`, so equal loads spread over keys."""
        order = self.walk(key)
        return sorted(order, key=lambda m: float(loads.get(m, 0.0)))  # stable: ring order among equals

    def _reindex(self) -> None:
        self._points.sort()
        self._keys = [point for point, _ in self._points]
