"""`chunk_attention` (batch-invariant mode's tiles on CUDA) equals its torch reference, and gives a query the same
bits whatever the number of tiles, its place in its tile and the keys it does not see; the engine in
batch-invariant mode with these tiles (interpreted here) is bitwise invariant and equals transformers."""

import numpy as np
import pytest
import torch
from transformers import AutoModel

from radix_core.engine import Engine
from radix_core.invariant_attention import InvariantAttention
from radix_core.kernels.chunk_attention import chunk_attention, chunk_attention_reference

TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
TILES, TQ, CK = 5, 16, 32  # test-sized tiles (the engine's are 32 x 64)


def inputs(dtype: torch.dtype, head_dim: int = 24):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(TILES, 4, TQ, head_dim, generator=gen).to(dtype)
    k, v = (torch.randn(TILES, 2, CK, head_dim, generator=gen).to(dtype) for _ in range(2))
    seen = torch.randint(1, CK // 2 + 1, (TILES, TQ), generator=gen, dtype=torch.int32)  # the first half at most
    return q, k, v, seen


@pytest.mark.parametrize("dtype", list(TOLERANCES))
def test_chunk_attention_equals_its_reference(dtype):
    q, k, v, seen = inputs(dtype)
    out, lse = chunk_attention(q, k, v, seen, 0.3)
    want_out, want_lse = chunk_attention_reference(q, k, v, seen, 0.3)
    torch.testing.assert_close(out.float(), want_out.float(), **TOLERANCES[dtype])
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", list(TOLERANCES))
def test_chunk_attention_gives_a_query_the_same_bits_in_any_tile(dtype):
    q, k, v, seen = inputs(dtype)
    out, lse = chunk_attention(q, k, v, seen, 0.3)
    pick = torch.tensor([3, 0])
    sub = chunk_attention(q[pick], k[pick], v[pick], seen[pick].contiguous(), 0.3)
    assert torch.equal(sub[0], out[pick]) and torch.equal(sub[1], lse[pick])
    rolled = chunk_attention(q.roll(5, 2), k, v, seen.roll(5, 1).contiguous(), 0.3)
    assert torch.equal(rolled[0].roll(-5, 2), out) and torch.equal(rolled[1].roll(-5, 2), lse)
    half = CK // 2  # keys no query sees
    other = chunk_attention(q, torch.cat([k[:, :, :half], -k[:, :, half:]], 2),
                            torch.cat([v[:, :, :half], 3 * v[:, :, half:]], 2), seen, 0.3)
    assert torch.equal(other[0], out) and torch.equal(other[1], lse)


def test_the_engine_with_chunk_tiles_is_invariant_and_exact(tiny_model_dir):
    path = str(tiny_model_dir("qwen3", "base"))
    engine = Engine.from_pretrained(path, device="cpu", batch_invariant=True, prefix_cache_bytes=0)
    engine.backend = InvariantAttention(torch.device("cuda"))  # the CUDA kernel choice, interpreted here
    assert engine.backend.triton
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 400, 150).tolist()  # past the first chunk: whole-chunk tiles too
    target = prompt + rng.integers(0, 400, 8).tolist()
    alone = engine.hidden_states([target], mode="off")[0]
    for mode in ("mlp", "full"):
        batch = [prompt + rng.integers(0, 400, 5).tolist(), target, prompt[:140]]
        assert torch.equal(engine.hidden_states(batch, mode=mode)[1], alone)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([target])).last_hidden_state[0]
    torch.testing.assert_close(alone, want, atol=1e-4, rtol=1e-4)
