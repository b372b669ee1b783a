"""Batch-invariant mode (issue 32): a sequence's outputs are bitwise the same whatever else is in its batch, in every
radix mode, with or without the prefix cache, in float32 and bfloat16 (`torch.equal`, not a tolerance).

From the bottom up: the primitives it is built on keep a row's bits whatever the other rows (fixed-shape gemms,
the CPU attention kernel at one fixed shape), while a plain gemm does not; the attention plan reads each row's path
in fixed chunks; then random batches through the engine, and the task APIs (scores, embeddings, log-probabilities).
The default mode is shown not to be invariant on a batch where the trie splits the target's keys, so these tests
can tell the two apart. Exactness against transformers in this mode: tests/test_engine_golden.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radix_core.engine import Engine
from radix_core.invariant_attention import KEY_CHUNK, QUERY_TILE, key_paths
from radix_core.invariant_matmul import ROW_TILE, row_tile, tiled_linear
from radix_core.tasks import TaskConfig
from radix_core.templates import QWEN3_EMBEDDING, QWEN3_RERANKER

VOCAB = 400  # below the tiny model's vocabulary
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SHAPES = [(64, 192), (64, 64), (512, 1536), (1536, 512)]  # (in, out) of the tiny and the bench model's linears


# --- the primitives -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES)
def test_tiled_linear_gives_a_row_the_same_bits_among_any_rows(dtype, shape):
    gen = torch.Generator().manual_seed(0)
    k, n = shape
    weight = torch.randn(n, k, generator=gen).to(DTYPES[dtype])
    bias = torch.randn(n, generator=gen).to(DTYPES[dtype])
    tile = row_tile(DTYPES[dtype])
    x = torch.randn(3 * tile + 5, k, generator=gen).to(DTYPES[dtype])
    want = tiled_linear(x, weight, bias)  # (M, n)
    torch.testing.assert_close(want.float(), F.linear(x, weight, bias).float(), atol=0.05, rtol=0.02)
    for start, size in ((0, 1), (7, 2), (3, 17), (100, tile), (1, 2 * tile + 3), (tile - 1, 40)):
        assert torch.equal(tiled_linear(x[start:start + size], weight, bias), want[start:start + size])


def test_a_plain_gemm_gives_a_row_other_bits_among_other_rows():
    """Why the tiles: MKL computes one row alone (gemv) otherwise than among 16 (gemm), on this CPU and library."""
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(1536, 512, generator=gen), torch.randn(16, 512, generator=gen)
    assert not torch.equal(F.linear(x[:1], weight)[0], F.linear(x, weight)[0])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_cpu_attention_kernel_at_one_shape_gives_a_query_the_same_bits(dtype):
    """`_scaled_dot_product_flash_attention_for_cpu` at the two shapes the mode calls it with, (QUERY_TILE queries,
    KEY_CHUNK keys) unmasked and (KEY_CHUNK, KEY_CHUNK) causal: a query's output and log-sum-exp do not depend on
    the number of tiles, the other tiles, its place in an unmasked tile, or (causal) the keys after its own."""
    gen = torch.Generator().manual_seed(0)
    tiles, kind = 12, DTYPES[dtype]
    k, v = (torch.randn(tiles, 2, KEY_CHUNK, 16, generator=gen).to(kind) for _ in range(2))
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    for queries, causal in ((QUERY_TILE, False), (KEY_CHUNK, True)):
        q = torch.randn(tiles, 4, queries, 16, generator=gen).to(kind)
        out, lse = kernel(q, k, v, 0.0, causal, scale=0.25)[:2]
        pick = torch.tensor([5, 0, 11])
        sub_out, sub_lse = kernel(q[pick], k[pick], v[pick], 0.0, causal, scale=0.25)[:2]
        assert torch.equal(sub_out, out[pick]) and torch.equal(sub_lse, lse[pick])
        if not causal:
            rolled_out, rolled_lse = kernel(q.roll(3, 2), k, v, 0.0, causal, scale=0.25)[:2]
            assert torch.equal(rolled_out.roll(-3, 2), out) and torch.equal(rolled_lse.roll(-3, 2), lse)
        else:
            for cut in (1, 37, 64, 100):  # another sequence's keys after position `cut`: queries up to it unchanged
                other_k = torch.cat([k[:, :, :cut], -k[:, :, cut:]], 2)
                other_v = torch.cat([v[:, :, :cut], 3 * v[:, :, cut:]], 2)
                other_out, other_lse = kernel(q, other_k, other_v, 0.0, causal, scale=0.25)[:2]
                assert torch.equal(other_out[:, :, :cut], out[:, :, :cut])
                assert torch.equal(other_lse[:, :, :cut], lse[:, :, :cut])


# --- the attention plan ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """`engines(dtype, cache, invariant=True)`: tiny Qwen3 engines with the task templates, built once."""
    built = {}

    def get(dtype: str, cache: bool, invariant: bool = True) -> Engine:
        key = (dtype, cache, invariant)
        if key not in built:
            tasks = TaskConfig(templates={"rerank": QWEN3_RERANKER, "embed": QWEN3_EMBEDDING})
            built[key] = Engine.from_pretrained(str(tiny_model_dir("qwen3", "causal_lm")), device="cpu", dtype=dtype,
                                                batch_invariant=invariant, prefix_cache_bytes="auto" if cache else 0,
                                                tasks=tasks)
        engine = built[key]
        if engine.prefix_cache is not None:
            engine.prefix_cache.clear()
        return engine

    return get


@pytest.mark.parametrize("mode", ["off", "mlp", "full"])
def test_every_row_reads_its_path_in_chunks_at_fixed_positions(engines, mode):
    """Rebuilt from the tiles: each computed row's jobs are chunks 0, 1, ... of its path, each with the path's
    rows at positions [64c, 64c + 64) up to the row's own position, whatever the plan (cache hits included)."""
    engine = engines("float32", True)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, VOCAB, 150).tolist()
    engine.forward([prompt + [1], prompt + [2]], mode)  # admits the prompt
    batch = [prompt + rng.integers(0, VOCAB, n).tolist() for n in (3, 170)] + [prompt[:100], [5] * 300]
    plan = engine.run(engine.prepare(batch, mode)).plan
    assert plan.cached_lengths.tolist() == [150, 150, 100, 0]
    paths = key_paths(plan.token_rows, plan.cu_seqlens, plan.num_rows, torch.device("cpu"))
    read = {}  # row -> {chunk: visible key rows}
    kinds = {"whole": [(paths.whole, 0)], "last": [(paths.diagonal, 0), (paths.masked, paths.diagonal.q_rows.numel())]}
    for c, chunk in enumerate(paths.chunks):
        rows = iter(paths.order.tolist())
        for kind, slots in zip(kinds, chunk):
            for slot in slots.tolist():
                tiles, base = [(t, b) for t, b in kinds[kind] if slot >= b][-1]
                row, (tile, i) = next(rows), divmod(slot - base, tiles.queries)
                assert tiles.q_rows.view(-1, tiles.queries)[tile, i] == row
                seen = int(tiles.seen()[tile, i])
                read.setdefault(row, {})[c] = tiles.k_rows.view(-1, KEY_CHUNK)[tile, :seen].tolist()
    assert torch.equal(paths.order[paths.back], torch.arange(plan.num_rows))
    for s in range(len(batch)):
        path = plan.token_rows[plan.cu_seqlens[s]:plan.cu_seqlens[s + 1]]
        for p, row in enumerate(path.tolist()):
            if row < plan.num_rows:
                want = {c: path[c * KEY_CHUNK:min(c * KEY_CHUNK + KEY_CHUNK, p + 1)].tolist()
                        for c in range(p // KEY_CHUNK + 1)}
                assert read[row] == want


# --- random batches through the engine ------------------------------------------------------------------------------

def target_outputs(engine: Engine, batch: list[list[int]], where: int, mode: str) -> list[torch.Tensor]:
    """The target's final hidden states (L, hidden), LM logits at its last token, and the log-probability of each of
    its tokens after the ones before it, as the engine's result gives them."""
    result = engine.run(engine.prepare(batch, mode))
    length = len(batch[where])
    rows = result.rows(np.full(length, where), np.arange(length))  # (L,)
    with engine.numerics():
        logits = torch.from_numpy(result.head_outputs(rows[-1:]))
        logprobs = torch.from_numpy(result.token_logprobs(rows[:-1], np.asarray(batch[where][1:])))
    return [result.hidden_at(rows), logits, logprobs]


@st.composite
def batches(draw):
    """A target and companions sharing a prefix of it of any length (a duplicate, a prefix of it, a branch at any
    position, unrelated), the target anywhere in the batch, and what an earlier batch left in the prefix cache."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    target = rng.integers(0, VOCAB, draw(st.integers(1, 200))).tolist()
    companions = []
    for shared, own in draw(st.lists(st.tuples(st.integers(0, 220), st.integers(0, 90)), max_size=6)):
        companion = target[:shared] + rng.integers(0, VOCAB, own).tolist()
        companions.append(companion or [int(rng.integers(0, VOCAB))])
    where = draw(st.integers(0, len(companions)))
    warm = draw(st.integers(0, len(target)))  # an earlier batch shared the target's first `warm` tokens
    return target, companions[:where] + [target] + companions[where:], where, warm


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=batches(), dtype=st.sampled_from(list(DTYPES)), mode=st.sampled_from(["off", "mlp", "full", "auto"]),
       cache=st.booleans())
def test_a_sequence_s_outputs_are_bitwise_the_same_in_any_batch(engines, case, dtype, mode, cache):
    target, batch, where, warm = case
    want = target_outputs(engines(dtype, False), [target], 0, "off")
    engine = engines(dtype, cache)
    if cache and warm:
        engine.forward([target[:warm] + [1], target[:warm] + [2]], "full")  # two sightings: admitted
    got = target_outputs(engine, batch, where, mode)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_the_default_mode_is_not_bitwise_invariant(engines):
    """The teeth of the tests above: in `full` the trie splits the target's keys at its branch (a prefix block
    merged with a causal block) where alone they are one block, and float32 rounds the two differently."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, VOCAB, 90).tolist()
    target = prompt + rng.integers(0, VOCAB, 30).tolist()
    batch = [prompt + rng.integers(0, VOCAB, 30).tolist(), target]
    default, invariant = engines("float32", False, invariant=False), engines("float32", False)
    for engine, invariant_here in ((default, False), (invariant, True)):
        together, alone = target_outputs(engine, batch, 1, "full")[0], target_outputs(engine, [target], 0, "full")[0]
        assert torch.equal(together, alone) is invariant_here


# --- the task APIs ---------------------------------------------------------------------------------------------------

DOCS = ["Canberra is the capital of Australia, chosen as a compromise between Sydney and Melbourne.",
        "Sydney is the largest city.", "Bread is baked from flour, water and yeast.", "中文文本",
        "Es ist halb acht und der Zug fährt gleich ab. " * 6]


def rerank_scores(engine, docs):
    return {h.index: h.score for h in engine.rerank("capital of australia", docs).results}


def tasks(engine):
    """Per task: the target's output alone, and inside two requests with other items (the second reads the first's
    template and query from the prefix cache when there is one)."""
    rerank = [rerank_scores(engine, [DOCS[0]])[0], rerank_scores(engine, DOCS)[0], rerank_scores(engine, DOCS[::-1])[4]]
    embeds = []
    for pooling in ("last", "mean"):
        runs = (engine.embed([DOCS[0]], instruction="Find passages", pooling=pooling).embeddings[0],
                engine.embed(DOCS, instruction="Find passages", pooling=pooling).embeddings[0],
                engine.embed(DOCS[::-1], instruction="Find passages", pooling=pooling).embeddings[4])
        embeds.append([r.tobytes() for r in runs])
    context = "The capital of Australia is"
    scores = [engine.score(context, [" Canberra"]).scores[0].logprob,
              engine.score(context, [" Sydney", " Canberra", " Melbourne"]).scores[1].logprob,
              engine.score(context, [" Canberra, of course", " Canberra"]).scores[1].logprob]
    return {"rerank": rerank, "embed last": embeds[0], "embed mean": embeds[1], "score": scores}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("radix", ["mlp", "auto"])  # auto runs off or full per request; the reference runs off
def test_scores_embeddings_and_logprobs_are_bitwise_the_same_in_any_request(tiny_model_dir, dtype, radix):
    tasks_config = TaskConfig(templates={"rerank": QWEN3_RERANKER, "embed": QWEN3_EMBEDDING})
    path = str(tiny_model_dir("qwen3", "causal_lm"))
    cached = Engine.from_pretrained(path, device="cpu", dtype=dtype, radix=radix, batch_invariant=True,
                                    tasks=tasks_config)
    plain = Engine.from_pretrained(path, device="cpu", dtype=dtype, radix="off", batch_invariant=True,
                                   prefix_cache_bytes=0, tasks=tasks_config)
    got, want = tasks(cached), tasks(plain)
    assert cached.prefix_cache.stats().hit_tokens > 0
    for task, outputs in got.items():
        assert len(set(outputs)) == 1, task  # the same in every request
        assert outputs[0] == want[task][0], task  # and the same as with another mode, without the cache


def test_tiled_reductions_give_the_reductions_of_the_rows():
    """What the mode does with reductions over the last dimension on CUDA (forced here): the same values."""
    from unittest import mock

    from radix_core import invariant_matmul

    x = torch.randn(3, ROW_TILE + 7, 24, generator=torch.Generator().manual_seed(0))
    plain = [x.pow(2).mean(2, keepdim=True), x.sum(dim=-1), torch.logsumexp(x, -1), x.norm(dim=-1),
             torch.linalg.vector_norm(x, 2, -1), x.sum(1)]
    with mock.patch.object(invariant_matmul, "tiled_rows", wraps=invariant_matmul.tiled_rows) as spy, \
            invariant_matmul.RowTiledLinear(tile_reductions=True):
        tiled = [x.pow(2).mean(2, keepdim=True), x.sum(dim=-1), torch.logsumexp(x, -1), x.norm(dim=-1),
                 torch.linalg.vector_norm(x, 2, -1), x.sum(1)]
    assert spy.call_count == 5  # not x.sum(1): only the last dimension is a row's
    for p, t in zip(plain, tiled):
        assert p.shape == t.shape
        torch.testing.assert_close(t, p)


def test_warm_up_runs_the_invariant_backend_and_keeps_the_static_cost_model(tiny_model_dir):
    """`Engine.warm_up` reaches every attention call through the invariant backend; radix auto keeps its static FLOP
    count (the calibration probes time the default backends' calls)."""
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", batch_invariant=True)
    engine.warm_up()
    assert engine.info["batch_invariant"] and engine.info["attention"] == "invariant"
    assert engine.mode_costs.source.startswith("static")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_query_of_a_causal_tile_equals_it_in_a_masked_tile(dtype):
    """A row's last chunk runs in a causal square tile or a masked one, as its sequence's rows in that chunk are
    many or few, which the batch decides: the CPU kernel gives query `i` of a causal (KEY_CHUNK, KEY_CHUNK) tile
    the bits it gives the same query in a masked (QUERY_TILE, KEY_CHUNK) tile seeing keys 0..i."""
    gen = torch.Generator().manual_seed(1)
    kind, kernel = DTYPES[dtype], torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q = torch.randn(3, 4, KEY_CHUNK, 16, generator=gen).to(kind)
    k, v = (torch.randn(3, 2, KEY_CHUNK, 16, generator=gen).to(kind) for _ in range(2))
    out, lse = kernel(q, k, v, 0.0, True, scale=0.25)[:2]
    slots = torch.tensor([0, 1, 31, 32, 63, 64, 100, 127])[torch.randperm(8, generator=gen)]
    picked = torch.cat([slots, slots[:QUERY_TILE - len(slots)].repeat(QUERY_TILE // len(slots))])[:QUERY_TILE]
    hidden = torch.arange(KEY_CHUNK) > picked[:, None]  # (QUERY_TILE, KEY_CHUNK)
    mask = torch.zeros(hidden.shape, dtype=kind).masked_fill_(hidden, float("-inf")).expand(3, 1, -1, -1)
    masked_out, masked_lse = kernel(q[:, :, picked], k, v, 0.0, False, attn_mask=mask, scale=0.25)[:2]
    assert torch.equal(masked_out, out[:, :, picked]) and torch.equal(masked_lse, lse[:, :, picked])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_last_chunk_alone_and_shared_gives_the_same_bits(engines, dtype):
    """Alone, the target's last chunk is one causal tile; behind a companion that shares most of that chunk, its few
    rows of it go to a masked tile."""
    engine = engines(dtype, False)
    rng = np.random.default_rng(4)
    for length, shared in ((120, 100), (250, 140), (200, 190)):
        target = rng.integers(0, VOCAB, length).tolist()
        alone = target_outputs(engine, [target], 0, "off")
        companion = target[:shared] + rng.integers(0, VOCAB, 30).tolist()
        for mode in ("mlp", "full"):
            got = target_outputs(engine, [companion, target], 1, mode)
            assert all(torch.equal(g, w) for g, w in zip(got, alone))
