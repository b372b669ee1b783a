"""`compact_attention` equals its torch reference on real radix indices: odd shapes, GQA, empty blocks.

Under the interpreter the default tiles are 16 x 16, so sequences of up to 40 tokens span several query and key
tiles and exercise both the unmasked and the causal key stages; `test_tile_shapes` adds unequal and GPU tiles.
"""

import numpy as np
import pytest
import torch

from radix_core.index import build_radix_index, flatten_sequences
from radix_core.kernels import AttentionTiles, capability, compact_attention, compact_attention_reference

TOLERANCES = {  # probabilities are rounded to the input dtype before P @ V, as in flash-attention
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}


def index_tensors(index) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(scatter, cu_seqlens_q, cu_seqlens_k, max_seqlen_q) as the engine holds them: int32 on the device."""
    as_int32 = lambda a: torch.from_numpy(a.astype(np.int32))  # noqa: E731
    return as_int32(index.scatter), as_int32(index.cu_seqlens_q), as_int32(index.cu_seqlens_k), index.max_seqlen_q


def qkv(num_rows: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_rows, heads, head_dim, generator=gen).to(dtype)  # (N', Hq, D)
    k = torch.randn(num_rows, kv_heads, head_dim, generator=gen).to(dtype)  # (N', Hkv, D)
    v = torch.randn(num_rows, kv_heads, head_dim, generator=gen).to(dtype)  # (N', Hkv, D)
    return q, k, v


def check(index, heads=4, kv_heads=2, head_dim=64, dtype=torch.float32, **kwargs):
    q, k, v = qkv(index.num_compact, heads, kv_heads, head_dim, dtype)
    args = (q, k, v, *index_tensors(index))
    out = compact_attention(*args, **kwargs)
    expected = compact_attention_reference(*args, scale=kwargs.get("scale"))
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCES[dtype])


@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_grouped_query_heads(radix_batch, group):
    check(radix_batch(seed=group), heads=group, kv_heads=1)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes_and_head_dims(radix_batch, dtype, head_dim):
    check(radix_batch(seed=head_dim, num_sequences=4), heads=2, kv_heads=1, head_dim=head_dim, dtype=dtype)


@pytest.mark.parametrize("tiles", [AttentionTiles(32, 16), AttentionTiles(16, 32), AttentionTiles(128, 64)])
def test_tile_shapes(radix_batch, tiles):
    check(radix_batch(seed=7), heads=2, kv_heads=1, tiles=tiles)


@pytest.mark.parametrize("head_dim", [16, 80])
def test_head_dims_padded_to_a_tile(radix_batch, head_dim):
    check(radix_batch(seed=3), heads=2, kv_heads=2, head_dim=head_dim)


def test_custom_scale(radix_batch):
    check(radix_batch(seed=5, num_sequences=3), heads=2, kv_heads=1, scale=0.3)


def test_duplicates_add_no_queries():
    """Exact duplicates and prefixes of earlier sequences have empty blocks; their programs exit at once."""
    sequences = [list(range(33)), list(range(33)), list(range(20)), list(range(33)) + [1, 2, 3]]
    index = build_radix_index(*flatten_sequences(sequences))
    assert index.block_len.tolist() == [33, 0, 0, 3]
    check(index, heads=4, kv_heads=1)


def test_one_token():
    check(build_radix_index([5], [0, 1]), heads=8, kv_heads=2)


def test_views_of_a_fused_projection(radix_batch):
    """q, k, v as column slices of one fused QKV output: only the head dim needs to be contiguous."""
    index = radix_batch(seed=11, num_sequences=3)
    qkv_rows = torch.randn(index.num_compact, (4 + 2 * 2) * 32)  # (N', (Hq + 2 Hkv) D)
    q, k, v = qkv_rows.split([4 * 32, 2 * 32, 2 * 32], dim=1)  # (N', Hq D), (N', Hkv D), (N', Hkv D)
    q, k, v = q.view(-1, 4, 32), k.view(-1, 2, 32), v.view(-1, 2, 32)  # (N', H, D) strided views
    args = (q, k, v, *index_tensors(index))
    torch.testing.assert_close(compact_attention(*args), compact_attention_reference(*args), atol=2e-5, rtol=2e-5)


def valid_args():
    index = build_radix_index([1, 2, 3, 1, 2, 4], [0, 3, 6])
    return dict(zip(("q", "k", "v"), qkv(index.num_compact, 4, 2, 16, torch.float32))) | dict(
        zip(("scatter", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q"), index_tensors(index))
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {"q": a["q"].double()}, "q must be one of float32, float16, bfloat16, got float64"),
        (lambda a: {"k": a["k"].half(), "v": a["v"].half()}, "q, k, v must share one dtype"),
        (lambda a: {"q": a["q"][:, :3]}, r"query heads \(3\) must be a multiple of kv heads \(2\)"),
        (lambda a: {"k": a["k"][:-1], "v": a["v"][:-1]}, r"k and v must be \(N', Hkv, D\) with q's N' and D"),
        (lambda a: {"q": a["q"][0]}, r"q must be \(compact rows, heads, head_dim\)"),
        (lambda a: {"q": a["q"].transpose(1, 2)}, "q must have a contiguous head dim"),
        (lambda a: {"scatter": a["scatter"].float()}, "scatter must be one of int32, int64, got float32"),
        (lambda a: {"cu_seqlens_k": a["cu_seqlens_k"][:-1]}, "cu_seqlens_q and cu_seqlens_k must both be"),
        (lambda a: {"max_seqlen_q": 0}, "max_seqlen_q must be a positive int"),
    ],
)
def test_bad_arguments_say_what_is_wrong(change, message):
    args = valid_args()
    with pytest.raises(ValueError, match=message):
        compact_attention(**(args | change(args)))


def test_reference_rejects_blocks_longer_than_max_seqlen_q():
    args = valid_args() | {"max_seqlen_q": 1}
    with pytest.raises(ValueError, match="sequence 0 adds 3 queries but max_seqlen_q is 1"):
        compact_attention_reference(**args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a CPU-only machine gives")
def test_cpu_without_interpreter_says_what_to_do(monkeypatch):
    monkeypatch.setattr(capability, "INTERPRETED", False)
    with pytest.raises(ValueError, match="compiled Triton kernels need a CUDA device; on the CPU set TRITON_INTERPRET"):
        compact_attention(**valid_args())


def test_tiles_must_suit_tl_dot():
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16"):
        AttentionTiles(block_m=32, block_n=24)
