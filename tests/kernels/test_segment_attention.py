"""`segment_attention` equals its torch reference, output and log-sum-exp, in both kinds of call.

Self calls (`causal=True`) run over segments of odd lengths, in place; prefix calls (`causal=False`) read their
queries from scattered rows through `q_rows`, against key ranges of different lengths. Under the interpreter the
default tiles are 16 x 16, so blocks of up to 37 rows span several query and key tiles and exercise both key
stages (whole tiles unmasked, then the causal diagonal or the end of the key range); `test_tile_shapes` adds
unequal and GPU tiles. `test_cascade_merge_is_attention_over_the_whole_path` checks what the engine relies on:
a self call and a prefix call merged by log-sum-exp are attention over each row's whole path.
"""

from itertools import accumulate

import pytest
import torch
import torch.nn.functional as F

from radix_core.kernels import AttentionTiles, capability, segment_attention, segment_attention_reference

TOLERANCES = {  # probabilities are rounded to the input dtype before P @ V, as in flash-attention
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}
LSE_TOLERANCE = dict(atol=1e-4, rtol=1e-5)  # scores are exact float32 products of the inputs in every dtype
NUM_ROWS = 71
SEGMENTS = [0, 37, 38, 38, 54, 71]  # 37 rows (three query tiles), 1, none, 16 (one whole tile), 17 (one past)
PREFIX_BLOCKS = [  # (query rows, first key row, key row end)
    ([70, 3, 41, 41, 12, 0, 69, 55, 8, 19, 27, 33, 60, 61, 62, 2, 5, 44], 0, 37),  # 18 queries, 37 keys
    ([], 37, 54),  # no queries
    ([50, 51, 52], 38, 54),  # one whole key tile
    (list(range(54, 71)), 0, 54),  # 17 queries, 54 keys
    ([7], 37, 38),  # one key
]


def self_call(segments: list[int], index_dtype: torch.dtype = torch.int32) -> dict:
    """A self call's arguments: each segment `segments[j]:segments[j+1]` attends causally to itself, in place."""
    cu = torch.tensor(segments, dtype=index_dtype)  # (J+1,)
    return dict(cu_seqlens_q=cu, key_start=cu[:-1], key_end=cu[1:], max_seqlen_q=int(cu.diff().max()), causal=True)


def prefix_call(blocks: list[tuple[list[int], int, int]], index_dtype: torch.dtype = torch.int32) -> dict:
    """A prefix call's arguments: blocks of (query rows, first key row, key row end), unmasked."""
    lengths = [len(rows) for rows, _, _ in blocks]
    as_index = lambda values: torch.tensor(values, dtype=index_dtype)  # noqa: E731
    return dict(q_rows=as_index([row for rows, _, _ in blocks for row in rows]),  # (P,)
                cu_seqlens_q=as_index([0, *accumulate(lengths)]), key_start=as_index([s for _, s, _ in blocks]),
                key_end=as_index([e for _, _, e in blocks]), max_seqlen_q=max(lengths), causal=False)


CALLS = {"self": self_call(SEGMENTS), "prefix": prefix_call(PREFIX_BLOCKS)}


def qkv(num_rows: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_rows, heads, head_dim, generator=gen).to(dtype)  # (Nq, Hq, D)
    k = torch.randn(num_rows, kv_heads, head_dim, generator=gen).to(dtype)  # (Nk, Hkv, D)
    v = torch.randn(num_rows, kv_heads, head_dim, generator=gen).to(dtype)  # (Nk, Hkv, D)
    return q, k, v


def heads_first(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1)  # (L, H, D) -> (H, L, D)


def check(call: dict, heads=4, kv_heads=2, head_dim=64, dtype=torch.float32, num_rows=NUM_ROWS, **kwargs):
    q, k, v = qkv(num_rows, heads, kv_heads, head_dim, dtype)
    out, lse = segment_attention(q, k, v, **call, **kwargs)
    want_out, want_lse = segment_attention_reference(q, k, v, **call, scale=kwargs.get("scale"))
    num_queries = num_rows if call.get("q_rows") is None else call["q_rows"].shape[0]
    assert out.dtype == dtype and out.shape == (num_queries, heads, head_dim)
    assert lse.dtype == torch.float32 and lse.shape == (num_queries, heads)
    torch.testing.assert_close(out.float(), want_out.float(), **TOLERANCES[dtype])
    torch.testing.assert_close(lse, want_lse, **LSE_TOLERANCE)


@pytest.mark.parametrize("kind", CALLS)
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_grouped_query_heads(kind, group):
    check(CALLS[kind], heads=group, kv_heads=1)


@pytest.mark.parametrize("kind", CALLS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes_and_head_dims(kind, dtype, head_dim):
    check(CALLS[kind], heads=2, kv_heads=1, head_dim=head_dim, dtype=dtype)


@pytest.mark.parametrize("kind", CALLS)
@pytest.mark.parametrize("head_dim", [16, 80])
def test_head_dims_padded_to_a_tile(kind, head_dim):
    check(CALLS[kind], heads=2, kv_heads=2, head_dim=head_dim)


@pytest.mark.parametrize("kind", CALLS)
@pytest.mark.parametrize("tiles", [AttentionTiles(32, 16), AttentionTiles(16, 32), AttentionTiles(128, 64)])
def test_tile_shapes(kind, tiles):
    check(CALLS[kind], heads=2, kv_heads=1, tiles=tiles)


def test_int64_indices():
    check(self_call(SEGMENTS, torch.int64), heads=2, kv_heads=1)
    check(prefix_call(PREFIX_BLOCKS, torch.int64), heads=2, kv_heads=1)


@pytest.mark.parametrize("kind", CALLS)
def test_custom_scale(kind):
    check(CALLS[kind], heads=2, kv_heads=1, scale=0.3)


def test_one_token():
    check(self_call([0, 1]), heads=8, kv_heads=2, num_rows=1)


def test_calls_whose_blocks_have_no_queries():
    """Every block empty: no query, an empty output; its programs exit at once."""
    q, k, v = qkv(NUM_ROWS, 4, 2, 16, torch.float32)
    for call in (prefix_call([([], 0, 5), ([], 5, 9)]), self_call([0, 0, 0])):
        out, lse = segment_attention(q[:0] if call["causal"] else q, k, v, **call)
        assert out.shape == (0, 4, 16) and lse.shape == (0, 4)


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log2")  # the interpreter's numpy log2(0)
def test_block_without_keys_adds_nothing_to_a_merge():
    """Queries over an empty key range get output 0 and lse -inf, the weight 0 of a log-sum-exp merge."""
    q, k, v = qkv(NUM_ROWS, 4, 2, 16, torch.float32)
    call = prefix_call([([4, 9], 6, 6), ([1], 0, 20)])
    for out, lse in (segment_attention(q, k, v, **call), segment_attention_reference(q, k, v, **call)):
        assert torch.equal(out[:2], torch.zeros(2, 4, 16)) and torch.equal(lse[:2], torch.full((2, 4), -torch.inf))
        assert lse[2].isfinite().all()


def test_views_of_a_fused_projection():
    """q, k, v as column slices of one fused QKV output: only the head dim needs to be contiguous."""
    qkv_rows = torch.randn(NUM_ROWS, (4 + 2 * 2) * 32)  # (N, (Hq + 2 Hkv) D)
    q, k, v = qkv_rows.split([4 * 32, 2 * 32, 2 * 32], dim=1)  # (N, Hq D), (N, Hkv D), (N, Hkv D)
    q, k, v = q.view(-1, 4, 32), k.view(-1, 2, 32), v.view(-1, 2, 32)  # (N, H, D) strided views
    for call in CALLS.values():
        for got, want in zip(segment_attention(q, k, v, **call), segment_attention_reference(q, k, v, **call)):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kind", CALLS)
def test_reference_is_torch_attention_with_its_logsumexp(kind):
    """The reference's (out, lse) per block equal torch's fused CPU attention, whose logsumexp is natural-log."""
    q, k, v = qkv(NUM_ROWS, 4, 2, 16, torch.float32)
    call = CALLS[kind]
    out, lse = segment_attention_reference(q, k, v, **call)
    rows = torch.arange(NUM_ROWS) if call.get("q_rows") is None else call["q_rows"].long()  # (P,)
    bounds = zip(call["cu_seqlens_q"].tolist(), call["cu_seqlens_q"][1:].tolist(), call["key_start"].tolist(),
                 call["key_end"].tolist())
    for q_lo, q_hi, k_lo, k_hi in (b for b in bounds if b[0] < b[1]):
        query = heads_first(q[rows[q_lo:q_hi]])[None]  # (1, Hq, Lq, D)
        keys, values = (heads_first(t[k_lo:k_hi].repeat_interleave(2, dim=1))[None] for t in (k, v))  # (1, Hq, Lk, D)
        want_out, want_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, keys, values, is_causal=call["causal"])  # (1, Hq, Lq, D), (1, Hq, Lq)
        torch.testing.assert_close(out[q_lo:q_hi], want_out[0].transpose(0, 1), atol=2e-6, rtol=2e-6)
        torch.testing.assert_close(lse[q_lo:q_hi], want_lse[0].transpose(0, 1), atol=2e-6, rtol=2e-6)


TREE = {"A": ((0, 13), []), "B": ((13, 30), ["A"]), "C": ((30, 47), ["A", "B"]), "D": ((47, 51), ["A"])}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cascade_merge_is_attention_over_the_whole_path(dtype):
    """Segments A -> B -> C and A -> D: each segment's self call merged by log-sum-exp with its prefix calls (one
    block per ancestor segment, over all rows below it) equals attention over [ancestors' rows + own rows] with a
    bottom-right causal mask, computed by torch."""
    q, k, v = qkv(51, 4, 2, 32, dtype)
    own = {name: list(range(*rows)) for name, (rows, _) in TREE.items()}
    self_out, self_lse = segment_attention(q, k, v, **self_call([0, 13, 30, 47, 51]))  # (51, Hq, D), (51, Hq)
    shared = {"A": own["B"] + own["C"] + own["D"], "B": own["C"]}  # rows below each shared segment
    call = prefix_call([(rows, *TREE[name][0]) for name, rows in shared.items()])
    prefix_out, prefix_lse = segment_attention(q, k, v, **call)  # (P, Hq, D), (P, Hq)

    parts_out, parts_lse = [self_out.float()], [self_lse]
    for lo, hi in zip(call["cu_seqlens_q"].tolist(), call["cu_seqlens_q"][1:].tolist()):
        rows = call["q_rows"][lo:hi].long()
        parts_out.append(torch.zeros(51, 4, 32).index_copy(0, rows, prefix_out[lo:hi].float()))  # (51, Hq, D)
        parts_lse.append(torch.full((51, 4), -torch.inf).index_copy(0, rows, prefix_lse[lo:hi]))  # (51, Hq)
    lse = torch.stack(parts_lse)  # (parts, 51, Hq)
    weights = torch.exp(lse - torch.logsumexp(lse, dim=0))  # (parts, 51, Hq): exp(lse_i - logaddexp(all lse))
    merged = (weights[..., None] * torch.stack(parts_out)).sum(dim=0)  # (51, Hq, D)

    for name, (_, ancestors) in TREE.items():
        path = sum((own[a] for a in ancestors), []) + own[name]  # (Lk,) rows of the whole path
        lq, lk = len(own[name]), len(path)
        query, key, value = (heads_first(t.float()) for t in (q[own[name]], k[path], v[path]))  # (H, L, D)
        want = F.scaled_dot_product_attention(
            query, key, value,
            attn_mask=torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq), enable_gqa=True)  # (Hq, Lq, D)
        torch.testing.assert_close(merged[own[name]], want.transpose(0, 1), **TOLERANCES[dtype])


def valid_args():
    tensors = dict(zip(("q", "k", "v"), qkv(6, 4, 2, 16, torch.float32)))
    return tensors | prefix_call([([5, 0, 2], 0, 3), ([1, 4], 3, 6)])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {"q": a["q"].double()}, "q must be one of float32, float16, bfloat16, got float64"),
        (lambda a: {"k": a["k"].half(), "v": a["v"].half()}, "q, k, v must share one dtype"),
        (lambda a: {"q": a["q"][:, :3]}, r"query heads \(3\) must be a multiple of kv heads \(2\)"),
        (lambda a: {"k": a["k"][..., :8], "v": a["v"][..., :8]}, r"k and v must both be \(Nk, Hkv, D\) with q's D"),
        (lambda a: {"q": a["q"][0]}, r"q must be \(rows, heads, head_dim\)"),
        (lambda a: {"q": a["q"].transpose(1, 2)}, "q must have a contiguous head dim"),
        (lambda a: {"key_start": a["key_start"].float()}, "key_start must be one of int32, int64, got float32"),
        (lambda a: {"q_rows": a["q_rows"][None]}, "q_rows must be 1-D"),
        (lambda a: {"q_rows": torch.arange(8)[::2]}, r"q_rows must be contiguous; call .contiguous\(\) first"),
        (lambda a: {"key_end": a["key_end"][:-1]}, r"cu_seqlens_q must be \(J\+1,\) and key_start, key_end \(J,\)"),
        (lambda a: {"max_seqlen_q": 0}, "max_seqlen_q must be a positive int"),
    ],
)
def test_bad_arguments_say_what_is_wrong(change, message):
    args = valid_args()
    with pytest.raises(ValueError, match=message):
        segment_attention(**(args | change(args)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {"max_seqlen_q": 1}, "block 0 has 3 queries but max_seqlen_q is 1"),
        (lambda a: {"key_end": torch.tensor([3, 9], dtype=torch.int32)}, "block 1's keys 3:9 are not a range of k's 6"),
        (lambda a: {"causal": True}, "causal block 1 has 2 queries and 3 keys; a causal block must be square"),
        (lambda a: {"cu_seqlens_q": torch.tensor([0, 3, 3], dtype=torch.int32)},
         "cu_seqlens_q must rise from 0 to the number of queries 5"),
        (lambda a: {"q_rows": torch.tensor([5, 0, 6, 1, 4])}, r"q_rows must be rows of q \(0..5\), got 0 .. 6"),
    ],
)
def test_reference_says_which_block_is_wrong(change, message):
    args = valid_args()
    with pytest.raises(ValueError, match=message):
        segment_attention_reference(**(args | change(args)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a CPU-only machine gives")
def test_cpu_without_interpreter_says_what_to_do(monkeypatch):
    monkeypatch.setattr(capability, "INTERPRETED", False)
    with pytest.raises(ValueError, match="compiled Triton kernels need a CUDA device; on the CPU set TRITON_INTERPRET"):
        segment_attention(**valid_args())


def test_tiles_must_suit_tl_dot():
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16"):
        AttentionTiles(block_m=32, block_n=24)
