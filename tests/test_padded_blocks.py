"""The CPU attention's padded groups (`radix_core.padded_blocks`): a bounded number of dense calls per layer, and
the same attention as one kernel call per block, within 1e-5, on every golden batch and random tries, in every
mode that has blocks (`off` and `mlp`: sequences; `full`: segments and prefix blocks), with cache hits' past blocks.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cascade_attention import random_batch
from test_engine_golden import BATCHES as GOLDEN

from radix_core.attention import AttentionMetadata, TorchAttention, _attention_with_lse
from radix_core.batch import BatchLimits, prepare_batch
from radix_core.forward import causal_blocks, plan_compact, plan_ragged, prefix_blocks
from radix_core.padded_blocks import (
    ALIGN,
    BUCKETS_PER_OCTAVE,
    EXACT_KEYS,
    PREFIX_CHUNK,
    SOLO_BLOCK,
    SOLO_CHUNK,
    SOLO_SHORT_BLOCK,
    bucket_lengths,
    padded_cascade,
    padded_prefix,
)


@given(st.lists(st.integers(1, 100_000), min_size=1, max_size=50))
def test_buckets_are_aligned_cover_each_length_and_pad_at_most_an_eighth(lengths):
    n = np.array(lengths)
    b = bucket_lengths(n)
    assert (b >= n).all() and (b % ALIGN == 0).all()
    assert (b < np.maximum(n * (1 + 1 / BUCKETS_PER_OCTAVE), n + ALIGN)).all()
    assert (bucket_lengths(b) == b).all()  # a bucket is its own bucket


def test_a_thousand_blocks_make_one_call_per_bucket():
    """1,000 causal blocks of up to 2,048 rows: calls = buckets present (8 up to 128, then 8 per doubling)."""
    lengths = np.random.default_rng(0).integers(1, 2049, 1000)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    groups = padded_cascade(bounds, None, torch.device("cpu")).causal
    assert len(groups) == len(np.unique(bucket_lengths(lengths))) <= BUCKETS_PER_OCTAVE * 5
    assert sum(g.count for g in groups) == 1000


@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=30), st.randoms())
@settings(max_examples=50, deadline=None)
def test_prefix_chunks_send_every_query_to_its_row_once(blocks, rand):
    """Each group reads its queries from the rows it writes to; over the groups, the real (unpadded) queries are
    exactly `q_rows`, each once; every key a group reads lies in its block's range, and padded keys are masked.
    Blocks of up to 300 queries and keys: chunked ones and solo ones, keys padded and exact."""
    q_len = np.array([b[0] for b in blocks])
    k_len = np.array([b[1] for b in blocks])
    cu = np.concatenate([[0], np.cumsum(q_len)])
    q_rows = np.array(rand.sample(range(10 * int(cu[-1])), int(cu[-1])))
    key_start = np.array([rand.randrange(0, 500) for _ in blocks])
    groups = padded_prefix(q_rows, cu, key_start, key_start + k_len, torch.device("cpu"))
    real = []
    for g in groups:
        read = g.gather(torch.arange(10 * int(cu[-1]))[:, None, None], g.q_rows, g.q_len).reshape(-1)
        assert read.tolist() == torch.arange(10 * int(cu[-1]))[g.out_rows].tolist()
        real += read[~g.padding].tolist() if g.padding is not None else read.tolist()
        keys = g.gather(torch.arange(1000)[:, None, None], g.k_rows, g.k_len)[:, 0, :, 0]  # (G, Lk)
        keys = keys if g.key_mask is None else keys.masked_fill(~g.key_mask[:, 0, 0], -1)
        assert all(np.isin(row[row >= 0], key_start[:, None] + np.arange(300)).all() for row in keys.numpy())
    assert sorted(real) == sorted(q_rows.tolist())


def test_causal_padding_goes_to_the_scratch_row_and_needs_no_key_mask():
    """Padded causal queries write to the row past the end; every real row is written exactly once. No group has a
    key mask: a real query sees no key after its own (the exactness tests below run them unmasked)."""
    bounds = np.array([0, 3, 20, 21, 60])
    groups = padded_cascade(bounds, None, torch.device("cpu")).causal
    written = torch.cat([g.out_rows for g in groups])
    assert sorted(written[written < 60].tolist()) == list(range(60)) and set(written[written >= 60].tolist()) == {60}
    assert [g.k_len for g in groups] == [16, 32, 48] and all(g.key_mask is None for g in groups)


def per_block(q, k, v, meta, scale, past=None):
    """The attention as one kernel call per block, merged as the backend merges: the reference."""
    backend = TorchAttention()
    backend.causal_blocks = lambda q, k, v, blocks, scale: _each_causal(q, k, v, blocks, scale)
    backend.prefix_blocks = lambda q, k, v, blocks, scale: _each_prefix(q, k, v, blocks, scale)
    return backend(q, k, v, meta, scale, past)


def _assert_equal_to_one_call_per_block(meta, rows: int, past_rows: int, seed: int) -> None:
    """The backend over random q/k/v of `rows` rows (4 heads of 16, 2 K/V heads) and `past_rows` cached K/V rows that
    `meta.past` reads equals `per_block`, within 1e-5."""
    gen = torch.Generator().manual_seed(seed)
    past_k, past_v = torch.randn(2, past_rows, 2, 16, generator=gen)  # (C, Hkv, D) each
    q = torch.randn(rows, 4, 16, generator=gen)
    k, v = torch.randn(2, rows, 2, 16, generator=gen)
    torch.testing.assert_close(TorchAttention()(q, k, v, meta, 0.25, (past_k, past_v)),
                               per_block(q, k, v, meta, 0.25, (past_k, past_v)), atol=1e-5, rtol=1e-5)


def _each_causal(q, k, v, blocks, scale):
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2])
    bounds = blocks.cu_seqlens.tolist()
    for a, b in zip(bounds, bounds[1:]):
        o, l = _attention_with_lse(*(t[a:b].transpose(0, 1)[None] for t in (q, k, v)), True, scale)
        out[a:b], lse[a:b] = o[0].transpose(0, 1), l[0].transpose(0, 1)
    return out, lse


def _each_prefix(q, k, v, blocks, scale):
    queries = q.index_select(0, blocks.q_rows)
    out, lse = torch.empty_like(queries), torch.empty(queries.shape[:2])
    cu = blocks.cu_seqlens_q.tolist()
    for j, (ks, ke) in enumerate(zip(blocks.key_start.tolist(), blocks.key_end.tolist())):
        o, l = _attention_with_lse(queries[cu[j]:cu[j + 1]].transpose(0, 1)[None], k[ks:ke].transpose(0, 1)[None],
                                   v[ks:ke].transpose(0, 1)[None], False, scale)
        out[cu[j]:cu[j + 1]], lse[cu[j]:cu[j + 1]] = o[0].transpose(0, 1), l[0].transpose(0, 1)
    return [(out, lse, blocks.q_rows)]


def _plan(sequences, mode):
    prepared = prepare_batch(sequences, mode, BatchLimits(vocab_size=400, max_seq_len=2048, radix_threshold=0.9))
    if mode == "off":
        return plan_ragged(prepared.input_ids, prepared.cu_seqlens, torch.device("cpu")).attention, prepared.num_tokens
    return plan_compact(prepared, torch.device("cpu")).attention, prepared.index.num_compact


@pytest.mark.parametrize("mode", ["off", "mlp", "full"])
@pytest.mark.parametrize("sequences", [*GOLDEN.values(), *map(random_batch, range(3))],
                         ids=[*GOLDEN, *(f"random-{i}" for i in range(3))])
def test_padded_groups_equal_one_call_per_block(sequences, mode):
    meta, rows = _plan(sequences, mode)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(rows, 4, 16, generator=gen)  # (R, Hq, D)
    k, v = torch.randn(2, rows, 2, 16, generator=gen)  # (R, Hkv, D) each
    torch.testing.assert_close(TorchAttention()(q, k, v, meta, 0.25), per_block(q, k, v, meta, 0.25),
                               atol=1e-5, rtol=1e-5)


def test_past_blocks_from_the_cache_equal_one_call_per_block():
    """Past blocks (keys in the cached K/V) of assorted lengths, some padded, merged with the batch's own."""
    meta, rows = _plan(GOLDEN["prefix-groups-of-depths"], "full")
    meta.past = prefix_blocks(np.arange(rows), np.array([0, 5, 40, rows]), np.array([0, 7, 100]),
                              np.array([7, 130, 299]), torch.device("cpu"))
    _assert_equal_to_one_call_per_block(meta, rows, 300, seed=1)


def test_a_comb_of_short_segments_is_absorbed_up_to_the_limit_and_the_rest_stays_prefix():
    """Sequence i shares the first 2i tokens of a stem, then branches: every leaf has up to 19 ancestors of 2 keys.
    Each causal block takes in its nearest ancestors' keys up to `ABSORB_LIMIT`; farther ones stay prefix blocks."""
    stem = list(range(100, 140))
    sequences = [stem[:2 * i] + [300 + i, 301] for i in range(1, 20)]
    meta, rows = _plan(sequences, "full")
    plan = meta.padded
    assert plan.prefix and plan.causal
    read = sum(g.count * g.k_len for g in plan.causal)
    assert read > rows  # ancestors' keys are read by their descendants' causal blocks
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(rows, 4, 16, generator=gen)
    k, v = torch.randn(2, rows, 2, 16, generator=gen)
    torch.testing.assert_close(TorchAttention()(q, k, v, meta, 0.25), per_block(q, k, v, meta, 0.25),
                               atol=1e-5, rtol=1e-5)


def test_a_large_prefix_block_on_consecutive_rows_is_one_call_reading_its_queries_in_place():
    """A prompt shared by 40 sequences of 30-60 tokens (more than `SOLO_SHORT_BLOCK` rows below it) and a cached
    template read by all of them: each is one dense call on a slice of the rows (no query copied, no chunks), merged
    in place, equal to one call per block; the short prefix blocks around it are still chunked."""
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 400, 40).tolist()
    sequences = [prompt + rng.integers(0, 400, int(rng.integers(30, 61))).tolist() for _ in range(40)]
    meta, rows = _plan(sequences, "full")
    meta.past = prefix_blocks(np.arange(rows), np.array([0, 3, rows]), np.array([0, 0]), np.array([2, 50]),
                              torch.device("cpu"))
    whole = [g for g in meta.padded.prefix + meta.past.padded if g.q_len >= SOLO_SHORT_BLOCK]
    assert len(whole) == 2 and all(g.count == 1 and isinstance(g.q_rows, slice) and g.out_rows == g.q_rows
                                   for g in whole)
    assert [g.q_len for g in meta.past.padded if g not in whole] == [3]  # the 3-query block: a chunk
    _assert_equal_to_one_call_per_block(meta, rows, 50, seed=4)


def test_a_prefix_block_larger_than_a_call_is_cut_into_consecutive_calls_read_in_place():
    """A template read by 3 * `SOLO_CHUNK` + 5 consecutive query rows: one call per `SOLO_CHUNK` queries, each a
    slice of the rows written in place, together every query once, with the same keys; equal to one call."""
    queries, keys = 3 * SOLO_CHUNK + 5, 50
    groups = padded_prefix(np.arange(7, 7 + queries), np.array([0, queries]), np.array([2]), np.array([2 + keys]),
                           torch.device("cpu"))
    assert [(g.q_rows.start, g.q_rows.stop) for g in groups] == [
        (7 + i * SOLO_CHUNK, 7 + min((i + 1) * SOLO_CHUNK, queries)) for i in range(4)]
    assert all(g.count == 1 and g.out_rows == g.q_rows and g.padding is None and g.k_len == 64 for g in groups)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(7 + queries, 4, 16, generator=gen)
    k, v = torch.randn(2, 60, 2, 16, generator=gen)
    whole_q = q[7:].unsqueeze(0).transpose(1, 2)  # (1, Hq, queries, D)
    whole_k, whole_v = (t[2:2 + keys].unsqueeze(0).transpose(1, 2) for t in (k, v))
    out, lse = _attention_with_lse(whole_q, whole_k, whole_v, False, 0.25)  # (1, Hq, queries, D), (1, Hq, queries)
    parts = TorchAttention()._prefix_parts(q, k, v, groups, 0.25)
    torch.testing.assert_close(torch.cat([o for o, _, _ in parts]), out[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([s for _, s, _ in parts]), lse[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_a_cached_prompt_read_by_scattered_rows_is_one_unpadded_call_with_its_keys_in_place():
    """A cached few-shot prompt of 1,037 keys read by 199 query rows that are not consecutive (the rows below it among
    others): one call, its queries gathered once and none padded, its keys the prompt's rows in place at their exact
    length, no mask (more than `EXACT_KEYS`); equal to one call per block. Padded chunks of 64 queries made four
    calls, each copying the 1,152 keys of the prompt's bucket."""
    queries, keys = 199, 1037
    q_rows = np.sort(np.random.default_rng(6).choice(600, queries, replace=False))
    (group,) = padded_prefix(q_rows, np.array([0, queries]), np.array([3]), np.array([3 + keys]), torch.device("cpu"))
    assert queries >= SOLO_BLOCK and keys > EXACT_KEYS
    assert (group.count, group.q_len, group.k_len, group.padding, group.key_mask) == (1, queries, keys, None, None)
    assert group.k_rows == slice(3, 3 + keys) and group.q_rows.tolist() == q_rows.tolist()
    assert group.out_rows is group.q_rows
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(600, 4, 16, generator=gen)
    past_k, past_v = torch.randn(2, 1100, 2, 16, generator=gen)
    blocks = prefix_blocks(q_rows, np.array([0, queries]), np.array([3]), np.array([3 + keys]), torch.device("cpu"))
    ((out, lse, rows),) = TorchAttention().prefix_blocks(q, past_k, past_v, blocks, 0.25)
    ((ref_out, ref_lse, ref_rows),) = _each_prefix(q, past_k, past_v, blocks, 0.25)
    assert rows.tolist() == ref_rows.tolist()
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_a_block_over_few_keys_runs_on_its_own_only_from_solo_short_block_queries():
    """Past blocks of `SOLO_BLOCK` and `SOLO_SHORT_BLOCK` - 1 queries over a few keys are chunked with the short
    blocks (a word shared by a few hundred documents: ~145 such blocks a layer on a 1,000-document rerank, each a call
    of its own before); one of `SOLO_SHORT_BLOCK` queries over as few keys, and one of `SOLO_BLOCK` over more than
    `EXACT_KEYS`, run on their own. Merged with the batch's causal blocks, equal to one call per block."""
    sizes = [(SOLO_BLOCK, 32), (SOLO_SHORT_BLOCK - 1, 48), (SOLO_SHORT_BLOCK, 20), (SOLO_BLOCK, EXACT_KEYS + 1)]
    rows = sum(q for q, _ in sizes)
    cu = np.concatenate([[0], np.cumsum([q for q, _ in sizes])])
    key_start = np.array([0, 40, 100, 130])
    key_end = key_start + np.array([k for _, k in sizes])
    cpu = torch.device("cpu")
    meta = AttentionMetadata(causal_blocks(np.append(np.arange(0, rows, 50), rows), cpu),
                             past=prefix_blocks(np.random.default_rng(8).permutation(rows), cu, key_start, key_end,
                                                cpu))
    groups = meta.past.padded
    assert [(g.count, g.q_len, g.k_len) for g in groups if g.q_len > PREFIX_CHUNK] == [
        (1, SOLO_SHORT_BLOCK, 32), (1, SOLO_BLOCK, EXACT_KEYS + 1)]  # 20 keys padded to their bucket
    chunks = [(g.k_len, g.count) for g in groups if g.q_len <= PREFIX_CHUNK]
    assert chunks == [(32, SOLO_BLOCK // PREFIX_CHUNK), (48, -(-(SOLO_SHORT_BLOCK - 1) // PREFIX_CHUNK))]
    _assert_equal_to_one_call_per_block(meta, rows, 300, seed=9)
