"""`chunk_attention` (batch-invariant mode's tiles on CUDA) equals its torch reference, and gives a query the same
bits whatever the number of tiles, its place in its tile and the keys it does not see; the engine in
batch-invariant mode with these tiles (interpreted here) equals transformers and is bitwise invariant.

Triton's interpreter runs `tl.dot` as numpy's matmul, so the bitwise checks hold here only where the host's BLAS
gives a row the same bits wherever it sits in a tile: OpenBLAS's AVX-512 kernels do on these shapes, its AVX2 ones
do not (a row's bits follow its place in the kernel's register block). Elsewhere they are skipped, saying so; the
GPU check (`bench/gpu_engine_checks.py`) runs them compiled on CUDA.
"""

import numpy as np
import pytest
import torch
from transformers import AutoModel

from radix_core.engine import Engine
from radix_core.invariant_attention import InvariantAttention
from radix_core.kernels.chunk_attention import chunk_attention, chunk_attention_reference

TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
TILES, TQ, CK = 5, 16, 32  # test-sized tiles (the engine's are 32 x 64)


def blas_keeps_row_bits() -> bool:
    """Whether numpy's matmul in float32 gives each row of the product the same bits when the rows of its left
    operand are rolled, on the tiles' shapes here and the engine's (32 x 64, the tiny model's head dim 16)."""
    rng = np.random.default_rng(0)
    for rows, inner, cols in ((TQ, 24, CK), (TQ, CK, 24), (32, 16, 64), (32, 64, 16)):
        a, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((rows, inner), (inner, cols)))
        product = np.matmul(a, b, dtype=np.float32)
        if not all(np.array_equal(np.matmul(np.roll(a, shift, 0), b, dtype=np.float32), np.roll(product, shift, 0))
                   for shift in range(1, rows)):
            return False
    return True


row_bits = pytest.mark.skipif(not blas_keeps_row_bits(), reason=(
    "this CPU's BLAS (numpy's matmul, which Triton's interpreter runs tl.dot with) gives a row other bits in another "
    "place of its tile, so the interpreter cannot show the kernel's bitwise invariance here; "
    "bench/gpu_engine_checks.py checks it compiled on CUDA"))


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


@row_bits
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


def chunk_tile_engine(path: str) -> Engine:
    engine = Engine.from_pretrained(path, device="cpu", batch_invariant=True, prefix_cache_bytes=0)
    engine.backend = InvariantAttention(torch.device("cuda"))  # the CUDA kernel choice, interpreted here
    assert engine.backend.triton
    return engine


def prompt_and_target(rng: np.random.Generator) -> tuple[list[int], list[int]]:
    prompt = rng.integers(0, 400, 150).tolist()  # past the first chunk: whole-chunk tiles too
    return prompt, prompt + rng.integers(0, 400, 8).tolist()


def test_the_engine_with_chunk_tiles_is_exact(tiny_model_dir):
    path = str(tiny_model_dir("qwen3", "base"))
    prompt, target = prompt_and_target(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    engine = chunk_tile_engine(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([target])).last_hidden_state[0]
    torch.testing.assert_close(engine.hidden_states([target], mode="off")[0], want, atol=1e-4, rtol=1e-4)
    for mode in ("mlp", "full"):
        batch = [prompt + rng.integers(0, 400, 5).tolist(), target, prompt[:140]]
        torch.testing.assert_close(engine.hidden_states(batch, mode=mode)[1], want, atol=1e-4, rtol=1e-4)


@row_bits
def test_the_engine_with_chunk_tiles_is_invariant(tiny_model_dir):
    engine = chunk_tile_engine(str(tiny_model_dir("qwen3", "base")))
    prompt, target = prompt_and_target(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    alone = engine.hidden_states([target], mode="off")[0]
    for mode in ("mlp", "full"):
        batch = [prompt + rng.integers(0, 400, 5).tolist(), target, prompt[:140]]
        assert torch.equal(engine.hidden_states(batch, mode=mode)[1], alone)
