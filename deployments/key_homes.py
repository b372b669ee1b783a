"""`KeyHomes`: the engine replica each prefix key lives on, moved between replicas to even out their work.

With a prefix cache on the engine replicas a key's prefix is computed where the key goes and read back there after,
so a key should stay put. The ring (`deployments.hash_ring`) places keys by their hash, and bounded loads spill a
request only when its owner's outstanding work passes the bound by more than the prefix a spill computes again. A
few hot keys are then split as unevenly as coin tosses (16 few-shot prompts over 2 replicas: 10 to 6 or worse in 45%
of splits), and clients that wait for each answer before sending the next never pile up enough work to spill: the
replica with more keys sets the pace while the other's device idles (`bench/prefix_cache_bench.py`'s few-shot
stream, 3 runs: the busier replica used 0.72, 0.57 and 0.61 of the two replicas' CPU; with `KeyHomes` 0.55, 0.56 and
0.54; on the 2 CPUs those replicas shared, the throughput moved with the machine more than with the split).

`KeyHomes` keeps, per key, its home (the ring owner until it moves) and the work its requests brought there
recently, and per replica the work routed to it recently, both decayed with a half-life of `HALF_LIFE` routed
requests. A key moves from its home to the replica with the least recent work when that replica, the key's work
added, stays below its home by a margin: `least + key < home - MARGIN * mean`. Such a move lowers the sum of the
replicas' squared work (by `2 * key * (home - least - key)`), so keys settle rather than swing; each costs the key's
prefix once on its new home. A key seen for the first time goes to its ring owner, so the routers of several ingress
replicas agree on it until one of them moves it (each moves keys on its own view; a key two of them placed apart is
cached on both). A key's home **holds** its prefix once a request of the key has gone there (`holds`): until then,
as after each move, the home's prefix cache does not have it, and the key's next request there computes it.

Pure logic, no Ray: `deployments.router` asks it for a key's home and tells it where each request went.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

HALF_LIFE = 128  # routed requests over which a key's or a replica's recent work halves
MARGIN = 0.2  # of the mean replica work: how far below the key's home its new replica must stay
MAX_KEYS = 16384  # keys remembered (~300 bytes each: ~5 MiB), least recently routed forgotten first; a forgotten
# key goes to its ring owner, where it was unless it moved; it was last routed 16,384 requests (128 half-lives) ago


@dataclass(slots=True)
class _Decayed:
    """Work that halves every `HALF_LIFE` ticks of the router's clock, brought up to date when read."""

    value: float = 0.0
    stamp: int = 0

    def at(self, clock: int, half_life: int) -> float:
        if clock != self.stamp:
            self.value *= 0.5 ** ((clock - self.stamp) / half_life)
            self.stamp = clock
        return self.value

    def add(self, work: float, clock: int, half_life: int) -> None:
        self.value = self.at(clock, half_life) + work


@dataclass(slots=True)
class _Key:
    home: str
    work: _Decayed
    held: bool = False  # a request of the key went to `home` since it became the key's home


class KeyHomes:
    """Each prefix key's replica, and the recent work of keys and replicas that moves keys between replicas."""

    def __init__(self, half_life: int = HALF_LIFE, margin: float = MARGIN, max_keys: int = MAX_KEYS):
        self.half_life = half_life
        self.margin = margin
        self.max_keys = max_keys
        self._keys: OrderedDict[str, _Key] = OrderedDict()  # least recently routed first
        self._replicas: dict[str, _Decayed] = {}
        self._clock = 0  # requests routed

    def home(self, key: str, ring_order: Sequence[str]) -> tuple[str, bool]:
        """(where a request with `key` goes first, whether the key moved there now): its home, moved to the replica
        of `ring_order` (every routable replica, from the key's point on the ring) with the least recent work when
        that evens them out; a new key's home, or one whose home left, is its ring owner `ring_order[0]`."""
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key(ring_order[0], _Decayed())
            if len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
        elif entry.home not in ring_order:
            entry.home, entry.held = ring_order[0], False
        self._keys.move_to_end(key)
        work = {replica: self._work(replica) for replica in ring_order}
        least = min(ring_order, key=work.__getitem__)  # ties: ring order
        own = entry.work.at(self._clock, self.half_life)
        mean = sum(work.values()) / len(work)
        if own > 0 and work[least] + own < work[entry.home] - self.margin * mean:
            self._replicas[entry.home].value = max(work[entry.home] - own, 0.0)
            self._replicas.setdefault(least, _Decayed()).add(own, self._clock, self.half_life)
            entry.home, entry.held = least, False
            return least, True
        return entry.home, False

    def current(self, key: str) -> str | None:
        """The key's home as last placed, or None for a key not remembered."""
        entry = self._keys.get(key)
        return entry.home if entry is not None else None

    def holds(self, key: str, replica: str) -> bool:
        """Whether `replica` is the key's home and a request of the key has gone there since it became its home."""
        entry = self._keys.get(key)
        return entry is not None and entry.home == replica and entry.held

    def routed(self, key: str | None, replica: str, work: float) -> None:
        """A request went to `replica` bringing `work` there; it counts for `key` when `replica` is the key's home."""
        self._clock += 1
        self._replicas.setdefault(replica, _Decayed()).add(work, self._clock, self.half_life)
        entry = self._keys.get(key) if key is not None else None
        if entry is not None and entry.home == replica:
            entry.work.add(work, self._clock, self.half_life)
            entry.held = True

    @property
    def replicas(self) -> set[str]:
        """The replicas whose recent work is counted."""
        return set(self._replicas)

    def forget(self, replica: str) -> None:
        """`replica` left: its work goes; its keys go to their ring owners when next routed."""
        self._replicas.pop(replica, None)

    def _work(self, replica: str) -> float:
        recent = self._replicas.get(replica)
        return recent.at(self._clock, self.half_life) if recent is not None else 0.0
