"""`cascade_plan`: the trie's segments and prefix blocks give every compact row exactly its path as keys."""

import numpy as np
import pytest

from radix_core.cascade import cascade_plan, compact_parents
from radix_core.index import build_radix_index, flatten_sequences


def random_batch(seed: int) -> list[list[int]]:
    """Trees of different depths, interleaved: stems cut at random points, shared middles, tails, copies."""
    rng = np.random.default_rng(seed)
    tokens = lambda n: rng.integers(0, 6, n).tolist()  # noqa: E731  small vocabulary: accidental sharing too
    roots = [tokens(int(rng.integers(1, 12))) for _ in range(3)]
    middles = [tokens(int(rng.integers(0, 6))) for _ in range(4)]
    sequences = []
    for _ in range(int(rng.integers(1, 14))):
        seq = roots[rng.integers(3)] + middles[rng.integers(4)] + tokens(int(rng.integers(0, 6)))
        sequences.append(seq[: int(rng.integers(1, len(seq) + 1))])
    return sequences + [list(sequences[i]) for i in rng.integers(0, len(sequences), 2)]


def path(parent: np.ndarray, row: int) -> list[int]:
    """The compact rows of `row`'s history, root first, itself last."""
    rows = [row]
    while parent[rows[-1]] >= 0:
        rows.append(int(parent[rows[-1]]))
    return rows[::-1]


def keys_of_rows(plan, num_rows: int) -> list[list[int]]:
    """What attention will read for each row: its segment up to itself, then every prefix block it is in."""
    keys = [[] for _ in range(num_rows)]
    segments = plan.segments.tolist()
    for start, end in zip(segments, segments[1:]):
        for row in range(start, end):
            keys[row] += range(start, row + 1)
    cu = plan.prefix_cu.tolist()
    for j, (k_start, k_end) in enumerate(zip(plan.prefix_key_start.tolist(), plan.prefix_key_end.tolist())):
        for row in plan.prefix_rows[cu[j]:cu[j + 1]].tolist():
            keys[row] += range(k_start, k_end)
    return keys


@pytest.mark.parametrize("seed", range(40))
def test_every_row_reads_its_path_exactly_once(seed):
    index = build_radix_index(*flatten_sequences(random_batch(seed)))
    plan = cascade_plan(index)
    parent = compact_parents(index)
    for row, keys in enumerate(keys_of_rows(plan, index.num_compact)):
        assert sorted(keys) == path(parent, row), f"row {row}"


@pytest.mark.parametrize("seed", range(10))
def test_segments_are_chains_and_prefix_keys_are_whole_segments(seed):
    index = build_radix_index(*flatten_sequences(random_batch(seed)))
    plan = cascade_plan(index)
    parent = compact_parents(index)
    segments = plan.segments.tolist()
    assert segments[0] == 0 and segments[-1] == index.num_compact and np.all(np.diff(plan.segments) > 0)
    for start, end in zip(segments, segments[1:]):
        assert all(parent[row] == row - 1 for row in range(start + 1, end))
    bounds = set(zip(segments, segments[1:]))
    assert set(zip(plan.prefix_key_start.tolist(), plan.prefix_key_end.tolist())) <= bounds
    assert plan.prefix_rows.dtype == np.int64 and plan.segments.dtype == plan.prefix_cu.dtype == np.int32


def test_no_sharing_is_one_causal_block_per_sequence():
    sequences = [[1, 2, 3], [4], [5, 6]]
    plan = cascade_plan(build_radix_index(*flatten_sequences(sequences)))
    assert plan.segments.tolist() == [0, 3, 4, 6] and not plan.has_prefix and plan.prefix_rows.size == 0


def test_one_shared_prefix_is_one_prefix_block():
    """32 x (8 shared + 3 own): the prefix's 8 rows are read once, by all 96 suffix rows together."""
    sequences = [list(range(8)) + [100 + 3 * i, 101 + 3 * i, 102 + 3 * i] for i in range(32)]
    plan = cascade_plan(build_radix_index(*flatten_sequences(sequences)))
    assert plan.segments.tolist() == [0, 8, *range(11, 8 + 96 + 1, 3)]
    assert plan.prefix_cu.tolist() == [0, 96] and plan.prefix_rows.tolist() == list(range(8, 104))
    assert (plan.prefix_key_start.tolist(), plan.prefix_key_end.tolist()) == ([0], [8])


def test_duplicates_and_prefixes_of_others_add_no_block():
    """A sequence that is a prefix of a later one, and copies, leave one chain: no branch, no prefix block."""
    plan = cascade_plan(build_radix_index(*flatten_sequences([[4, 5], [4, 5, 6], [4, 5, 6], [4]])))
    assert plan.segments.tolist() == [0, 3] and not plan.has_prefix


def test_nested_groups_read_each_ancestor_once():
    """system -> {query a -> {doc 1, doc 2}, query b}: doc rows merge two prefix blocks, query b's one."""
    system, qa, qb = [1, 2, 3], [10, 11], [20]
    index = build_radix_index(*flatten_sequences([system + qa + [30], system + qb, system + qa + [31, 32]]))
    plan = cascade_plan(index)
    # rows: system 0-2, qa 3-4, doc1 5, qb 6, doc2 7-8
    assert plan.segments.tolist() == [0, 3, 5, 6, 7, 9]
    assert plan.prefix_key_start.tolist() == [0, 3] and plan.prefix_key_end.tolist() == [3, 5]
    cu = plan.prefix_cu.tolist()
    assert plan.prefix_rows[cu[0]:cu[1]].tolist() == [3, 4, 5, 6, 7, 8]
    assert plan.prefix_rows[cu[1]:cu[2]].tolist() == [5, 7, 8]
