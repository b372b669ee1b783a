"""The engine benchmark's pure parts: work counts behind its FLOP bounds, marginal costs, its named batches."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import engine_bench as eb  # noqa: E402  (bench/ is not a package)
import engine_workloads as workloads  # noqa: E402


def test_work_counts_rows_and_pairs_of_each_mode():
    batch = [[1, 2, 3], [1, 2, 4]]  # compact: 1, 2, 3, 4 at positions 0, 1, 2, 2
    assert eb.work(batch, "off") == (6, 12)
    assert eb.work(batch, "mlp") == (4, 12)
    assert eb.work(batch, "full") == (4, 1 + 2 + 3 + 3)


@pytest.mark.parametrize("prefix, suffix, batch", [(0, 5, 3), (7, 4, 5), (16, 1, 2)])
def test_full_work_on_one_shared_prefix_is_the_prefix_once_plus_suffixes_reading_it(prefix, suffix, batch):
    sequences = workloads.synthetic_prefix(np.random.default_rng(0), prefix=prefix, suffix=suffix, batch=batch)
    assert len({s[prefix] for s in sequences}) == batch  # the suffixes part at their first token (seeded)
    rows, pairs = eb.work(sequences, "full")
    assert rows == prefix + batch * suffix
    assert pairs == prefix * (prefix + 1) // 2 + batch * (suffix * prefix + suffix * (suffix + 1) // 2)


def test_marginal_costs_between_consecutive_counts():
    assert eb.marginal_costs([8, 32, 128], [1.0, 2.2, 7.0]) == pytest.approx([None, 0.05, 0.05])
    assert eb.marginal_costs([4], [1.0]) == [None]


def test_named_batches_are_the_same_in_every_process_and_shaped_as_named():
    assert set(workloads.SHAPES) <= set(workloads.BATCHES)
    assert workloads.make_batch("synthetic 32x(512+64)") == workloads.make_batch("synthetic 32x(512+64)")
    long = workloads.make_batch("synthetic 32x(2048+256)")
    assert len(long) == 32 and {len(s) for s in long} == {2304} and all(s[:2048] == long[0][:2048] for s in long)
    assert [name for name, shape in workloads.SHAPES.items() if shape.long] == ["synthetic 32x(2048+256)"]
    for n in workloads.SCALING_COUNTS:
        shared = workloads.make_batch(workloads.scaling_name(n))
        alone = workloads.make_batch(workloads.suffixes_name(n))
        assert len(shared) == len(alone) == n
        assert {len(s) for s in shared} == {workloads.SCALING_PREFIX + workloads.SCALING_SUFFIX}
        assert {len(s) for s in alone} == {workloads.SCALING_SUFFIX}
