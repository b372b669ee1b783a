"""The last layer on the rows a batch reads: each job names the final states its finish reads (`Task.reads`), the
forward runs the last layer's work after attention on those rows alone (`BatchPlan.final_rows`), and every answer
equals the forward that finishes every row; the prefix cache stores the final states of the rows it admits."""

import numpy as np
import pytest

from radix_core.engine import Engine
from radix_core.finish import finish_jobs, read_tokens
from radix_core.tasks import TASKS, TaskConfig
from radix_core.templates import QWEN3_EMBEDDING, QWEN3_RERANKER
from radix_core.tokens import TokenSequences

FAMILIES = ["qwen3", "llama", "qwen3_5"]
DOCS = ["the reef is home to many fish and corals", "a reef of stone lies under the sea", "fish swim in the reef",
        "corals grow slowly in warm water"]
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """`engines(family, cache)`: a causal-LM engine of the family with Qwen3's rerank and embedding templates, with
    its prefix cache ("auto") or none."""
    built = {}
    tasks = TaskConfig(templates={"rerank": QWEN3_RERANKER, "embed": QWEN3_EMBEDDING})

    def get(family: str, cache: bool = False) -> Engine:
        if (family, cache) not in built:
            built[family, cache] = Engine.from_pretrained(str(tiny_model_dir(family, "causal_lm")), device="cpu",
                                                          tasks=tasks, prefix_cache_bytes="auto" if cache else 0)
        return built[family, cache]

    return get


def mixed_jobs(engine: Engine, pooling: str = "last") -> list:
    """A rerank, an embedding and a continuation score in one batch: each reads other rows."""
    return [TASKS["rerank"].encode(engine.context, {"query": "what lives on a reef", "documents": DOCS}),
            TASKS["embed"].encode(engine.context, {"texts": DOCS[:3], "instruction": "Find passages",
                                                   "pooling": pooling}),
            TASKS["score"].encode(engine.context, {"context": "the reef is", "continuations": [" home", " warm"]})]


def run(engine: Engine, jobs: list, mode: str, finish_read_rows_only: bool):
    """The jobs' forward in `mode` (finishing only the rows they read, or every row) and their partial results."""
    prepared = engine.prepare(TokenSequences.concat([job.sequences for job in jobs]), mode)
    reads = read_tokens(jobs, prepared.cu_seqlens) if finish_read_rows_only else None
    result = engine.run(prepared, reads=reads)
    with engine.numerics():
        return result, finish_jobs(result, jobs)


def values(partial) -> np.ndarray:
    """A partial result's numbers, whatever its task."""
    for name in ("scores", "embeddings"):
        if hasattr(partial, name):
            return np.asarray(getattr(partial, name), dtype=np.float64)
    return np.concatenate([np.asarray(items, dtype=np.float64).ravel() for items in partial.logprobs])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["off", "mlp", "full"])
def test_a_batch_finishes_the_rows_it_reads_and_answers_as_if_it_finished_all(engines, family, mode):
    engine = engines(family)
    jobs = mixed_jobs(engine)
    result, got = run(engine, jobs, mode, True)
    full, want = run(engine, jobs, mode, False)
    reads = read_tokens(jobs, result.prepared.cu_seqlens)
    np.testing.assert_array_equal(result.plan.final_rows, np.unique(result.row_of_token[reads]))
    assert result.hidden.shape[0] == result.plan.final_rows.shape[0] < result.num_computed
    assert full.plan.final_rows is None and full.hidden.shape[0] == full.num_computed
    for g, w in zip(got, want):
        np.testing.assert_allclose(values(g), values(w), **TOL)
    np.testing.assert_allclose(result.hidden_at(result.row_of_token[reads]).numpy(),
                               full.hidden_at(full.row_of_token[reads]).numpy(), **TOL)


def test_a_state_the_forward_did_not_finish_is_refused(engines):
    engine = engines("qwen3")
    result, _ = run(engine, mixed_jobs(engine), "full", True)
    unfinished = np.setdiff1d(np.arange(result.num_computed), result.plan.final_rows)[:1]
    with pytest.raises(ValueError, match=f"final state of row {unfinished[0]} was not computed"):
        result.hidden_at(unfinished)
    nothing = engine.run(result.prepared, reads=np.empty(0, dtype=np.int64))  # no row read: the last layer on none
    assert nothing.hidden.shape[0] == 0
    with pytest.raises(ValueError, match="final state of row 0 was not computed"):
        nothing.hidden_at(np.array([0]))


def test_a_job_that_reads_every_token_finishes_every_row(engines):
    engine = engines("qwen3")
    jobs = mixed_jobs(engine, pooling="mean")
    result, _ = run(engine, jobs, "full", True)
    assert read_tokens(jobs, result.prepared.cu_seqlens) is None and result.plan.final_rows is None


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cache_stores_the_final_states_of_rows_it_admits_in_a_batch_that_finishes_few(engines, family):
    """The second request admits the text both send while finishing only the texts' last rows and the admitted
    ones; the third reads that text's final state from the cache alone, and equals the cache-off engine's."""
    engine, reference = engines(family, cache=True), engines(family)
    engine.prefix_cache.clear()
    for texts in (DOCS[:2], DOCS[1:3], DOCS[1:2]):
        got = engine.embed(texts, instruction="Find passages").embeddings
        np.testing.assert_allclose(got, reference.embed(texts, instruction="Find passages").embeddings, **TOL)
    assert engine.embed(DOCS[1:2], instruction="Find passages").usage.cached_tokens > 0
