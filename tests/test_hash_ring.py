"""Consistent hashing with bounded loads: stability, minimal movement, spill-over, even spread."""

from collections import Counter

import pytest

from deployments.hash_ring import HashRing, stable_hash

KEYS = [f"model|rerank|query-{i}" for i in range(4000)]
REPLICAS = ["r-a", "r-b", "r-c", "r-d"]


def owners(ring: HashRing, keys=KEYS) -> dict[str, str]:
    return {k: ring.walk(k)[0] for k in keys}


def test_stable_hash_is_fixed_across_processes():
    # blake2b-64 of the text, big-endian: a constant, not the per-process salted hash()
    assert stable_hash("abc") == int.from_bytes(bytes.fromhex("d8bb14d833d59559"), "big")


def test_same_key_same_owner_regardless_of_insertion_order():
    a = HashRing(REPLICAS)
    b = HashRing(reversed(REPLICAS))
    c = HashRing()
    for r in REPLICAS[::2] + REPLICAS[1::2]:
        c.add(r)
    assert owners(a) == owners(b) == owners(c)
    assert a.rank("k", {}) == a.walk("k") and sorted(a.walk("k")) == sorted(REPLICAS)


def test_remove_moves_only_the_removed_replicas_keys():
    ring = HashRing(REPLICAS)
    before = owners(ring)
    ring.remove("r-c")
    after = owners(ring)
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == "r-c"}
    assert moved and "r-c" not in after.values()
    # each orphaned key goes to the next replica clockwise, its old second choice
    full = HashRing(REPLICAS)
    assert all(after[k] == full.walk(k)[1] for k in moved)


def test_add_moves_keys_only_to_the_new_replica():
    ring = HashRing(REPLICAS)
    before = owners(ring)
    ring.set_members(REPLICAS + ["r-e"])
    after = owners(ring)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(after[k] == "r-e" for k in moved)
    assert 0.1 < len(moved) / len(KEYS) < 0.3  # about 1/5 of the keys


def test_spread_is_near_even():
    counts = Counter(owners(HashRing(REPLICAS, virtual_nodes=256)).values())
    mean = len(KEYS) / len(REPLICAS)
    assert set(counts) == set(REPLICAS)
    assert max(counts.values()) / mean < 1.15 and min(counts.values()) / mean > 0.85


def test_more_virtual_nodes_spread_more_evenly():
    def imbalance(v):
        counts = Counter(owners(HashRing(REPLICAS, virtual_nodes=v)).values())
        return max(counts.values()) / (len(KEYS) / len(REPLICAS))

    assert imbalance(256) < imbalance(1)


def test_balanced_loads_keep_ring_order():
    ring = HashRing(REPLICAS)
    loads = {r: 100.0 for r in REPLICAS}
    assert all(ring.rank(k, loads, weight=10) == ring.walk(k) for k in KEYS[:200])


def test_overloaded_owner_spills_to_next_clockwise():
    ring = HashRing(REPLICAS)
    key = KEYS[0]
    order = ring.walk(key)
    # total 1000 + 10: fair share 252.5, bounded 315.6; the owner holds 700
    loads = {order[0]: 700.0, order[1]: 100.0, order[2]: 100.0, order[3]: 100.0}
    assert ring.rank(key, loads, load_factor=1.25, weight=10) == order[1:] + order[:1]
    # a looser bound keeps the owner
    assert ring.rank(key, loads, load_factor=3.0, weight=10) == order


def test_overloaded_replicas_go_last_lightest_first():
    ring = HashRing(REPLICAS)
    key = KEYS[1]
    order = ring.walk(key)
    loads = {order[0]: 500.0, order[1]: 900.0, order[2]: 0.0, order[3]: 0.0}
    # total 1401 over 4: bounded share 437.8, so the first two are over it and go last, lighter first
    assert ring.rank(key, loads, load_factor=1.25, weight=1) == [order[2], order[3], order[0], order[1]]


def test_min_load_keeps_small_imbalances_on_the_owner():
    ring = HashRing(REPLICAS)
    key = KEYS[2]
    owner = ring.walk(key)[0]
    loads = {owner: 300.0}  # alone on the ring's busiest replica, all others idle
    assert ring.rank(key, loads, weight=50)[0] != owner
    assert ring.rank(key, loads, weight=50, min_load=512)[0] == owner


def test_owner_slack_lets_only_the_keys_owner_pass_the_bound():
    ring = HashRing(REPLICAS)
    key = KEYS[3]
    order = ring.walk(key)
    # total 1010 over 4: bounded share 315.6; the owner and the next both hold 400
    loads = {order[0]: 400.0, order[1]: 400.0, order[2]: 100.0, order[3]: 100.0}
    assert ring.rank(key, loads, weight=10) == [order[2], order[3], order[0], order[1]]
    # 85 more for the owner alone (400.6): it keeps the key, the next member still goes last
    assert ring.rank(key, loads, weight=10, owner_slack=85.0) == [order[0], order[2], order[3], order[1]]
    assert ring.rank(key, loads, weight=10, owner_slack=84.0)[0] == order[2]  # 399.6: just short


def test_least_loaded_orders_by_load_and_spreads_ties():
    ring = HashRing(REPLICAS)
    assert ring.least_loaded("x", {"r-a": 5, "r-b": 1, "r-c": 3, "r-d": 2}) == ["r-b", "r-d", "r-c", "r-a"]
    firsts = Counter(ring.least_loaded(k, {})[0] for k in KEYS[:400])
    assert set(firsts) == set(REPLICAS)


def test_empty_ring_and_bad_arguments():
    ring = HashRing()
    assert ring.rank("k", {}) == [] and ring.walk("k") == [] and len(ring) == 0
    ring.remove("absent")
    with pytest.raises(ValueError, match="virtual_nodes"):
        HashRing(virtual_nodes=0)
    with pytest.raises(ValueError, match="load_factor must be >= 1"):
        HashRing(["a"]).rank("k", {}, load_factor=0.5)


def test_single_replica_always_chosen():
    ring = HashRing(["only"])
    assert ring.rank("k", {"only": 1e9}, weight=5) == ["only"]
