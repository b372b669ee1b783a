"""Cascade attention in `full` mode: causal blocks over the trie's segments plus shared-prefix blocks, merged
with log-sum-exp, equal attention over each row's whole path; in every backend that runs on the CPU.

Duplicates and prefixes of other sequences add no compact row, so they add no block either: no kernel ever sees
an empty query block (flash-attn 2's grouped-query path for `max_seqlen_q == 1` fails on one).
"""

import numpy as np
import pytest
import torch
from transformers import AutoModel

from radix_core.attention import (
    FlashAttention,
    TorchAttention,
    TritonAttention,
    _math_attention_with_lse,
    merge_prefix,
)
from radix_core.batch import BatchLimits, prepare_batch
from radix_core.cascade import compact_parents
from radix_core.engine import Engine
from radix_core.forward import plan_compact

BATCHES = {
    "duplicate one-token sequences": [[7], [7]],
    "duplicates and prefixes": [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2], [1, 2, 3, 4, 5], [9], [1, 2, 3]],
    "no sharing": [[1, 2], [3, 4, 5]],
    "nested groups, interleaved": [[1, 2, 3, 10, 11, 30], [40, 41], [1, 2, 3, 20], [1, 2, 3, 10, 11, 31, 32],
                                   [40, 42, 43], [1, 2, 3]],
}
LIMITS = BatchLimits(vocab_size=100, max_seq_len=512, radix_threshold=0.9)


def random_batch(seed: int) -> list[list[int]]:
    """Prefixes cut from two stems, random tails, and copies of earlier sequences."""
    rng = np.random.default_rng(seed)
    stems = [rng.integers(0, 50, 30).tolist() for _ in range(2)]
    sequences = [stems[rng.integers(2)][: rng.integers(1, 31)] + rng.integers(0, 50, rng.integers(0, 4)).tolist()
                 for _ in range(8)]
    return sequences + [list(sequences[i]) for i in rng.integers(0, 8, 3)]


def path_attention(q, k, v, parent, scale):
    """Row by row: softmax over the keys of its path (itself and its ancestors), grouped-query heads."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for row in range(q.shape[0]):
        path = [row]
        while parent[path[-1]] >= 0:
            path.append(int(parent[path[-1]]))
        keys = k[path].repeat_interleave(group, dim=1)  # (Lk, Hq, D)
        probs = (torch.einsum("hd,khd->hk", q[row], keys) * scale).softmax(-1)  # (Hq, Lk)
        out[row] = torch.einsum("hk,khd->hd", probs, v[path].repeat_interleave(group, dim=1))
    return out


def backend(name: str):
    return TorchAttention() if name == "torch" else TritonAttention(torch.device("cpu"))


@pytest.mark.parametrize("sequences", [*BATCHES.values(), *map(random_batch, range(4))])
@pytest.mark.parametrize("name", ["torch", "triton"])
def test_cascade_equals_attention_over_each_path(sequences, name):
    prepared = prepare_batch(sequences, "full", LIMITS)
    meta = plan_compact(prepared, torch.device("cpu")).attention
    rows = prepared.index.num_compact
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(rows, 4, 16, generator=gen)  # (N', Hq, D)
    k, v = torch.randn(2, rows, 2, 16, generator=gen)  # (N', Hkv, D) each, grouped-query heads
    expected = path_attention(q, k, v, compact_parents(prepared.index), 16**-0.5)
    torch.testing.assert_close(backend(name)(q, k, v, meta, 16**-0.5), expected, atol=2e-5, rtol=2e-5)


def test_no_kernel_sees_an_empty_block():
    for sequences in [*BATCHES.values(), *map(random_batch, range(4))]:
        meta = plan_compact(prepare_batch(sequences, "full", LIMITS), torch.device("cpu")).attention
        assert (torch.diff(meta.causal.cu_seqlens) > 0).all()
        assert meta.causal.cu_seqlens.dtype == torch.int32  # what varlen kernels take
        if meta.prefix is not None:
            assert (torch.diff(meta.prefix.cu_seqlens_q) > 0).all()
            assert (meta.prefix.key_end > meta.prefix.key_start).all()


def test_shared_prefix_keys_are_read_once():
    """32 sequences behind one 8-token prefix: one prefix block, its keys the prefix's rows in place."""
    sequences = [list(range(8)) + [20 + i, 60 + i] for i in range(32)]
    meta = plan_compact(prepare_batch(sequences, "full", LIMITS), torch.device("cpu")).attention
    assert meta.prefix.key_start.tolist() == [0] and meta.prefix.key_end.tolist() == [8]
    assert meta.prefix.q_rows.tolist() == list(range(8, 8 + 64))
    assert meta.causal.max_seqlen == 8 and len(meta.padded.causal) == 1  # the prefix and 32 suffixes: one call


def test_math_fallback_equals_the_cpu_kernel():
    """The matmul path other devices use (`attention='torch'` on CUDA) against the CPU kernel, in small chunks."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 4, 37, 8, generator=gen), *torch.randn(2, 2, 2, 37, 8, generator=gen)
    for causal in (True, False):
        want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=0.3)
        got = _math_attention_with_lse(q, k, v, causal, 0.3, chunk=2 * 4 * 37 * 5)  # 5 queries per step
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_merge_is_stable_when_one_part_dominates():
    """Parts whose log-sum-exps differ by far more than float32's exp range still merge to the right weights."""
    out, prefix_out = torch.ones(2, 1, 1), torch.full((1, 1, 1), 3.0)
    lse, prefix_lse = torch.tensor([[0.0], [500.0]]), torch.tensor([[500.0]])
    merged = merge_prefix(out, lse, [(prefix_out, prefix_lse, torch.tensor([0]))])
    assert merged.flatten().tolist() == [3.0, 1.0]  # row 0: the prefix part dominates; row 1 has no prefix part


@pytest.mark.parametrize("attention", ["torch", "triton"])
@pytest.mark.parametrize("name", ["duplicate one-token sequences", "duplicates and prefixes",
                                  "nested groups, interleaved"])
def test_engine_with_gqa_equals_transformers(tiny_model_dir, attention, name):
    """`[[7], [7]]` on Qwen3 (4 query heads, 2 kv heads), prefixes and nested groups, in `full`."""
    model_dir = tiny_model_dir("qwen3", "base")
    engine = Engine.from_pretrained(str(model_dir), device="cpu", attention=attention, radix="full")
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    for got, seq in zip(engine.hidden_states(BATCHES[name]), BATCHES[name]):
        with torch.no_grad():
            want = model(torch.tensor([seq])).last_hidden_state[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def flash_varlen_stand_in(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                          causal, return_lse):
    """flash-attn 4's `flash_attn_varlen_func` as its docstring specifies it (bottom-right causal, grouped-query
    heads, `(out (total_q, Hq, D), lse (Hq, total_q))`), in torch: flash-attn itself needs a GPU."""
    assert return_lse and cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    out, lse = torch.empty_like(q), torch.empty(q.shape[1], q.shape[0])
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for j in range(len(cu_q) - 1):
        qs, ks, vs = (t[a:b].transpose(0, 1)[None] for t, a, b in ((q, cu_q[j], cu_q[j + 1]),
                                                                    (k, cu_k[j], cu_k[j + 1]),
                                                                    (v, cu_k[j], cu_k[j + 1])))
        assert qs.shape[2] <= max_seqlen_q and ks.shape[2] <= max_seqlen_k
        assert not causal or qs.shape[2] == ks.shape[2]  # the engine only asks for square causal blocks
        o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qs, ks, vs, 0.0, causal,
                                                                          scale=softmax_scale)
        out[cu_q[j]:cu_q[j + 1]], lse[:, cu_q[j]:cu_q[j + 1]] = o[0].transpose(0, 1), l[0]
    return out, lse


@pytest.mark.parametrize("sequences", [BATCHES["nested groups, interleaved"], random_batch(5)])
def test_flash_backend_hands_flash_attn_what_its_contract_takes(sequences):
    """The flash backend's glue (prefix queries and shared segments back to back, lse transposed, merge) on the
    CPU, with flash-attn's documented varlen contract standing in for the GPU kernel."""
    prepared = prepare_batch(sequences, "full", LIMITS)
    meta = plan_compact(prepared, torch.device("cpu")).attention
    flash = FlashAttention.__new__(FlashAttention)
    flash._varlen = flash_varlen_stand_in
    gen = torch.Generator().manual_seed(2)
    rows = prepared.index.num_compact
    q, k, v = torch.randn(rows, 4, 16, generator=gen), *torch.randn(2, rows, 2, 16, generator=gen)
    expected = path_attention(q, k, v, compact_parents(prepared.index), 0.25)
    torch.testing.assert_close(flash(q, k, v, meta, 0.25), expected, atol=2e-5, rtol=2e-5)
