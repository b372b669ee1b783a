"""Long documents by chunks, in the library (`radix_core.chunking`, rerank and embed with `long_documents="chunk"`):
spans map back to the text (hypothesis over random Unicode), chunk boundaries and overlap, each chunk scored as its
text alone, a one-chunk document scored as today, pooling, the task config's defaults, split and merge, and the
limits, each error naming its field."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radix_core import Engine
from radix_core.chunking import lay_windows
from radix_core.errors import RequestError
from radix_core.tasks import TASKS, EmbedRequest, RerankRequest, TaskConfig
from radixserve import cli

QUERY = "what is a radix tree"
WORDS = "a radix tree stores strings by their shared prefixes and every node holds one edge label".split()
TOL = 1e-5


def words(count: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, count))


LONG = [words(300, 1), words(120, 2) + " 😀 héllo wörld " + words(90, 3), "a short one"]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> str:
    return str(tiny_model_dir("qwen3", "causal_lm"))


@pytest.fixture(scope="module")
def engine(model_dir) -> Engine:
    return Engine.from_pretrained(model_dir, device="cpu")


def chunks_of(engine: Engine, task: str, request, config: TaskConfig | None = None):
    """The chunks and the sequences of an encoded request, under `config` (default: the engine's)."""
    context = engine.context if config is None else replace(engine.context, config=config)
    job = TASKS[task].encode(context, request)
    return job.chunks, job.sequences


def own_offsets(engine: Engine, text: str) -> list[tuple[int, int]]:
    (encoding,) = engine.prompts.encodings([text], add_special_tokens=False, trust=False)
    return encoding.offsets


def longest_run(offsets: list[tuple[int, int]]) -> int:
    """Most tokens in a row that share characters with their neighbours (no boundary between them: the bytes of
    one character split over tokens, and the space byte-level BPE joins to the next one)."""
    before = np.maximum.accumulate([e for _, e in offsets]) if offsets else np.array([], dtype=int)
    free = [0] + [i for i in range(1, len(offsets)) if offsets[i][0] >= before[i - 1]] + [len(offsets)]
    return int(np.diff(free).max(initial=1))


def scores_by_index(result) -> np.ndarray:
    out = np.zeros(len(result.results))
    for hit in result.results:
        out[hit.index] = hit.score
    return out


# --- cutting ---------------------------------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", categories=("L", "M", "N", "P", "S", "Zs", "Cc")), min_size=1,
               max_size=300) | st.text(st.sampled_from(list("ab é😀👍🏽中文\n\t  ́")), min_size=1, max_size=200)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, size=st.integers(4, 24), overlap_share=st.floats(0, 0.9), left=st.booleans(), tight=st.booleans())
def test_spans_map_back_to_the_text(engine, text, size, overlap_share, left, tight):
    """Every chunk is text[start:end] of its document; the chunks cover it from its start to its end without a
    gap, never cut a token (so never a character byte-level BPE splits over tokens), hold at most `size` of its
    tokens unless a run of tokens without a boundary forces more, and their sequences fit the limit even when it
    leaves no slack (`tight`: chunks that re-tokenize longer are laid again with smaller windows)."""
    overlap = int(overlap_share * size)
    request = RerankRequest(QUERY, [text], long_documents="chunk", chunk_tokens=size, chunk_overlap_tokens=overlap,
                            truncation_direction="left" if left else "right", max_chunks_per_document=10_000)
    one_token = TASKS["rerank"].encode(engine.context, RerankRequest(QUERY, ["x"])).sequences.lengths[0]
    offsets = own_offsets(engine, text)
    room = max(size, 2 * longest_run(offsets))  # a run without a boundary is one window: it must fit
    limit = int(one_token) - 1 + room if tight else None  # about the prompt and `room` tokens
    chunks, sequences = chunks_of(engine, "rerank", request, TaskConfig(max_items=10_000, max_tokens=limit))
    spans = chunks.spans.tolist()
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (start, end), (next_start, _) in zip(spans, spans[1:]):
        assert start < next_start <= end  # in order, overlapping or touching: no gap
    for (start, end), tokens in zip(spans, chunks.tokens.tolist()):
        assert not any(s < cut < e for s, e in offsets for cut in (start, end))  # no token is cut
        assert tokens == sum(start <= s and e <= end for s, e in offsets) <= size + 2 * (longest_run(offsets) - 1)
    if limit is not None:
        assert sequences.lengths.max() <= limit


def test_windows_hold_size_tokens_and_share_overlap(engine):
    """ASCII words: every token boundary is free, so windows are exactly `size` tokens (the last fewer) and
    neighbours share exactly `overlap`; laid from the end (left), the first window is the short one."""
    text = LONG[0]
    n = len(own_offsets(engine, text))
    for direction in ("right", "left"):
        request = RerankRequest(QUERY, [text], long_documents="chunk", chunk_tokens=40, chunk_overlap_tokens=8,
                                truncation_direction=direction, max_chunks_per_document=100)
        chunks, _ = chunks_of(engine, "rerank", request)
        tokens = chunks.tokens.tolist()
        assert len(tokens) == -(-(n - 8) // 32)
        full = tokens[:-1] if direction == "right" else tokens[1:]
        assert set(full) == {40} and sum(tokens) - 8 * (len(tokens) - 1) == n
        offsets = own_offsets(engine, text)
        for (start, end), (next_start, _) in zip(chunks.spans.tolist(), chunks.spans.tolist()[1:]):
            assert sum(next_start <= s and e <= end for s, e in offsets) == 8


def test_lay_windows_keeps_progress_when_no_cut_fits():
    cuts = np.array([0, 5, 6, 7, 20])  # a run of 13 tokens without a boundary
    assert lay_windows(cuts, 4, 2) == [(0, 1), (1, 3), (2, 4)]
    assert lay_windows(np.array([0]), 4, 0) == [(0, 0)]


def test_max_document_tokens_keeps_its_side_before_chunking(engine):
    text = LONG[0]
    for direction in ("right", "left"):
        request = RerankRequest(QUERY, [text], long_documents="chunk", chunk_tokens=30, chunk_overlap_tokens=0,
                                max_document_tokens=70, truncation_direction=direction)
        chunks, _ = chunks_of(engine, "rerank", request)
        spans = chunks.spans.tolist()
        assert sum(chunks.tokens.tolist()) == 70 and len(spans) == 3
        assert (spans[0][0] == 0) if direction == "right" else (spans[-1][1] == len(text))


# --- scores ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pool", ["max", "mean", "first"])
def test_each_chunk_scores_as_its_text_alone_and_pools(engine, pool):
    request = RerankRequest(QUERY, LONG, long_documents="chunk", chunk_tokens=48, chunk_overlap_tokens=6, pool=pool)
    chunks, _ = chunks_of(engine, "rerank", request)
    alone = scores_by_index(engine.rerank(QUERY, chunks.texts(LONG), long_documents="truncate"))  # (C,)
    result = engine.answer(request)
    pooled = scores_by_index(result)
    owners = chunks.owners
    for d in range(len(LONG)):
        mine = alone[owners == d]
        expected = {"max": mine.max(), "mean": mine.mean(), "first": mine[0]}[pool]
        np.testing.assert_allclose(pooled[d], expected, atol=TOL)
        hit = next(h for h in result.results if h.index == d)
        assert hit.best_span == tuple(chunks.spans[owners == d][int(np.argmax(mine))].tolist())
    assert len(chunks.owners) > len(LONG) + 4


def test_one_chunk_documents_score_as_today(engine):
    docs = ["a radix tree", "tries share prefixes", words(60, 4)]
    today = engine.rerank(QUERY, docs)
    chunked = engine.rerank(QUERY, docs, long_documents="chunk", chunk_tokens=512)
    np.testing.assert_allclose(scores_by_index(chunked), scores_by_index(today), atol=TOL)
    assert {h.index: h.best_span for h in chunked.results} == {i: (0, len(d)) for i, d in enumerate(docs)}
    assert all(h.best_span is None for h in today.results)
    assert chunked.usage == today.usage


def test_chunks_share_the_prompt_and_query_once(engine):
    request = dict(query=QUERY, documents=LONG, long_documents="chunk", chunk_tokens=48)
    chunks, sequences = chunks_of(engine, "rerank", RerankRequest(**request))
    usage = engine.rerank(**request).usage
    shared = len(TASKS["rerank"].encode(engine.context, RerankRequest(**request)).shared_ids)
    assert usage.input_tokens == sequences.num_tokens
    assert usage.computed_tokens <= usage.input_tokens - (len(chunks.owners) - 1) * shared


def test_split_parts_merge_to_the_whole(engine):
    task = TASKS["rerank"]
    request = RerankRequest(QUERY, LONG, long_documents="chunk", chunk_tokens=40, top_n=2, return_documents=True)
    job = task.encode(engine.context, request)
    parts = task.split(job, 150)
    merged = task.merge(job, [p for part in parts for p in engine.run_jobs([part])])
    whole = engine.answer(request)
    assert len(parts) > 3 and all(part.chunks is None for part in parts)
    assert [(h.index, h.document, h.best_span) for h in merged.results] == \
           [(h.index, h.document, h.best_span) for h in whole.results]
    np.testing.assert_allclose([h.score for h in merged.results], [h.score for h in whole.results], atol=TOL)


def test_task_config_gives_the_defaults(model_dir):
    chunking = Engine.from_pretrained(model_dir, device="cpu", tasks=TaskConfig(
        long_documents="chunk", chunk_tokens=40, chunk_overlap_tokens=5, pool="first"))
    by_default = chunking.rerank(QUERY, LONG)
    assert all(h.best_span is not None for h in by_default.results)
    asked = chunking.rerank(QUERY, LONG, long_documents="chunk", chunk_tokens=40, chunk_overlap_tokens=5,
                            pool="first")
    assert [h.best_span for h in by_default.results] == [h.best_span for h in asked.results]
    assert all(h.best_span is None for h in chunking.rerank(QUERY, LONG, long_documents="truncate").results)
    for bad in ({"long_documents": "split"}, {"pool": "median"}, {"chunks": "all"}, {"chunk_tokens": 0},
                {"chunk_overlap_tokens": 512}, {"max_chunks_per_document": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TaskConfig(**bad)


# --- embed ----------------------------------------------------------------------------------------------------------

def test_embed_chunks_each_and_pooled(engine):
    fields = dict(long_documents="chunk", chunk_tokens=48, chunk_overlap_tokens=6)
    chunks, _ = chunks_of(engine, "embed", EmbedRequest(LONG, **fields))
    each = engine.embed(LONG, chunks="each", **fields)
    alone = engine.embed(chunks.texts(LONG)).embeddings  # (C, d)
    np.testing.assert_allclose(each.embeddings, alone, atol=TOL)
    assert each.indices.tolist() == chunks.owners.tolist() and each.spans.tolist() == chunks.spans.tolist()
    pooled = engine.embed(LONG, chunks="pooled", **fields).embeddings  # (D, d)
    for d in range(len(LONG)):
        weights = chunks.tokens[chunks.owners == d][:, None]
        mean = (alone[chunks.owners == d] * weights).sum(0) / weights.sum()
        np.testing.assert_allclose(pooled[d], mean / np.linalg.norm(mean), atol=TOL)
    raw = engine.embed(LONG, chunks="pooled", normalize=False, **fields).embeddings
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    short = ["a radix tree", "tries share prefixes"]
    np.testing.assert_allclose(engine.embed(short, long_documents="chunk").embeddings, engine.embed(short).embeddings,
                               atol=TOL)


# --- limits ---------------------------------------------------------------------------------------------------------

def refusal(engine: Engine, task: str, request, config: TaskConfig | None = None) -> RequestError:
    with pytest.raises(RequestError) as caught:
        chunks_of(engine, task, request, config)
    return caught.value


def test_too_many_chunks_for_a_document_names_the_field(engine):
    fields = dict(long_documents="chunk", chunk_tokens=40, chunk_overlap_tokens=0, max_chunks_per_document=3)
    err = refusal(engine, "rerank", RerankRequest(QUERY, LONG, truncate=False, **fields))
    assert (err.field, err.limit) == ("max_chunks_per_document", 3) and "document 0 needs" in str(err)
    huge = refusal(engine, "embed", EmbedRequest(["word " * 200_000], truncate=False, **fields))  # refused unread
    assert huge.field == "max_chunks_per_document" and "has at least" in str(huge)
    right, _ = chunks_of(engine, "rerank", RerankRequest(QUERY, [LONG[0]], **fields))  # truncate: the first 3
    left, _ = chunks_of(engine, "rerank", RerankRequest(QUERY, [LONG[0]], truncation_direction="left", **fields))
    assert len(right.owners) == len(left.owners) == 3
    assert right.spans[0][0] == 0 < right.spans[-1][1] < left.spans[0][0] < left.spans[-1][1] == len(LONG[0])


def test_all_chunks_count_against_max_items(engine):
    err = refusal(engine, "rerank", RerankRequest(QUERY, LONG, long_documents="chunk", chunk_tokens=16),
                  TaskConfig(max_items=12))
    assert (err.field, err.limit) == ("max_chunks_per_document", 12) and "max_items" in str(err)


@pytest.mark.parametrize("fields, field", [
    ({"long_documents": "split"}, "long_documents"),
    ({"long_documents": "chunk", "pool": "median"}, "pool"),
    ({"long_documents": "chunk", "chunk_tokens": 0}, "chunk_tokens"),
    ({"long_documents": "chunk", "chunk_overlap_tokens": -1}, "chunk_overlap_tokens"),
    ({"long_documents": "chunk", "chunk_tokens": 32, "chunk_overlap_tokens": 32}, "chunk_overlap_tokens"),
    ({"long_documents": "chunk", "max_chunks_per_document": 0}, "max_chunks_per_document"),
])
def test_bad_fields_are_named(engine, fields, field):
    assert refusal(engine, "rerank", {"query": QUERY, "documents": LONG, **fields}).field == field


def test_chunks_fit_a_small_per_item_limit(engine):
    """A chunk holds at most what fits the limit beside the prompt, whatever `chunk_tokens` asks."""
    config = TaskConfig(max_tokens=120)
    chunks, sequences = chunks_of(engine, "rerank", RerankRequest(QUERY, LONG, long_documents="chunk"), config)
    assert sequences.lengths.max() <= 120 and chunks.spans[chunks.owners == 0][-1][1] == len(LONG[0])
    err = refusal(engine, "rerank", RerankRequest("long query " * 80, LONG, long_documents="chunk"), config)
    assert err.limit == 120 and "shorten" in str(err)
    one_token = TASKS["rerank"].encode(engine.context, RerankRequest(QUERY, ["x"])).sequences.lengths[0]
    emoji = refusal(engine, "rerank", RerankRequest(QUERY, ["x 𝔘𝔘"], long_documents="chunk", chunk_tokens=2),
                    TaskConfig(max_tokens=int(one_token) + 1))  # room for 2 tokens; 𝔘 is 4 byte-level tokens
    assert (emoji.field, emoji.index) == ("documents", 0) and str(emoji).startswith("document 0 cannot be cut")


def test_an_embed_batch_job_keeps_one_row_per_text(tmp_path, capsys):
    source = tmp_path / "texts.jsonl"
    source.write_text('"a text"\n')
    args = ["embed", "--address", "127.0.0.1:1", "--input", str(source), "--output", str(tmp_path / "out.npy")]
    assert cli.main([*args, "--chunks", "each"]) == 2
    assert "one row per text" in capsys.readouterr().err
