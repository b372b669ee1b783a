"""The prefix cache's tree on its own (`radix_core.prefix_cache`): lookup of any cached prefix, splits, admission
on the second sighting, LRU eviction of whole segments under the byte budget, scopes, and what a failed batch
leaves. Rows hold fake K/V and states that encode their history, so every read checks it gets the right rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radix_core import prefix_cache
from radix_core.cached_rows import RowShape
from radix_core.cascade import concat_ranges
from radix_core.prefix_cache import (
    GHOST,
    MIN_LEAF_ROWS,
    PENDING,
    RESIDENT,
    SEVERAL,
    Origins,
    PrefixCache,
    _Segment,
    cache_budget,
)

SHAPE = RowShape(layers=2, kv_heads=1, head_dim=2, hidden=3, dtype=torch.float64, device=torch.device("cpu"))
ROW = SHAPE.bytes  # (2 x 2 x 1 x 2 + 3) x 8 = 88 bytes


def cache_of(budget_bytes: int, **settings) -> PrefixCache:
    """A cache of SHAPE rows that admits leaves of any length: the tree's mechanics on short sequences."""
    return PrefixCache(SHAPE, budget_bytes, **{"min_leaf_rows": 1, **settings})


def code(history: np.ndarray) -> float:
    """A number for a token's history (its sequence up to itself): equal histories, equal codes."""
    return float(sum((int(t) + 1) * 31.0 ** i for i, t in enumerate(history)) % 1_000_003) + len(history) / 1000


def run(cache: PrefixCache, sequences: list[list[int]], scopes=None,
        requests: list[int] | None = None, shared: int = 0) -> tuple[list[int], list[tuple[int, int, int]]]:
    """One batch through `cache` (`requests`: each sequence's request, all with `shared` shared ids; None: no
    origins): checks every cached row it reads, then commits its admissions with their codes. Returns (matched
    lengths, admissions)."""
    seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
    cu = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    origins = None if requests is None else Origins(np.array(requests), np.full(len(requests), shared))
    with cache.lease(np.concatenate(seqs), cu, scopes, origins) as lease:
        matched = lease.matched.copy()
        past = lease.past(matched)
        if past is not None:
            rows = concat_ranges(past.pair_start, past.pair_end - past.pair_start)  # cached rows, sequence by sequence
            want = [code(s[:p + 1]) for s, k in zip(seqs, matched) for p in range(k)]
            for layer in range(SHAPE.layers):
                k, v = past.kv(layer)
                np.testing.assert_array_equal(k[rows, 0, 0].numpy(), np.add(want, layer))
                np.testing.assert_array_equal(v[rows, 0, 1].numpy(), np.add(want, layer + 0.5))
            np.testing.assert_array_equal(past.states()[rows, 2].numpy(), want)
        admitted = list(lease.admitted)
        codes = [code(seqs[s][:p + 1]) for s, start, end in admitted for p in range(start, end)]
        kept = lease.keep(torch.arange(len(codes)))
        for layer in range(SHAPE.layers):
            kept.kv[layer, 0] = torch.tensor(codes, dtype=torch.float64)[:, None, None] + layer
            kept.kv[layer, 1] = torch.tensor(codes, dtype=torch.float64)[:, None, None] + layer + 0.5
        kept.states[:] = torch.tensor(codes, dtype=torch.float64)[:, None]
        lease.commit(kept)
    check_tree(cache)
    return matched.tolist(), admitted


def segments(cache: PrefixCache):
    """Every segment below the roots, with the ids from its root to its end (ghost tails not included)."""
    return [(node, history) for node, history in nodes(cache) if not isinstance(node, tuple)]


def nodes(cache: PrefixCache):
    """Every segment and ghost tail ((its ids, its request)) below the roots, with the ids from its root to its
    end."""
    stack = [(root, np.zeros(0, dtype=np.int64)) for root in cache._roots.values()]
    while stack:
        node, history = stack.pop()
        for child in node.children.values():
            ids = child[0] if isinstance(child, tuple) else child.ids
            path = np.concatenate([history, np.frombuffer(ids, dtype=np.int32)])
            yield child, path
            if not isinstance(child, tuple):
                stack.append((child, path))


def check_tree(cache: PrefixCache) -> None:
    """The invariants between leases: states along paths, byte and ghost counts, K/V of every resident row,
    recency order (each segment after its descendants, and after the ghost tails below it)."""
    stats = cache.stats()
    resident = ghost = 0
    for seg, history in nodes(cache):
        if isinstance(seg, tuple):
            ghost += len(seg[0]) // 4
            continue
        assert seg.state in (RESIDENT, GHOST)  # nothing pending between leases
        assert seg.depth == len(history) - seg.size
        if seg.state == RESIDENT:
            resident += seg.size
            assert seg.parent.state == RESIDENT  # resident segments form a prefix of every path
            want = [code(history[:p + 1]) for p in range(seg.depth, len(history))]
            np.testing.assert_array_equal(seg.states[:, 0].numpy(), want)
            assert seg.kv.is_contiguous() and seg.kv.shape[2] == seg.size
        else:
            ghost += seg.size
            assert seg not in cache._resident and not seg.read
    assert cache._read_rows == sum(seg.size for seg in cache._resident if seg.read)
    assert list(cache._unread) == [seg for seg in cache._resident if not seg.read]  # the same order
    assert stats.bytes == resident * ROW <= stats.budget_bytes
    assert stats.ghost_tokens == ghost <= cache.ghost_limit
    assert stats.segments == len(cache._resident)
    for order in (cache._resident, cache._ghosts):
        place = {seg: i for i, seg in enumerate(order)}
        for seg in order:
            below = [seg.parent] if isinstance(seg, _Segment) else seg.parents
            assert all(place[seg] < place[parent] for parent in below if parent in place)


def test_a_prefix_two_sequences_share_is_cached_by_their_batch_and_hit_by_the_next():
    cache = cache_of(1000 * ROW)
    prompt = list(range(100, 110))
    matched, admitted = run(cache, [prompt + [1, 2], prompt + [3], prompt + [4, 5, 6]])
    assert matched == [0, 0, 0] and admitted == [(1, 0, 10)]  # the second sequence sees the prompt again
    assert cache.stats().bytes == 10 * ROW and cache.stats().ghost_tokens == 2 + 1 + 3
    matched, admitted = run(cache, [prompt + [7], [9, 9]])
    assert matched == [10, 0] and admitted == []
    stats = cache.stats()
    assert (stats.lookups, stats.lookup_tokens, stats.hit_tokens, stats.inserted_tokens) == (5, 36 + 13, 10, 10)


def test_any_cached_prefix_matches_and_a_sequence_leaving_a_segment_splits_it():
    cache = cache_of(1000 * ROW)
    prompt = list(range(100, 120))
    run(cache, [prompt + [1], prompt + [2]])
    assert run(cache, [prompt[:7]])[0] == [7]  # ends inside the segment: no split
    assert cache.stats().segments == 1
    assert run(cache, [prompt[:7] + [5, 5]])[0] == [7]  # leaves it: split into 7 + 13 rows, both still cached
    assert sorted(seg.size for seg in cache._resident) == [7, 13]
    assert run(cache, [prompt + [3], prompt[:7] + [6]])[0] == [20, 7]
    assert cache.stats().bytes == 20 * ROW


def test_a_path_of_segments_back_to_back_in_the_cached_rows_is_one_range():
    """A template cached, a query cached below it: a sequence reading both reads one range (one past block for the
    forward, not one per segment); one whose segments are not back to back in the cached rows reads two."""
    cache = cache_of(1000 * ROW)
    template, query, other = list(range(100, 110)), [50, 51, 52], [60, 61]
    run(cache, [template + [1], template + [2]])
    run(cache, [template + query + [3], template + query + [4]])
    run(cache, [template + other + [5], template + other + [6]])
    batch = [template + query + [7], template + other + [8], template + [9]]
    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in batch])
    with cache.lease(ids, np.array([0, 14, 27, 38]), None) as lease:
        past = lease.past(lease.matched)
        assert lease.matched.tolist() == [13, 12, 10]
        assert np.diff(past.pair_cu).tolist() == [1, 2, 1] and past.pair_start[0] == 0 and past.pair_end[0] == 13
    assert run(cache, batch)[0] == [13, 12, 10]  # and each reads its own rows


def test_a_history_seen_once_stays_a_ghost_until_seen_again():
    cache = cache_of(1000 * ROW)
    conversation = [5, 6, 7, 8]
    assert run(cache, [conversation]) == ([0], [])
    assert cache.stats().ghost_tokens == 4 and cache.stats().bytes == 0
    assert run(cache, [conversation + [9, 10]]) == ([0], [(0, 0, 4)])  # the next turn: its history seen twice
    assert run(cache, [conversation + [9, 10, 11]]) == ([4], [(0, 4, 6)])
    assert run(cache, [conversation + [9, 10]]) == ([6], [])  # a duplicate: all of it cached


def test_an_item_s_own_rows_are_admitted_once_a_second_request_has_them():
    """Rows below a request's shared prefix that only its own sequences share (documents that open alike, in one
    batch or in its later parts) stay ghosts: no copy, no read that costs more than it saves. A second request
    with them admits them, in a later batch or the same one; the shared prefix is admitted on any second
    sighting, so the request's later parts read it."""
    cache = cache_of(1000 * ROW)
    prompt, opening = list(range(100, 106)), [7, 7, 7]
    part = [prompt + opening + [1], prompt + opening + [2], prompt + [8]]
    assert run(cache, part, requests=[5, 5, 5], shared=6) == ([0, 0, 0], [(2, 0, 6)])  # the prompt, not the opening
    assert run(cache, [prompt + opening + [3]], requests=[5], shared=6) == ([6], [])  # its next part
    assert run(cache, [prompt + opening + [4]], requests=[9], shared=6) == ([6], [(0, 6, 9)])  # another request
    assert run(cache, [prompt + [5, 5, 5, 1], prompt + [5, 5, 5, 2]], requests=[11, 12], shared=6) == \
        ([6, 6], [(1, 6, 9)])  # two requests in one batch
    assert run(cache, [prompt + [5, 5, 5, 3]], requests=[11], shared=6) == ([9], [])


def test_a_ghost_a_sequence_steps_over_counts_its_request():
    """A sequence resumes its walk below the previous one's path (`trail`): the ghosts on that shared path are seen
    by its request too, and admitted when it differs."""
    cache = cache_of(1000 * ROW)
    prompt = list(range(100, 106))
    run(cache, [prompt + [6, 6, 6, 1], prompt + [6, 6, 6, 2], prompt + [8]], requests=[20, 20, 20], shared=6)
    assert run(cache, [prompt + [6, 6, 6, 3], prompt + [6, 6, 6, 4]], requests=[20, 21], shared=6) == \
        ([6, 6], [(0, 6, 9)])


def test_an_evicted_segment_is_admitted_by_its_next_sighting_whoever_sees_it():
    """A segment admitted with a shared prefix (it started inside it), split below the prefix and evicted, is seen
    again by the request that first saw it: admitted, as every evicted segment is at its next sighting."""
    cache = cache_of(9 * ROW)
    prompt, opening = list(range(100, 106)), [7, 7, 7]
    assert run(cache, [prompt + opening + [1], prompt + opening + [2]], requests=[5, 5], shared=6)[1] == [(1, 0, 9)]
    assert run(cache, [prompt + [8], prompt + [8]], requests=[6, 7], shared=6) == ([6, 6], [(1, 6, 7)])
    evicted = next(seg for seg, history in segments(cache) if history[-3:].tolist() == opening)
    assert evicted.state == GHOST and evicted.request == SEVERAL
    assert run(cache, [prompt + opening + [3]], requests=[5], shared=6) == ([6], [(0, 6, 9)])


def test_origins_give_one_request_and_shared_length_per_sequence():
    cache = cache_of(100 * ROW)
    ids, cu = np.arange(6), np.array([0, 3, 6])
    for origins in (Origins(np.array([1]), np.array([0, 0])), Origins(np.array([1, -3]), np.array([0, 0]))):
        with pytest.raises(ValueError, match="origins name .* for 2 sequences: give one of each per sequence"):
            with cache.lease(ids, cu, origins=origins):
                pass
    check_tree(cache)


def test_duplicates_in_one_batch_are_the_second_sighting():
    cache = cache_of(1000 * ROW)
    assert run(cache, [[1, 2, 3], [1, 2, 3]]) == ([0, 0], [(1, 0, 3)])
    assert run(cache, [[1, 2, 3], [1, 2]]) == ([3, 2], [])


def test_short_branches_below_a_shared_query_are_not_worth_a_copy():
    """Documents under one rerank query that start with the same token share a one-row segment: seen twice, but
    no later batch is likely to read it, so by default it stays a ghost while the query is admitted; a longer
    shared start is admitted."""
    cache = PrefixCache(SHAPE, 1000 * ROW)
    query, shared = [7] * MIN_LEAF_ROWS, [2] * (MIN_LEAF_ROWS + 1)
    run(cache, [query + doc for doc in ([1, 20, 21], [1, 30, 31], shared + [50], shared + [60])])
    assert sorted(seg.size for seg, _ in segments(cache) if seg.state == RESIDENT) == [MIN_LEAF_ROWS,
                                                                                     MIN_LEAF_ROWS + 1]
    assert run(cache, [query + [1, 20, 22], query + shared + [70]])[0] == [MIN_LEAF_ROWS, 2 * MIN_LEAF_ROWS + 1]


def test_a_short_segment_on_the_path_to_a_long_one_is_admitted_with_it():
    cache = PrefixCache(SHAPE, 1000 * ROW)
    long = list(range(10, 10 + MIN_LEAF_ROWS))
    run(cache, [[1, 2] + long + [3], [1, 2] + long + [4], [1, 5]])  # [1] is shared by all three, [2, ...] by two
    assert run(cache, [[1, 2] + long + [9]])[0] == [2 + MIN_LEAF_ROWS]


def test_least_recently_used_segment_is_evicted_whole_and_comes_back_on_its_next_sighting():
    cache = cache_of(25 * ROW)
    a, b, c = ([t] * 10 for t in (1, 2, 3))
    run(cache, [a + [0], a + [9]])
    run(cache, [b + [0], b + [9]])
    assert run(cache, [a + [5]])[0] == [10]  # a is now more recent than b
    run(cache, [c + [0], c + [9]])  # 10 more rows do not fit: b goes, whole
    stats = cache.stats()
    assert (stats.evictions, stats.evicted_tokens, stats.bytes) == (1, 10, 20 * ROW)
    assert run(cache, [a + [5], c + [5]])[0] == [10, 10]
    assert run(cache, [b + [5]]) == ([0], [(0, 0, 10)])  # b was a ghost: seen again, admitted again


def test_a_segment_read_back_outlives_one_off_admissions_newer_than_it():
    """A prompt read back by a later batch is kept over segments never read back (the inputs of classify requests,
    each shared by its labels in its own batch), newer though they are: least recently used first would evict it."""
    cache = cache_of(100 * ROW)
    prompt = [1] * 30
    run(cache, [prompt + [0], prompt + [9]])
    assert run(cache, [prompt + [3]])[0] == [30]  # read back
    for i in range(4):  # 4 x 20 rows: the fourth needs room
        run(cache, [[10 + i] * 20 + [0], [10 + i] * 20 + [9]])
    assert cache.stats().evictions == 1 and run(cache, [prompt + [4]])[0] == [30]
    assert run(cache, [[10] * 20])[0] == [0]  # the oldest one-off went instead


def test_segments_evicted_unread_and_seen_again_shrink_the_rows_kept_for_those_read_back():
    """A prompt that is no longer sent gives way: each segment evicted before it was read and then admitted again
    lowers the rows kept for segments read back (80 of 100 at first), until the old prompt is least recently used
    among all and goes."""
    cache = cache_of(100 * ROW)
    a, b, c, d = ([t] * n for t, n in ((1, 40), (2, 30), (3, 30), (4, 30)))
    run(cache, [a + [0], a + [9]])
    run(cache, [a + [5]])  # read back: kept first while the rows read back are within their share
    for rows in (b, c, d):  # d evicts b, unread
        run(cache, [rows + [0], rows + [9]])
    assert run(cache, [b + [1], b + [2]])[1] == [(0, 0, 30)]  # b again: 80 -> 50 rows kept; c goes, unread
    assert run(cache, [c + [1], c + [2]])[1] == [(0, 0, 30)]  # c again: 50 -> 20, below a's 40; a goes
    assert sorted(int(np.frombuffer(seg.ids, np.int32)[0]) for seg in cache._resident) == [2, 3, 4]


def test_finding_a_victim_starts_at_the_segments_never_read_back(monkeypatch):
    """200 prompts read back, then one-off admissions that evict one another: each eviction checks the least
    recently used segment never read back, not every segment read back before it (a 1,000-document rerank sent as 7
    requests spent 1.9 s in 1.3 M such checks)."""
    cache = cache_of(1000 * ROW)
    for t in range(200):  # 200 x 4 rows read back: 800, the target's rows
        run(cache, [[t + 10] * 4 + [0], [t + 10] * 4 + [9]])
        run(cache, [[t + 10] * 4 + [5]])
    checked = []
    holds = prefix_cache._holds_rows_below
    monkeypatch.setattr(prefix_cache, "_holds_rows_below", lambda segment: checked.append(segment) or holds(segment))
    for i in range(20):  # 60 rows each: from the fourth on, each evicts the oldest
        run(cache, [[1000 + i] * 60 + [0], [1000 + i] * 60 + [9]])
    assert cache.stats().evictions == 17 and len(checked) == 17
    assert cache._read_rows == 800


def test_a_parent_is_evicted_only_after_its_children():
    cache = cache_of(16 * ROW)
    template = [7] * 6
    run(cache, [template + [1] * 5 + [0], template + [1] * 5 + [9]])  # template + query 1: one 11-row segment
    run(cache, [template + [2] * 5 + [0], template + [2] * 5 + [9]])  # splits it: template 6, query 1 5, query 2 5
    assert sorted(seg.size for seg in cache._resident) == [5, 5, 6]
    run(cache, [[4] * 5 + [0], [4] * 5 + [9]])  # 5 more rows: the older query goes, not the template above both
    assert run(cache, [template + [1] * 5, template + [2] * 5])[0] == [6, 11]
    run(cache, [[3] * 12 + [0], [3] * 12 + [9]])  # 12 rows: everything else goes, children before the template
    assert cache.stats().segments == 1 and run(cache, [template])[0] == [0]


def test_an_admission_larger_than_the_budget_is_skipped_without_evicting():
    cache = cache_of(8 * ROW)
    run(cache, [[1] * 5 + [0], [1] * 5 + [9]])
    assert run(cache, [[2] * 20 + [0], [2] * 20 + [9]]) == ([0, 0], [])
    assert cache.stats().evictions == 0 and run(cache, [[1] * 5])[0] == [5]


def test_rows_a_batch_reads_are_not_evicted_for_its_own_admissions():
    cache = cache_of(12 * ROW)
    run(cache, [[1] * 10 + [0], [1] * 10 + [9]])
    matched, admitted = run(cache, [[1] * 10 + [5], [2] * 4 + [0], [2] * 4 + [9]])
    assert matched == [10, 0, 0] and admitted == []  # the 4 new rows would need the 10 this batch reads


def test_scopes_never_share_rows():
    cache = cache_of(100 * ROW)
    prompt = [3] * 8
    run(cache, [prompt + [1], prompt + [2]], scopes=["a", "a"])
    assert run(cache, [prompt + [4], prompt + [4]], scopes=["a", "b"])[0] == [8, 0]
    assert run(cache, [prompt + [5]])[0] == [0]  # the shared tree (scope None) is a scope of its own too



def test_cached_length_reads_what_the_tree_holds_or_the_running_batch_adds():
    """`cached_length` (how the replica plans batches) counts resident and pending rows of the id's path in its
    scope, never ghosts, and answers 0 rather than wait while the tree is changing."""
    cache = cache_of(100 * ROW)
    prompt = np.array([3] * 8 + [4, 5])
    with cache.lease(np.concatenate([prompt, [1], prompt, [2]]), np.array([0, 11, 22]), ["a", "a"]) as lease:
        assert lease.admitted == [(1, 0, 10)]
        assert cache.cached_length(prompt, "a") == 10  # pending: the batch running now adds it
        kept = lease.keep(torch.arange(10))
        lease.commit(kept)
    assert cache.cached_length(np.concatenate([prompt, [7, 7]]), "a") == 10
    assert cache.cached_length(prompt[:6], "a") == 6  # ends inside the segment
    assert cache.cached_length(np.array([3, 3, 9]), "a") == 2  # leaves it
    assert cache.cached_length(prompt, "b") == 0 and cache.cached_length(prompt) == 0  # other scopes
    assert cache.cached_length(np.concatenate([prompt, [1]]), "a") == 10  # the ghost tail [1] is not cached
    with cache._tree_lock:
        assert cache.cached_length(prompt, "a") == 0

def test_admissions_of_a_failed_batch_go_back_to_ghosts():
    cache = cache_of(100 * ROW)
    ids, cu = np.array([1, 2, 3, 1, 2, 4]), np.array([0, 3, 6])
    with pytest.raises(RuntimeError, match="device lost"):
        with cache.lease(ids, cu) as lease:
            assert lease.admitted == [(1, 0, 2)] and cache.stats().bytes == 2 * ROW
            raise RuntimeError("device lost")
    check_tree(cache)
    assert cache.stats().bytes == 0 and cache.stats().inserted_tokens == 0
    assert run(cache, [[1, 2, 5]]) == ([0], [(0, 0, 2)])  # still seen: the next sighting admits it


def test_ghosts_are_forgotten_oldest_first_past_their_limit():
    cache = cache_of(100 * ROW, ghost_tokens=10)
    run(cache, [[1, 1, 1, 1]])
    run(cache, [[2, 2, 2, 2]])
    run(cache, [[3, 3, 3, 3]])
    assert cache.stats().ghost_tokens == 8
    assert run(cache, [[1, 1, 1, 1]]) == ([0], [])  # forgotten: a first sighting again
    assert run(cache, [[3, 3, 3, 3]]) == ([0], [(0, 0, 4)])


def test_a_batch_s_ghost_tails_are_forgotten_in_the_order_it_left_them_and_one_reached_again_is_kept():
    """A batch's tails are one entry of the ghosts' recency order, forgotten from its front as far as the limit
    needs; a tail that a later batch reaches is a segment from then on, and its first entry is skipped."""
    cache = cache_of(100 * ROW, ghost_tokens=4)
    run(cache, [[1, 1], [2, 2], [3, 3]])  # 6 tokens: [1, 1], left first, is forgotten
    assert cache.stats().ghost_tokens == 4
    assert run(cache, [[3, 3, 5]]) == ([0], [(0, 0, 2)])  # reached again: admitted; the tail [5] is left
    assert cache.stats().ghost_tokens == 2 + 1
    assert run(cache, [[2, 2]]) == ([0], [(0, 0, 2)])  # still remembered
    assert run(cache, [[1, 1]]) == ([0], [])  # forgotten: a first sighting again


def test_clear_starts_cold():
    cache = cache_of(100 * ROW)
    run(cache, [[1, 2], [1, 2]])
    cache.clear()
    assert cache.stats() == cache_of(100 * ROW).stats() and run(cache, [[1, 2]]) == ([0], [])


def test_random_streams_keep_every_invariant():
    """Random batches over a small alphabet (many shared prefixes, splits, evictions, ghost trims, two scopes):
    every read is checked against the codes (`run`) and the tree after every batch (`check_tree`)."""
    rng = np.random.default_rng(0)
    stems = [rng.integers(0, 4, 30).tolist() for _ in range(3)]
    evictions = []
    for budget, ghosts in ((40, 30), (400, 400)):
        cache = cache_of(budget * ROW, ghost_tokens=ghosts)
        for _ in range(60):
            size = int(rng.integers(1, 6))
            batch = [stems[rng.integers(3)][:rng.integers(1, 31)] + rng.integers(0, 4, rng.integers(0, 5)).tolist()
                     for _ in range(size)]
            run(cache, batch, scopes=rng.choice(["x", "y"], size).tolist())
        stats = cache.stats()
        assert stats.hit_tokens > 0 and stats.inserted_tokens > 0
        evictions.append(stats.evictions)
    assert evictions[0] > 0


def test_pending_rows_are_not_read_before_their_batch_commits():
    cache = cache_of(100 * ROW)
    ids, cu = np.array([1, 2, 3, 1, 2, 4, 1, 2, 5]), np.array([0, 3, 6, 9])
    with cache.lease(ids, cu) as lease:
        assert lease.matched.tolist() == [0, 0, 0]  # the third sequence walks [1, 2] pending, not cached
        assert lease.admitted == [(1, 0, 2)] and cache._roots[None].children[(1).to_bytes(4, "little")].state == PENDING


def test_budget_setting():
    assert cache_budget("auto", SHAPE) == 256 << 20 and cache_budget(0, SHAPE) == 0
    for bad in (-1, True, "1GB", 1.5):
        with pytest.raises(ValueError, match="prefix_cache_bytes must be 'auto', 0"):
            cache_budget(bad, SHAPE)
    with pytest.raises(ValueError, match="holds no row"):
        PrefixCache(SHAPE, ROW - 1)


def test_a_walk_that_starts_from_the_previous_sequence_matches_admits_and_reads_its_own_path():
    """Each sequence's walk starts from the previous one's path where they agree (`PrefixCache._walk`): neighbours
    that share a cached prompt, part of it, a ghost one of them left, or nothing (another scope) each match their
    own cached prefix, the rows seen twice are admitted once, and every read row is the sequence's own (`run`)."""
    prompt = [7] * 6 + [8, 9]
    batch = [prompt + [1, 2], prompt + [1, 3], prompt + [1], prompt[:5], prompt + [4], [5, 5], prompt + [1, 2, 6],
             prompt + [1, 2]]
    scopes = ["a"] * 5 + ["b", "b", "a"]
    cache = cache_of(100 * ROW)
    run(cache, [prompt + [0], prompt + [0]], scopes=["a", "a"])
    matched, admitted = run(cache, batch, scopes)
    assert matched == [8, 8, 8, 5, 8, 0, 0, 8]
    assert admitted == [(1, 8, 9), (7, 9, 10)]  # [1] split from the first's ghost by the second; [2] by the last
    assert run(cache, [prompt + [1, 2, 3]], ["a"])[0] == [10] and run(cache, [prompt + [1, 2, 6]], ["b"])[0] == [0]
