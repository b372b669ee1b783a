"""The radix index against a brute-force oracle, against radix-mlp, and on bad input."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_core import index as index_module
from radix_core.index import build_radix_index, flatten_sequences

BACKENDS = ["numpy"] + (["rust"] if index_module._rust_fold_and_scatter is not None else [])


def oracle(sequences, positions=None):
    """Brute force: compact token = distinct full (token, position) history, numbered by first appearance."""
    first, scatter = {}, []
    offset = 0
    for s, seq in enumerate(sequences):
        pos = positions[s] if positions is not None else range(len(seq))
        history = ()
        for i, (tok, p) in enumerate(zip(seq, pos)):
            history += ((int(tok), int(p)),)
            scatter.append(first.setdefault(history, (len(first), offset + i))[0])
        offset += len(seq)
    fold_gather = [orig for _, orig in sorted(first.values())]
    return np.array(scatter), np.array(fold_gather)


def batches():
    """Random batches built from a few shared stems: prefixes, duplicates, single tokens, no sharing."""
    stem = st.lists(st.integers(0, 4), min_size=1, max_size=12)
    seq = st.tuples(st.integers(0, 2), st.integers(0, 12), st.lists(st.integers(0, 4), max_size=6))
    return st.tuples(st.lists(stem, min_size=3, max_size=3), st.lists(seq, min_size=1, max_size=10)).map(
        lambda t: [t[0][k][:cut] + tail or [0] for k, cut, tail in t[1]]
    )


def check_index(sequences, backend, positions=None):
    ids, cu = flatten_sequences(sequences)
    flat_pos = None if positions is None else np.concatenate([np.asarray(p) for p in positions])
    index = build_radix_index(ids, cu, flat_pos, backend=backend)
    scatter, fold_gather = oracle(sequences, positions)
    np.testing.assert_array_equal(index.scatter, scatter)
    np.testing.assert_array_equal(index.fold_gather, fold_gather)
    np.testing.assert_array_equal(index.compact_input_ids, ids[fold_gather])
    pos = flat_pos if flat_pos is not None else np.concatenate([np.arange(len(s)) for s in sequences])
    np.testing.assert_array_equal(index.compact_position_ids, pos[fold_gather])
    rows = torch.randn(index.num_compact, 3)[index.scatter.astype(np.int64)]  # (N, 3): equal rows per node
    folded = rows[index.fold_gather.astype(np.int64)]  # (N', 3)
    torch.testing.assert_close(folded[index.scatter.astype(np.int64)], rows, rtol=0, atol=0)
    check_blocks(index)
    assert index.compression == pytest.approx(len(fold_gather) / len(ids))
    return index


def check_blocks(index):
    """Each sequence's added block is contiguous, in order, and a suffix of its path."""
    q = index.cu_seqlens_q.astype(np.int64)
    assert q[0] == 0 and q[-1] == index.num_compact and (np.diff(q) >= 0).all()
    for s in range(index.num_sequences):
        path = index.scatter[index.cu_seqlens[s]:index.cu_seqlens[s + 1]].astype(np.int64)
        block = np.arange(q[s], q[s + 1])
        if block.size:
            np.testing.assert_array_equal(path[-block.size:], block)
        assert (path[: path.size - block.size] < q[s]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=150, deadline=None)
@given(sequences=batches())
def test_index_matches_oracle(backend, sequences):
    check_index(sequences, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "sequences",
    [
        [[7]],
        [[1, 2, 3]],
        [[1, 2, 3], [1, 2, 3], [1, 2, 3]],
        [[1, 2, 3, 4], [1, 2], [1, 2, 3, 4, 5]],
        [[1, 2, 3, 4, 5], [1, 2]],
        [[5], [5], [6], [5, 6]],
        [[1, 2], [3, 4], [5, 6]],
        [[1, 1, 1], [1, 1, 2], [2, 1, 1]],
    ],
    ids=["one-token", "one-seq", "duplicates", "prefix-later", "prefix-earlier", "single-tokens", "no-sharing",
         "repeated-token"],
)
def test_index_edge_cases(backend, sequences):
    check_index(sequences, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_positions_are_part_of_the_history(backend):
    """Equal tokens at different positions never merge; custom positions are honoured."""
    sequences = [[1, 2, 3], [1, 2, 3], [1, 2, 3]]
    positions = [[0, 1, 2], [5, 6, 7], [0, 1, 2]]
    index = check_index(sequences, backend, positions)
    assert index.num_compact == 6


@pytest.mark.skipif("rust" not in BACKENDS, reason="radix-mlp has wheels for x86-64 only")
@pytest.mark.parametrize("seed", range(5))
def test_rust_and_numpy_agree_on_large_batches(seed):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 50, 300)
    sequences = [np.concatenate([prefix[: rng.integers(0, 300)], rng.integers(0, 3, rng.integers(1, 40))])
                 for _ in range(64)]
    ids, cu = flatten_sequences(sequences)
    a = build_radix_index(ids, cu, backend="rust")
    b = build_radix_index(ids, cu, backend="numpy")
    for field in ("compact_input_ids", "compact_position_ids", "fold_gather", "scatter", "cu_seqlens_q"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


@pytest.mark.skipif("rust" not in BACKENDS, reason="radix-mlp has wheels for x86-64 only")
def test_matches_radix_mlp_directly():
    from radix_mlp import compute_fold_and_scatter

    sequences = [[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 4], [9], [1, 2, 3, 6, 7]]
    ids, cu = flatten_sequences(sequences)
    pos = np.concatenate([np.arange(len(s)) for s in sequences])
    expected = compute_fold_and_scatter(ids.astype(np.uint32), pos.astype(np.uint32), cu.astype(np.uint32))
    index = build_radix_index(ids, cu, backend="numpy")
    for got, want in zip((index.compact_input_ids, index.compact_position_ids, index.scatter, index.fold_gather),
                         expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("convert", [list, np.asarray, torch.tensor], ids=["list", "numpy", "torch"])
def test_accepts_lists_arrays_and_tensors(convert):
    index = build_radix_index(convert([1, 2, 3, 1, 2, 4]), convert([0, 3, 6]))
    np.testing.assert_array_equal(index.scatter, [0, 1, 2, 0, 1, 3])
    np.testing.assert_array_equal(index.cu_seqlens_q, [0, 3, 4])


@pytest.mark.parametrize(
    "ids, cu, pos, message",
    [
        ([1, -2, 3], [0, 3], None, r"input_ids must be non-negative: input_ids\[1\] = -2"),
        ([1, 2, 3], [1, 3], None, "cu_seqlens must start at 0"),
        ([1, 2, 3], [0, 2, 1, 3], None, "non-decreasing"),
        ([1, 2, 3], [0, 2], None, "must end at the number of tokens 3"),
        ([1, 2, 3], [0, 3, 3], None, "sequence 1 is empty"),
        ([1, 2, 3], [0], None, "at least 2 entries"),
        ([1, 2, 3], [0, 3], [0, 1], "position_ids has 2 entries but input_ids has 3"),
        ([1, 2, 3], [0, 3], [0, -1, 2], "position_ids must be non-negative"),
        ([[1, 2, 3]], [0, 3], None, "input_ids must be 1-D"),
        ([1.5, 2.0], [0, 2], None, "must hold integers"),
        ([1, 2**33], [0, 2], None, "below 2\\*\\*32"),
    ],
)
def test_bad_input_names_the_problem(ids, cu, pos, message):
    with pytest.raises(ValueError, match=message):
        build_radix_index(ids, cu, pos)


def test_flatten_rejects_empty_batches_and_sequences():
    with pytest.raises(ValueError, match="the batch is empty"):
        flatten_sequences([])
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        flatten_sequences([[1], []])


def test_unknown_backend():
    with pytest.raises(ValueError, match="choose one of auto, rust, numpy"):
        build_radix_index([1], [0, 1], backend="cuda")
