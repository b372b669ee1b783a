"""KeyHomes: a key stays on its home, and keys move off a replica that gets more work than the others, few times."""

import random
from collections import Counter

from deployments.key_homes import KeyHomes

WORK = 200.0  # a few-shot request's rows on the replica holding its prompt


def route(homes: KeyHomes, orders: dict[str, list[str]], keys: list[str]) -> int:
    """Send one request of each key in `keys` to its home; the number of moves."""
    moves = 0
    for key in keys:
        home, moved = homes.home(key, orders[key])
        homes.routed(key, home, WORK)
        moves += moved
    return moves


def test_a_new_key_goes_to_its_ring_owner_and_stays_while_the_work_is_even():
    homes = KeyHomes()
    orders = {"a": ["r0", "r1"], "b": ["r1", "r0"]}
    assert route(homes, orders, ["a", "b"] * 500) == 0
    assert homes.current("a") == "r0" and homes.current("b") == "r1" and homes.current("c") is None


def test_three_keys_on_one_replica_and_one_on_the_other_settle_two_and_two_with_one_move():
    """Equally busy keys a, b, c owned by r0 on the ring and d by r1: r0 gets 3/4 of the work while r1 idles half the
    time. One move evens it out; none follows."""
    homes = KeyHomes()
    orders = {k: ["r0", "r1"] for k in "abc"} | {"d": ["r1", "r0"]}
    assert route(homes, orders, list("abcd") * 400) == 1
    assert Counter(homes.current(k) for k in "abcd") == {"r0": 2, "r1": 2}


def test_sixteen_keys_split_by_the_ring_end_even_and_balanced_keys_do_not_swing():
    """16 keys 11 to 5 (ring owners), asked at random: the later work is even within 55/45 after a few moves; then
    1,000 more requests move no key."""
    rng = random.Random(0)
    keys = [f"k{i}" for i in range(16)]
    orders = {k: ["r0", "r1"] if i < 11 else ["r1", "r0"] for i, k in enumerate(keys)}
    homes = KeyHomes()
    moves = route(homes, orders, [rng.choice(keys) for _ in range(600)])
    assert 1 <= moves <= 6
    split = Counter(homes.current(k) for k in keys)
    assert split == {"r0": 8, "r1": 8}, split
    assert route(homes, orders, [rng.choice(keys) for _ in range(1000)]) == 0


def test_a_key_whose_home_left_goes_back_to_its_ring_owner():
    homes = KeyHomes()
    orders = {k: ["r0", "r1"] for k in "abc"} | {"d": ["r1", "r0"]}
    route(homes, orders, list("abcd") * 400)
    moved = next(k for k in "abc" if homes.current(k) == "r1")
    homes.forget("r1")
    assert homes.replicas == {"r0"}
    assert homes.home(moved, ["r0"]) == ("r0", False)


def test_the_least_recently_routed_keys_are_forgotten_past_max_keys():
    homes = KeyHomes(max_keys=3)
    orders = {k: ["r0", "r1"] for k in "abcd"}
    route(homes, orders, list("abcd"))
    assert homes.current("a") is None and all(homes.current(k) == "r0" for k in "bcd")


def test_a_home_holds_a_key_once_a_request_of_it_went_there_and_not_after_the_key_moves():
    homes = KeyHomes()
    orders = {k: ["r0", "r1"] for k in "abc"} | {"d": ["r1", "r0"]}
    assert homes.home("a", orders["a"]) == ("r0", False) and not homes.holds("a", "r0")
    homes.routed("a", "r1", WORK)  # a spill: not its home
    assert not homes.holds("a", "r0") and not homes.holds("a", "r1")
    homes.routed("a", "r0", WORK)
    assert homes.holds("a", "r0") and not homes.holds("a", "r1") and not homes.holds("b", "r0")
    route(homes, orders, list("abcd") * 400)  # one of a, b, c moves to r1 (the test above)
    moved = next(k for k in "abc" if homes.current(k) == "r1")
    assert homes.holds(moved, "r1")  # its requests went to its new home since
    home, _ = homes.home(moved, ["r0"])  # its home left: back to r0, where it is not held until a request arrives
    assert home == "r0" and not homes.holds(moved, "r0")
