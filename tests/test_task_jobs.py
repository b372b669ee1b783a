"""Tasks as jobs: encoded apart from the model (picklable), run together in one forward batch across tasks, each
finished from its own slice with the same result and error as the `Engine` method alone."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from radix_core.engine import Engine
from radix_core.tasks import TASKS, BatchView, RerankRequest, TaskContext, task_for, task_of
from radix_core.tokens import TokenSequences

QUERY = "what is a radix tree"
DOCS = ["A radix tree is a compressed trie.", " Bread is baked in ovens.", "\nTries share prefixes."]
REQUESTS = [
    ("rerank", {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True}),
    ("embed", {"texts": ["how do tries work", "Ünïcödé"], "instruction": "Find passages", "dimensions": 16}),
    ("score", {"context": "The capital of France is", "continuations": [" Paris", " Berlin, of course."]}),
    ("classify", {"inputs": ["great acting", "I fell asleep"], "labels": [" positive", " not sure at all"],
                  "prefix": "Review: a fine film\nSentiment: positive\n\n", "template": "Review: {input}\nSentiment:"}),
    ("rerank", {"query": QUERY, "documents": DOCS[:2], "raw_scores": True}),  # shares the first request's prefix
]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    cache = {}

    def get(radix: str = "full") -> Engine:
        if radix not in cache:
            cache[radix] = Engine.from_pretrained(str(tiny_model_dir("qwen3", "causal_lm")), device="cpu",
                                                  radix=radix, tasks={"max_items": 4},
                                                  prefix_cache_bytes=0)  # usage: sharing within one batch only
        return cache[radix]

    return get


def alone(engine: Engine, task: str, request: dict):
    return getattr(engine, task)(**request)


def encode(engine: Engine, task: str, request):
    return TASKS[task].encode(engine.context, request)


def assert_same(got, want) -> None:
    """Two results of one task agree within 1e-5 (scores, vectors, probabilities) and exactly otherwise."""
    if hasattr(want, "results"):  # rerank
        assert [(h.index, h.document) for h in got.results] == [(h.index, h.document) for h in want.results]
        np.testing.assert_allclose([h.score for h in got.results], [h.score for h in want.results], atol=1e-5)
    elif hasattr(want, "embeddings"):
        np.testing.assert_allclose(got.embeddings, want.embeddings, atol=1e-5)
    elif hasattr(want, "probabilities"):
        assert got.labels == want.labels
        np.testing.assert_allclose(got.probabilities, want.probabilities, atol=1e-5)
    else:
        assert [s.num_tokens for s in got.scores] == [s.num_tokens for s in want.scores]
        np.testing.assert_allclose([s.logprob for s in got.scores], [s.logprob for s in want.scores], atol=1e-5)


@pytest.mark.parametrize("radix", ["off", "mlp", "full"])
def test_mixed_batch_equals_each_request_alone(engine, radix):
    e = engine(radix)
    jobs = [encode(e, task, request) for task, request in REQUESTS]
    prepared = e.prepare(TokenSequences.concat([job.sequences for job in jobs]))
    partials = e.run_jobs(jobs, pickle.loads(pickle.dumps(prepared)))  # prepared in another process
    for (task, request), job, partial in zip(REQUESTS, jobs, partials):
        want = alone(e, task, request)
        got = TASKS[task].merge(job, [partial])
        assert_same(got, want)
        assert got.usage.input_tokens == job.num_tokens == want.usage.input_tokens
        assert got.usage.computed_tokens <= want.usage.computed_tokens
    computed = [r.usage.computed_tokens for r in partials]
    num_rows = prepared.num_tokens if radix == "off" else prepared.index.num_compact
    assert sum(computed) == num_rows
    if radix != "off":  # the last request's query and template were computed by the first
        assert computed[-1] < partials[-1].usage.input_tokens - 50


def test_views_split_usage_and_rows(engine):
    e = engine()
    result = e.forward([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [7]])  # rows: 4, then 1, 1, 1
    views = [BatchView(result, 0, 1), BatchView(result, 1, 2), BatchView(result, 3, 1)]
    assert [(v.usage.input_tokens, v.usage.computed_tokens) for v in views] == [(4, 4), (7, 2), (1, 1)]
    assert sum(v.usage.computed_tokens for v in views) == result.num_computed
    np.testing.assert_array_equal(views[1].lengths, [4, 3])
    np.testing.assert_array_equal(views[1].rows(np.array([0, 1, 1]), np.array([-1, 0, 2])),
                                  result.plan.row_of_token[[7, 8, 10]].numpy())
    assert result.row_of_token.tolist() == result.plan.row_of_token.tolist()  # host rows equal the device's
    states = e.hidden_states([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [7]])
    np.testing.assert_allclose(views[1].last_hidden().numpy(), np.stack([states[1][-1], states[2][-1]]), atol=1e-6)
    np.testing.assert_allclose(views[1].mean_hidden().numpy(), np.stack([states[1].mean(0), states[2].mean(0)]),
                               atol=1e-6)


@pytest.mark.parametrize("task, request_", [
    ("rerank", {"query": "", "documents": ["d"]}),
    ("rerank", {"query": "q", "documents": ["d"] * 5}),
    ("embed", {"texts": ["t"], "dimensions": 65}),
    ("embed", {"texts": ["t"], "pooling": "cls"}),
    ("classify", {"inputs": ["x"], "labels": [" a", " a"]}),
    ("classify", {"inputs": ["x"], "labels": [" a"], "template": "no field"}),
    ("score", {"context": "c", "continuations": [" a", ""]}),
    ("score", {"context": "c", "continuations": ["a passage"]}),
])
def test_encode_raises_what_the_method_raises(engine, task, request_):
    e = engine()
    with pytest.raises(ValueError) as method_error:
        alone(e, task, request_)
    with pytest.raises(ValueError) as encode_error:
        encode(e, task, request_)
    assert str(encode_error.value) == str(method_error.value)


def test_context_and_jobs_survive_pickling(engine):
    e = engine()
    context = pickle.loads(pickle.dumps(e.context))
    assert isinstance(context, TaskContext) and context.config == e.context.config
    assert context.prompts.encode("hello\n<|im_end|>x") == e.prompts.encode("hello\n<|im_end|>x")
    for task, request in REQUESTS:
        job = TASKS[task].encode(context, request)
        assert task_for(job) is TASKS[task]
        again = pickle.loads(pickle.dumps(job))
        assert again.sequences.tolists() == job.sequences.tolists()
        (partial,) = e.run_jobs([again])
        assert_same(TASKS[task].merge(job, [partial]), alone(e, task, request))
    assert set(TASKS) == {"rerank", "embed", "classify", "score", "predict"}


def test_bad_requests_say_what_is_wrong(engine):
    e = engine()
    with pytest.raises(ValueError, match="unknown task 'summarize': choose one of rerank, embed, classify, score"):
        task_of("summarize")
    with pytest.raises(ValueError, match=r"unknown rerank request keys \['docs', 'k'\]: allowed are \['query', "):
        encode(e, "rerank", {"query": "q", "docs": ["d"], "k": 1})
    with pytest.raises(ValueError, match=r"the score request lacks \['continuations'\]: it needs \['context', "):
        encode(e, "score", {"context": "c"})
    with pytest.raises(ValueError, match="the embed request must be a mapping of its arguments, got list"):
        encode(e, "embed", ["t"])
    job = encode(e, "embed", {"texts": ["a", "b"]})
    with pytest.raises(ValueError, match=r"the prepared batch \(1 sequences, 3 tokens\) is not these jobs'"):
        e.run_jobs([job], e.prepare([[1, 2, 3]]))


def test_rerank_with_a_multi_label_score_head_is_refused_before_any_batch(tiny_model_dir):
    from dataclasses import replace

    e = Engine.from_pretrained(str(tiny_model_dir("qwen3", "seq_cls")), device="cpu")
    assert len(TASKS["rerank"].encode(e.context, {"query": "q", "documents": ["d"]}).sequences) == 1
    with pytest.raises(ValueError, match="has a 3-label score head; reranking needs a single relevance logit"):
        TASKS["rerank"].encode(replace(e.context, labels=("a", "b", "c")), {"query": "q", "documents": ["d"]})


def test_a_typed_request_and_a_mapping_of_its_fields_are_one_request(engine):
    """The request type is the contract: `encode` takes it or a mapping of its fields, the registry finds the task by
    the request's type and by the job's, and the `Engine` method takes the same fields."""
    e = engine()
    typed = RerankRequest(QUERY, DOCS, top_n=2)
    job = TASKS["rerank"].encode(e.context, typed)
    assert job.sequences.tolists() == encode(e, "rerank", {"query": QUERY, "documents": DOCS, "top_n": 2}
                                             ).sequences.tolists()
    assert task_for(typed) is task_for(job) is TASKS["rerank"]
    assert [h.index for h in e.answer(typed).results] == [h.index for h in e.rerank(QUERY, DOCS, top_n=2).results]
    with pytest.raises(TypeError, match="dict is no task's request or job"):
        task_for({"query": QUERY})


def test_the_tasks_package_has_no_import_circle():
    """Dependencies run one way: task modules -> base, request, usage, view, context; registry -> task modules;
    the engine side (`radix_core.finish`) -> registry. Every import counts, TYPE_CHECKING ones too."""
    import ast
    from pathlib import Path

    root = Path(__file__).parents[1] / "radix_core" / "tasks"
    imports = {}
    for path in root.glob("*.py"):
        found = {node.module for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)}
        imports[path.stem] = {m.rsplit(".", 1)[1] for m in found if m and m.startswith("radix_core.tasks.")}

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(m == target or (m not in seen and reaches(m, target, seen | {m})) for m in imports.get(start, ()))

    assert [m for m in imports if m != "__init__" and reaches(m, m, set())] == []
