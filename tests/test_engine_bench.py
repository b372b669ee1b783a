"""The benchmarks' pure parts: the engine benchmark's work counts behind its FLOP bounds, marginal costs and named
batches; the shared workloads (`bench/workloads.py`), padded baseline and load driver."""

import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import engine_bench as eb  # noqa: E402  (bench/ is not a package)
import workloads  # noqa: E402


def test_work_counts_rows_and_pairs_of_each_mode():
    batch = [[1, 2, 3], [1, 2, 4]]  # compact: 1, 2, 3, 4 at positions 0, 1, 2, 2
    assert (eb.work(batch, "off").rows, eb.work(batch, "off").pairs) == (6, 12)
    assert (eb.work(batch, "mlp").rows, eb.work(batch, "mlp").pairs) == (4, 12)
    assert (eb.work(batch, "full").rows, eb.work(batch, "full").pairs) == (4, 1 + 2 + 3 + 3)


@pytest.mark.parametrize("prefix, suffix, batch", [(0, 5, 3), (7, 4, 5), (16, 1, 2)])
def test_full_work_on_one_shared_prefix_is_the_prefix_once_plus_suffixes_reading_it(prefix, suffix, batch):
    sequences = workloads.synthetic_prefix(np.random.default_rng(0), prefix=prefix, suffix=suffix, batch=batch)
    assert len({s[prefix] for s in sequences}) == batch  # the suffixes part at their first token (seeded)
    full = eb.work(sequences, "full")
    assert full.rows == prefix + batch * suffix
    assert full.pairs == prefix * (prefix + 1) // 2 + batch * (suffix * prefix + suffix * (suffix + 1) // 2)
    assert full.merged == (batch * suffix if prefix else 0)  # each suffix row merges the prefix block


def test_auto_section_says_what_auto_picked_and_whether_it_was_the_fastest():
    from timing import Timing

    from radix_core.mode_cost import ModeCosts

    costs = ModeCosts(rows=1e-3, pairs=1e-6, scattered=1e-5, merged=1e-4, source="calibrated on cpu in 0.50 s")
    static = ModeCosts(rows=1.0, pairs=0.0, scattered=1.0, merged=1.0, source="static")  # full's work is off's
    works = {m: eb.work([[1, 2, 3], [1, 2, 4]], m) for m in ("off", "mlp", "full")}
    times = {"off": Timing(3.0, 2.9, 3.1), "mlp": Timing(2.0, 1.9, 2.6), "full": Timing(2.5, 2.1, 2.7),
             "auto": Timing(2.4, 2.0, 2.6)}
    text = eb.auto_section(costs, static, [eb.ShapeRun("a", times, "full", works),
                                           eb.ShapeRun("b", times, "mlp", works)])
    assert "Picked the fastest on 1 of 2 shapes" in text and "calibrated on cpu in 0.50 s" in text
    assert "| a | 0.006 / 0.004 / 0.004 | 2.900 / 1.900 / 2.100 | full ² | mlp | 1.11 | off |" in text
    assert "| b | 0.006 / 0.004 / 0.004 | 2.900 / 1.900 / 2.100 | mlp | mlp | 1.00 | off |" in text
    assert "² a: full 2.500 (2.100-2.700) against mlp 2.000 (1.900-2.600) (1.11x the least time; also by median)." \
        in text


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


def test_msmarco_ids_follow_the_shape():
    shape = workloads.MsMarco(queries=3, passages_per_query=4)
    batch = workloads.msmarco_ids(np.random.default_rng(0), shape)
    template, suffix = batch[0][:shape.template_tokens], batch[0][-shape.suffix_tokens:]
    assert len(batch) == 12 and all(s[:50] == template and s[-10:] == suffix for s in batch)
    for q in range(3):
        group = batch[4 * q:4 * q + 4]
        lengths = {len(s) - 60 for s in group}  # query + passage
        assert min(lengths) >= 8 + 40 and max(lengths) <= 19 + 120
        assert len({tuple(s[50:58]) for s in group}) == 1  # the query's first 8 tokens, shared by its passages
    assert workloads.make_batch("msmarco-rerank 64 seqs") == workloads.msmarco_ids(np.random.default_rng(0))


def test_msmarco_texts_have_the_shape_in_tokens_and_the_seed_fixes_them():
    from radix_core.tiny_models import make_tiny_tokenizer

    count = workloads.token_counter(make_tiny_tokenizer())
    shape = workloads.MsMarco(queries=3, passages_per_query=5)
    groups = workloads.msmarco_texts(np.random.default_rng(7), count, shape)
    assert len({g.query for g in groups}) == 3 and all(len(g.passages) == 5 for g in groups)
    sizes = [count(p) for g in groups for p in g.passages]
    assert max(sizes) <= shape.passage_tokens[1] and min(sizes) >= shape.passage_tokens[0] - 10  # a word's tokens
    again = workloads.msmarco_texts(np.random.default_rng(7), count, shape)
    assert [(g.query, g.passages) for g in again] == [(g.query, g.passages) for g in groups]


def test_streams_send_every_passage_once_in_requests_of_one_query():
    groups = [workloads.QueryPassages(f"q{i}", [f"q{i} d{j}" for j in range(5)]) for i in range(3)]
    stream = workloads.rerank_stream(groups, 2, np.random.default_rng(0))
    assert sorted(d for r in stream for d in r["documents"]) == sorted(p for g in groups for p in g.passages)
    assert all(len(r["documents"]) <= 2 and all(d.startswith(r["query"] + " ") for d in r["documents"])
               for r in stream)
    embed = workloads.embed_requests([f"t{i}" for i in range(5)], 2)
    assert [r["texts"] for r in embed] == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    assert {r["instruction"] for r in embed} == {workloads.EMBED_INSTRUCTION}


def test_mixed_reranks_span_8_to_1000_documents():
    sizes = [len(r["documents"]) for r in workloads.mixed_reranks(np.random.default_rng(0), count=200)]
    assert min(sizes) >= 8 and max(sizes) <= 1000 and min(sizes) < 20 and max(sizes) > 500


def test_padded_baseline_equals_each_sequence_alone(tiny_model_dir):
    import torch
    from padded_baseline import padded_last_hidden
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_model_dir("qwen3", "base")).eval()
    sequences = [[5, 6, 7, 8, 9], [5, 6], [11, 12, 13]]
    batched = padded_last_hidden(model, sequences)  # (3, hidden)
    alone = torch.cat([padded_last_hidden(model, [s]) for s in sequences])  # (3, hidden)
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


class Refused(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.RESOURCE_EXHAUSTED


def answer(request: int) -> int:
    if request % 3 == 0:
        raise Refused()
    if request == 4:
        raise ValueError("broken")
    return request


def test_closed_loop_sends_every_request_once_and_names_each_failure():
    from load_driver import LoadDriver

    outcomes = LoadDriver(answer, iter(range(1, 10))).closed_loop(3, label="test")
    assert sorted(o.code for o in outcomes) == ["OK"] * 5 + ["RESOURCE_EXHAUSTED"] * 3 + ["ValueError"]
    assert sorted(o.tokens for o in outcomes if o.code == "OK") == [1, 2, 5, 7, 8]
    assert all(o.tokens == 0 and o.error for o in outcomes if o.code != "OK")
    assert [o.error for o in outcomes if o.code == "ValueError"] == ["ValueError('broken')"]


def test_closed_loop_stops_when_the_time_is_up_and_open_loop_waits_for_every_answer():
    from itertools import cycle

    from load_driver import LoadDriver

    driver = LoadDriver(lambda r: r, cycle([1, 2]))
    assert driver.closed_loop(2, seconds=0.0) == []
    outcomes = driver.open_loop(200.0, 0.1, "test", np.random.default_rng(0))
    assert outcomes and all(o.code == "OK" and o.tokens in (1, 2) for o in outcomes)
    assert driver.one().code == "OK"


def test_free_port_can_be_bound():
    import socket

    from local_serve import free_port

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
