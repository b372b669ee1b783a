"""The forward with the prefix cache gives what recomputing gives (`radix_core.cached_forward`): on every tiny
family, in every mode, for every task that reads cached rows, batch after batch: cache on == cache off == each
sequence alone, within float32 1e-5 (1e-4 for the hybrid Qwen3.5 and Qwen3-Next, whose recurrent state the cache
keeps at segment ends: `tests/test_hybrid_models.py` has its own cases), with sequences that end inside a cached
prefix, duplicates, evictions between batches, scopes mixed in one batch, the Triton kernels; and a budget of 0 is
no cache at all."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_gpu_start import CountingBackend

from radix_core.cached_forward import past_blocks
from radix_core.cached_rows import CachedPrefix, RowShape
from radix_core.engine import Engine
from radix_core.prefix_cache import PrefixCacheStats
from radix_core.tasks import RerankRequest, TaskConfig, task_for
from radix_core.templates import QWEN3_EMBEDDING, QWEN3_RERANKER

FAMILIES = ["qwen3", "qwen2", "llama", "mistral", "qwen3_5", "qwen3_next"]
MODES = ["off", "mlp", "full", "auto"]
TOL = dict(atol=1e-5, rtol=1e-5)
# Qwen3.5 and Qwen3-Next (Gated DeltaNet): the recurrence's chunks start where a cached prefix ends, alone at 0: float32
# reassociation, amplified by the layers to ~2.5e-5 (as a batch against its sequences alone, without the cache)
HYBRID_TOL = dict(atol=1e-4, rtol=1e-4)


def tolerance(family: str) -> dict:
    return HYBRID_TOL if family in ("qwen3_5", "qwen3_next") else TOL
VOCAB = 400  # below every tiny model's vocabulary


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """`engines(family, head, radix, cache_rows=None, attention="auto")`: an engine with a cold prefix cache
    ("auto" budget, or `cache_rows` rows; 0: none), built once per module and cleared for each caller."""
    built = {}

    def get(family: str, head: str, radix: str = "auto", cache_rows: int | None = None,
            attention: str = "auto") -> Engine:
        key = (family, head, radix, cache_rows, attention)
        if key not in built:
            path = str(tiny_model_dir(family, head))
            tasks = TaskConfig(templates={"rerank": QWEN3_RERANKER, "embed": QWEN3_EMBEDDING})
            budget = "auto"
            if cache_rows is not None:
                plain = Engine.from_pretrained(path, device="cpu", prefix_cache_bytes=0)
                budget = cache_rows * RowShape.of(plain.arch, plain.dtype, plain.device).bytes
            built[key] = Engine.from_pretrained(path, device="cpu", radix=radix, attention=attention, tasks=tasks,
                                                prefix_cache_bytes=budget)
        engine = built[key]
        if engine.prefix_cache is not None:
            engine.prefix_cache.clear()
        return engine

    return get


def stream() -> list[list[list[int]]]:
    """Three batches: a prompt with two queries and documents; then hits of the prompt and a query, a sequence
    ending inside the cached prompt, one ending where a cached segment ends, a duplicate of a batch-1 sequence, an
    unrelated one; then all of that again, fully cached."""
    rng = np.random.default_rng(0)
    tokens = lambda n: rng.integers(0, VOCAB, n).tolist()  # noqa: E731
    prompt, q1, q2 = tokens(60), tokens(8), tokens(9)
    docs = [tokens(n) for n in (5, 12, 1, 20, 7, 9)]
    first = [prompt + q1 + docs[0], prompt + q1 + docs[1], prompt + q2 + docs[2]]
    second = [prompt + q1 + docs[3], prompt + q2 + docs[4], prompt[:30], prompt + q1, first[0], tokens(15),
              prompt + q2 + docs[5]]
    return [first, second, second + [first[0], prompt[:30]]]


def states(result) -> list[torch.Tensor]:
    """Per sequence its final-normed hidden states (L_i, hidden), as `Engine.hidden_states` reads them."""
    per_token = result.hidden.index_select(0, result.plan.row_of_token)  # (N, hidden)
    return list(per_token.split(np.diff(result.plan.cu_seqlens).tolist()))


@pytest.fixture(scope="module")
def alone(tiny_model_dir):
    """`alone(family, seq)`: its hidden states run alone, in `off` mode without the cache (memoized)."""
    engines, done = {}, {}

    def get(family: str, seq: list[int]) -> torch.Tensor:
        if family not in engines:
            engines[family] = Engine.from_pretrained(str(tiny_model_dir(family, "base")), device="cpu", radix="off",
                                                     prefix_cache_bytes=0)
        key = (family, tuple(seq))
        if key not in done:
            done[key] = engines[family].hidden_states([seq])[0]
        return done[key]

    return get


def assert_recomputed(result, batch, alone, family: str) -> None:
    """`result` (cache on, whole batch) equals each sequence run alone without the cache."""
    for got, seq in zip(states(result), batch):
        torch.testing.assert_close(got, alone(family, seq), **tolerance(family))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", MODES)
def test_hidden_states_equal_recomputation(engines, alone, family, mode):
    engine = engines(family, "base", mode)
    first, second, third = stream()
    results = [engine.forward(batch) for batch in (first, second, third)]
    for result, batch in zip(results, (first, second, third)):
        assert_recomputed(result, batch, alone, family)
    assert results[0].cached_lengths.tolist() == [0, 0, 0]
    hits = results[1].cached_lengths
    assert hits[0] >= 68 and hits[1] == 60 and hits[5] == 0  # the prompt and query 1; the prompt; nothing
    assert hits[2] == 30 and hits[3] == 68 and results[1].num_computed < results[1].num_tokens  # ends in a segment
    assert (results[2].cached_lengths[-2:] == [len(first[0]), 30]).all()  # the duplicate is all cached by now
    stats = engine.prefix_cache.stats()
    assert stats.hit_tokens == sum(int(r.cached_lengths.sum()) for r in results) > 0


@pytest.mark.parametrize("mode", ["off", "mlp", "full"])
def test_evictions_between_batches_keep_results_exact(engines, alone, mode):
    """A budget of 100 rows for prompts of 40: a stream over four prompts evicts, and hits the hot one."""
    engine = engines("qwen3", "base", mode, cache_rows=100)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, VOCAB, 40).tolist() for _ in range(4)]
    for which in (0, 1, 0, 2, 0, 3, 1, 0):
        batch = [prompts[which] + rng.integers(0, VOCAB, n).tolist() for n in (3, 6, 2)]
        assert_recomputed(engine.forward(batch), batch, alone, "qwen3")
        assert engine.prefix_cache.stats().bytes <= engine.prefix_cache.budget_bytes
    stats = engine.prefix_cache.stats()
    assert stats.evictions >= 3 and stats.hit_tokens >= 2 * 3 * 40  # prompt 0 hit twice before it goes too


@pytest.mark.parametrize("mode", ["off", "mlp", "full"])
def test_a_row_shared_with_another_scope_is_computed_for_both(engines, alone, mode):
    """Scope a has the prompt cached, scope b not: in one batch, compact modes compute the rows both share."""
    engine = engines("llama", "base", mode)
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, VOCAB, 30).tolist()
    tails = [rng.integers(0, VOCAB, n).tolist() for n in (4, 5, 6, 7)]
    engine.run(engine.prepare([prompt + tails[0], prompt + tails[1]]), scopes=["a", "a"])
    batch = [prompt + tails[2], prompt + tails[3], prompt[:10]]
    result = engine.run(engine.prepare(batch), scopes=["a", "b", "a"])
    assert_recomputed(result, batch, alone, "llama")
    assert result.cached_lengths.tolist() == ([30, 0, 10] if mode == "off" else [0, 0, 0])


@pytest.mark.parametrize("mode", ["off", "mlp", "full"])
def test_triton_kernels_read_the_cache(engines, alone, mode):
    engine = engines("qwen3", "base", mode, attention="triton")
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, VOCAB, 24).tolist()
    for sizes in ((3, 5), (2, 7, 1)):
        batch = [prompt + rng.integers(0, VOCAB, n).tolist() for n in sizes] + [prompt[:9]]
        result = engine.forward(batch)
        assert_recomputed(result, batch, alone, "qwen3")
    assert result.cached_lengths.tolist() == [24, 24, 24, 9]


def rerank(engine):
    docs = ["Canberra is the capital.", "Sydney is large.", "Bread is baked.", "中文文本", "Es ist halb acht."]
    return [engine.rerank("capital of australia", docs[:3]), engine.rerank("capital of australia", docs[2:]),
            engine.rerank("capital of australia", docs[:1]), engine.rerank("capital of australia", docs[:1])], \
        lambda r: [(h.index, h.score) for h in r.results]


def embed(pooling):
    def run(engine):
        texts = ["how do vaccines work", "a\n\nb", "x", "Ünïcödé"]
        return [engine.embed(texts[:2], instruction="Find passages", pooling=pooling),
                engine.embed(texts[1:], instruction="Find passages", pooling=pooling),
                engine.embed(texts[:1], instruction="Find passages", pooling=pooling),
                engine.embed(texts[:1], instruction="Find passages", pooling=pooling)], lambda r: r.embeddings
    return run


def classify(engine):
    prefix = "Review: a wonderful film\nSentiment: positive\n\nReview: dull\nSentiment: negative\n\n"
    labels = [" positive", " negative", " not sure at all"]
    return [engine.classify(["great acting", "I fell asleep"], labels, prefix=prefix),
            engine.classify(["great acting", "中文评论"], labels, prefix=prefix)], lambda r: r.probabilities


def score(engine):
    context = "The capital of France is"
    return [engine.score(context, [" Paris", " Berlin, of course.", " Paris"]),
            engine.score(context, [" Paris"]), engine.score(context, [" Paris is big", " Rome"])], \
        lambda r: [(s.logprob, s.num_tokens) for s in r.scores]


def predict(engine):
    inputs = ["a radix tree stores strings", "bread rises", "a radix tree stores strings by prefixes"]
    return [engine.predict(inputs), engine.predict(inputs[:1]), engine.predict(inputs[2:])], \
        lambda r: [[label.score for label in labels] for labels in r.results]


TASKS = {"rerank": ("causal_lm", rerank), "embed-last": ("base", embed("last")), "embed-mean": ("base", embed("mean")),
         "classify": ("causal_lm", classify), "score": ("causal_lm", score), "predict": ("seq_cls", predict)}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("task", list(TASKS))
def test_tasks_equal_recomputation(engines, family, task):
    """Requests one after another share prefixes (the template, query, instruction, few-shot prefix, context, a
    text's start) or repeat a sequence (all of it read from the cache the third time it is seen); each answer
    equals the cache-off engine's, and later requests read the cache."""
    head, run = TASKS[task]
    engine, reference = engines(family, head), engines(family, head, cache_rows=0)
    got, values = run(engine)
    want, _ = run(reference)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(values(g), dtype=np.float64), np.asarray(values(w), dtype=np.float64),
                                   **tolerance(family))
    assert engine.prefix_cache.stats().hit_tokens > 0
    assert got[-1].usage.computed_tokens < want[-1].usage.computed_tokens  # the cache saved rows


def test_documents_that_open_alike_are_cached_once_a_second_request_sends_them(engines):
    """A rerank cut into parts run as two batches, as the served path runs a Cohere-size request, whose documents
    open alike: only its prompt and query enter the cache (the second batch reads them), not the openings its
    own documents share; the same documents in the next request are cached, and read by the one after; every
    score equals the cache-off engine's."""
    engine, reference = engines("qwen3", "causal_lm", "full"), engines("qwen3", "causal_lm", "full", cache_rows=0)
    opening = "The Great Barrier Reef is the largest coral reef system in the world. "
    docs = [opening + "It lies off Queensland.", opening + "It is visible from space.", "Bread is baked.",
            opening + "Corals spawn.", "Canberra is the capital.", opening + "Tourism is big there."]
    task = task_for(RerankRequest(query="reef facts", documents=docs))
    inserted = []
    for _ in range(3):
        job = task.encode(engine.context, RerankRequest(query="reef facts", documents=docs))
        partials = engine.run_jobs([job.select(0, 3)]) + engine.run_jobs([job.select(3, 6)])
        got, want = task.merge(job, partials), reference.rerank("reef facts", docs)
        assert [h.index for h in got.results] == [h.index for h in want.results]
        np.testing.assert_allclose([h.score for h in got.results], [h.score for h in want.results], **TOL)
        inserted.append(engine.prefix_cache.stats().inserted_tokens)
    first = job.select(0, 3).sequences.tolists()
    common = next(p for p in range(len(first[0])) if len({tuple(ids[:p + 1]) for ids in first}) > 1)
    assert common < job.shared_len + 10 and inserted[0] == common  # the first request: its prompt, query, and
    # what the first batch's documents all start with (a space); not the opening two of them share
    assert inserted[1] > inserted[0] + len(docs) and inserted[2] == inserted[1]  # its documents, seen again
    assert got.usage.cached_tokens == job.num_tokens and got.usage.computed_tokens == 0  # the third reads them all


def test_items_one_by_one_equal_the_batch_with_the_cache_warm(engines):
    engine = engines("mistral", "base", "full")
    texts = ["how do vaccines work", "a\n\nb", "x", "Ünïcödé"]
    together = engine.embed(texts, instruction="Find passages", pooling="mean").embeddings
    alone = [engine.embed([t], instruction="Find passages", pooling="mean").embeddings for t in texts]
    np.testing.assert_allclose(np.concatenate(alone), together, atol=1e-5)
    assert engine.prefix_cache.stats().hit_tokens > 0


def test_budget_zero_is_no_cache(engines):
    engine = engines("qwen2", "base", "full", cache_rows=0)
    assert engine.prefix_cache is None and engine.info["prefix_cache_bytes"] == 0
    batch = stream()[0]
    runs = [engine.forward(batch) for _ in range(2)]
    assert [r.num_computed for r in runs] == [runs[0].prepared.index.num_compact] * 2
    assert runs[1].plan.past is None and runs[1].cached_lengths.tolist() == [0, 0, 0]
    assert engines("qwen2", "base", "full").info["prefix_cache_bytes"] == 256 << 20  # "auto" on the CPU


def test_a_bad_budget_names_the_setting(tiny_model_dir):
    with pytest.raises(ValueError, match="prefix_cache_bytes must be 'auto', 0"):
        Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", prefix_cache_bytes=-5)


@pytest.mark.parametrize("radix", ["off", "mlp"])
def test_warm_up_runs_the_prefix_calls_cache_hits_make_in_every_mode(tiny_model_dir, radix):
    """Past blocks are prefix calls: with the cache, an `off` or `mlp` engine compiles them before it serves, in
    every variant (> 256 blocks, a block past every query tile), and starts with a cold cache."""
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3", "base")), device="cpu", radix=radix)
    engine.backend = backend = CountingBackend()
    engine.warm_up()
    assert {variant for variant in backend.variants if variant[0] == "prefix"} == {
        ("prefix", many, long) for many in (False, True) for long in (False, True)}
    assert engine.prefix_cache.stats() == PrefixCacheStats(engine.prefix_cache.budget_bytes)


def test_past_blocks_give_each_query_the_cached_ranges_of_its_sequence():
    """One block per distinct cached range, its queries ascending, and each query in exactly the blocks of its
    sequence's ranges; a sequence with ranges but no query (all of it cached) makes no block."""
    past = CachedPrefix([(None, None, 6)], pair_cu=np.array([0, 2, 2, 3, 5, 6]),
                        pair_start=np.array([0, 4, 0, 0, 4, 5]), pair_end=np.array([4, 6, 3, 4, 5, 6]))
    owner = np.array([0, 0, 1, 2, 3, 3, 3])  # (Q,) sorted; sequence 4 has ranges but no query
    blocks = past_blocks(owner, past, torch.device("cpu"))
    cu, rows = blocks.cu_seqlens_q.tolist(), blocks.q_rows.tolist()
    reads = {(int(a), int(b)): rows[cu[j]:cu[j + 1]]
             for j, (a, b) in enumerate(zip(blocks.key_start.tolist(), blocks.key_end.tolist()))}
    assert reads == {(0, 3): [3], (0, 4): [0, 1, 4, 5, 6], (4, 5): [4, 5, 6], (4, 6): [0, 1]}
    assert past_blocks(np.array([1, 1]), past, torch.device("cpu")) is None  # sequence 1 reads nothing
