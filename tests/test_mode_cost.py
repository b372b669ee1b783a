"""`auto` by a cost model (issue 23 item 5): the work each mode does, the choice under given coefficients, the
calibration on the device (bounded, stored, travelling with the limits), and auto's outputs equal to those of the
mode it picked."""

import pickle
import time

import pytest
import torch

from radix_core.batch import BatchLimits, prepare_batch
from radix_core.cascade import cascade_plan
from radix_core.engine import Engine
from radix_core.index import build_radix_index, flatten_sequences
from radix_core.mode_calibration import Calibration, calibrate, combined, static_costs
from radix_core.mode_cost import WORK, ModeCosts, ModelShape, ModeWork, flop_costs, mode_works

# A long shared prefix (full's case), a short prefix before long tails (mlp's), and no sharing at all.
LONG_PREFIX = [list(range(1, 41)) + [50 + i, 60 + i] for i in range(6)]
SHORT_PREFIX = [[1, 2] + [10 * i + j for j in range(3, 30)] for i in range(1, 6)]
NO_SHARING = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]

# Coefficients under which each kind of work dominates the choice.
PAIRS_DEAR = ModeCosts(rows=1.0, pairs=1.0, scattered=0.01, merged=0.01, source="test")
MERGE_DEAR = ModeCosts(rows=1.0, pairs=0.001, scattered=0.01, merged=10.0, source="test")
MOVING_DEAR = ModeCosts(rows=1.0, pairs=0.001, scattered=10.0, merged=10.0, source="test")
QUERIES_DEAR = ModeCosts(rows=1.0, pairs=0.001, scattered=0.01, merged=0.01, source="test", queries=10.0)


def works(sequences) -> dict[str, ModeWork]:
    index = build_radix_index(*flatten_sequences(sequences))
    return mode_works(index, cascade_plan(index))


def limits(costs: ModeCosts, threshold: float = 1.0) -> BatchLimits:
    return BatchLimits(vocab_size=200, max_seq_len=64, radix_threshold=threshold, costs=costs)


def test_each_mode_does_the_work_its_layout_implies():
    # compact rows 1, 2, 3, 4 at positions 0, 1, 2, 2; segments [1, 2], [3], [4]; one prefix block, 2 queries
    got = works([[1, 2, 3], [1, 2, 4]])
    assert got == {"off": ModeWork(rows=6, pairs=12), "mlp": ModeWork(rows=4, pairs=12, scattered=10, queries=2),
                   "full": ModeWork(rows=4, pairs=1 + 2 + 3 + 3, merged=2)}


def test_rows_served_from_the_cache_leave_the_compact_modes_rows_and_keep_their_keys():
    index = build_radix_index(*flatten_sequences([[1, 2, 3], [1, 2, 4]]))
    cached, plain = mode_works(index, cascade_plan(index), cached_rows=2), works([[1, 2, 3], [1, 2, 4]])
    assert cached["off"] == plain["off"]
    for mode in ("mlp", "full"):
        assert cached[mode].rows == plain[mode].rows - 2 and cached[mode].pairs == plain[mode].pairs


@pytest.mark.parametrize("costs", [PAIRS_DEAR, MERGE_DEAR, MOVING_DEAR])
def test_a_batch_without_sharing_runs_off_whatever_the_coefficients(costs):
    assert costs.choose(works(NO_SHARING)) == "off"  # full does off's work exactly: the tie goes to off
    prepared = prepare_batch(NO_SHARING, "auto", limits(costs))
    assert prepared.mode == "off" and prepared.index is None and prepared.cascade is None


@pytest.mark.parametrize("sequences, costs, mode", [
    (LONG_PREFIX, PAIRS_DEAR, "full"),  # full scores the 40 shared rows once: 1,318 pairs against 5,418
    (SHORT_PREFIX, PAIRS_DEAR, "full"),  # 12 pairs fewer
    (SHORT_PREFIX, MERGE_DEAR, "mlp"),  # every tail row merges the prefix block: 135 merged rows
    (LONG_PREFIX, MERGE_DEAR, "mlp"),  # 12 merged rows, but pairs cost next to nothing
    (SHORT_PREFIX, MOVING_DEAR, "off"),  # moving rows costs more than the 8 rows it saves
    (SHORT_PREFIX, QUERIES_DEAR, "full"),  # mlp's attention runs over the 8 tokens it does not compute
])
def test_auto_runs_the_mode_of_least_predicted_time(sequences, costs, mode):
    predicted = {m: costs.predict(w) for m, w in works(sequences).items()}
    assert min(predicted, key=predicted.get) == mode
    prepared = prepare_batch(sequences, "auto", limits(costs))
    assert prepared.mode == mode and (prepared.cascade is not None) == (mode == "full")
    assert (prepared.index is not None) == (mode != "off")


def test_ties_go_to_the_simpler_mode():
    same = ModeWork(rows=3, pairs=3)
    assert PAIRS_DEAR.choose({"full": same, "mlp": same, "off": same}) == "off"
    assert PAIRS_DEAR.choose({"full": same, "mlp": same}) == "mlp"


def test_above_the_threshold_auto_runs_off_without_asking_the_model():
    compression = build_radix_index(*flatten_sequences(LONG_PREFIX)).compression  # 52 / 252
    assert prepare_batch(LONG_PREFIX, "auto", limits(PAIRS_DEAR, threshold=compression - 0.01)).mode == "off"
    assert prepare_batch(LONG_PREFIX, "auto", limits(PAIRS_DEAR, threshold=compression)).mode == "full"


def test_the_choice_travels_with_the_limits_to_another_process():
    """The index builder gets the engine's limits by pickle: the same coefficients, the same choices."""
    travelled = pickle.loads(pickle.dumps(limits(MERGE_DEAR)))
    assert travelled == limits(MERGE_DEAR)
    assert [prepare_batch(s, "auto", travelled).mode for s in (LONG_PREFIX, SHORT_PREFIX, NO_SHARING)] == \
        [prepare_batch(s, "auto", limits(MERGE_DEAR)).mode for s in (LONG_PREFIX, SHORT_PREFIX, NO_SHARING)]


def test_static_costs_are_flops_and_bytes_of_the_model(tiny_model_dir):
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", prefix_cache_bytes=0)
    shape = ModelShape.of(engine.arch.config)
    assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.intermediate) == (64, 2, 4, 2, 128)
    costs = engine.mode_costs  # before warm_up
    assert costs == flop_costs(shape, "cpu", 4, absorbs=True) and costs.source.startswith("static FLOP count")
    assert costs.rows == shape.row_flops() and costs.pairs == shape.pair_flops()
    assert flop_costs(shape, "cuda", 2).merged > flop_costs(shape, "cpu", 4).merged  # moving bytes dearer on GPUs
    assert engine.limits.costs is costs
    # uncalibrated, auto still takes full for a long shared prefix and off without sharing
    assert [engine.prepare(s, "auto").mode for s in (LONG_PREFIX, NO_SHARING)] == ["full", "off"]


def test_warm_up_calibrates_and_the_limits_carry_it(tiny_model_dir):
    """(The budget is checked without a clock: test_a_calibration_out_of_time_keeps_the_static_model_and_says_so.)"""
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", prefix_cache_bytes=0)
    static = engine.mode_costs
    engine.warm_up()
    costs = engine.mode_costs
    assert costs is not static and engine.limits.costs is costs
    # measured (seconds: far below a FLOP count), or on a machine too busy to measure within the budget, the static
    # model saying so (test_a_slope_is_the_time_per_unit... checks the measuring itself, on runs of known length)
    assert (costs.source.startswith("calibrated on cpu") and costs.rows < 0.1) or \
        "calibration on cpu measured no row cost" in costs.source
    assert all(getattr(costs, name) > 0 for name in WORK)


def test_engines_that_never_choose_keep_the_static_model(tiny_model_dir):
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", radix="mlp",
                                    prefix_cache_bytes=0)
    engine.warm_up()
    assert engine.mode_costs.source.startswith("static FLOP count")


def test_a_calibration_out_of_time_keeps_the_static_model_and_says_so(tiny_model_dir):
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", prefix_cache_bytes=0)
    costs = calibrate(engine.arch, engine.backend, engine.limits, engine.device, engine.dtype, budget_s=0.0)
    static = static_costs(engine.arch, engine.device, engine.dtype)
    assert [getattr(costs, n) for n in WORK] == [getattr(static, n) for n in WORK]
    assert "calibration on cpu measured no row cost" in costs.source


def test_coefficients_measured_at_zero_or_below_take_their_static_ratio_to_rows():
    static = ModeCosts(rows=100.0, pairs=1.0, scattered=5.0, merged=20.0, source="static")
    got = combined({"rows": 0.5, "pairs": -1e-9, "scattered": 0.1, "queries": 0.2}, static, torch.device("cpu"),
                   1.25)
    assert (got.rows, got.pairs, got.scattered, got.merged, got.queries) == (0.5, 0.005, 0.1, 0.1, 0.2)
    assert got.source == "calibrated on cpu in 1.25 s; pairs, merged at the static ratio to rows"


def test_a_slope_is_the_time_per_unit_of_the_work_its_runs_differ_in(tiny_model_dir):
    """Runs that sleep 0.1 ms per row (and 0.01 ms per pair): the slope finds the rate of the work asked for, the
    other's taken off at its known rate."""
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", prefix_cache_bytes=0)
    probes = Calibration(engine.arch, engine.backend, engine.limits, engine.device, engine.dtype, float("inf"))

    def sleeper(rows: int, pairs: int):
        return (lambda: time.sleep(rows * 1e-4 + pairs * 1e-5)), ModeWork(rows, pairs)

    def probe(size: int):  # the larger run adds `size` rows and `size` pairs
        return sleeper(size, 0), sleeper(2 * size, size)

    assert probes.slope(probe, 64, "rows", known={"pairs": 1e-5}) == pytest.approx(1e-4, rel=0.2)
    assert probes.slope(probe, 64, "rows", tied={"pairs": 0.1}) == pytest.approx(1e-4, rel=0.2)


def test_each_probe_differs_only_in_the_work_it_measures(tiny_model_dir):
    """A slope is only that work's cost when the two runs differ in nothing else (or in what is taken off)."""
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", prefix_cache_bytes=0)
    probes = Calibration(engine.arch, engine.backend, engine.limits, engine.device, engine.dtype, float("inf"))
    for probe, unit, also in [(probes.row_probe, "rows", {"pairs"}), (probes.pair_probe, "pairs", set()),
                              (probes.scatter_probe, "scattered", set()), (probes.merge_probe, "merged", {"pairs"}),
                              (probes.query_probe, "queries", {"pairs"})]:
        (_, base), (_, more) = probe(256)
        grew = {name for name in WORK if getattr(more, name) != getattr(base, name)}
        assert unit in grew and grew <= {unit} | also and getattr(more, unit) > getattr(base, unit)


@pytest.mark.parametrize("batch, costs, mode", [(LONG_PREFIX + NO_SHARING, PAIRS_DEAR, "full"),
                                               (SHORT_PREFIX + NO_SHARING, MERGE_DEAR, "mlp"),
                                               (SHORT_PREFIX + NO_SHARING, MOVING_DEAR, "off")])
def test_auto_gives_exactly_the_outputs_of_the_mode_it_picked(tiny_model_dir, batch, costs, mode):
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "causal_lm")), device="cpu", radix_threshold=1.0,
                                    prefix_cache_bytes=0)
    engine.mode_costs = costs
    assert engine.prepare(batch).mode == mode
    auto, forced = engine.hidden_states(batch), engine.hidden_states(batch, mode=mode)
    assert all(torch.equal(a, f) for a, f in zip(auto, forced))
    positions = [[0, len(s) - 1] for s in batch]
    assert all(torch.equal(a, f) for a, f in zip(engine.lm_logits(batch, positions),
                                                 engine.lm_logits(batch, positions, mode=mode)))


def test_the_torch_backend_merges_no_short_prefix_block_and_auto_counts_what_it_merges():
    """`merged` counts the prefix rows the backend merges: all of them for flash and Triton, only those of blocks
    longer than the torch backend absorbs for it (here the 20-key prefix, not the 2-key branch below it)."""
    prefix, branch = list(range(1, 21)), [30, 31]
    sequences = [prefix + branch + [40 + i] * 5 for i in range(4)] + [prefix + [50 + i] * 5 for i in range(4)]
    prepared = prepare_batch(sequences, "full", limits(MERGE_DEAR))
    every = mode_works(prepared.index, prepared.cascade)["full"].merged
    kept = mode_works(prepared.index, prepared.cascade, absorbs=True)["full"].merged
    assert every == int(prepared.cascade.prefix_rows.shape[0]) == (2 + 4 * 5 + 4 * 5) + 4 * 5
    assert kept == 2 + 4 * 5 + 4 * 5  # the rows below the prefix, once; the branch's block is absorbed
