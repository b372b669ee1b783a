"""The kernels compile for the GPU too: the interpreter runs them on the CPU but never compiles them.

`compile_sm90.py` compiles them for sm_90 (H100/H200) in a subprocess without TRITON_INTERPRET, which needs no
GPU, and reports the PTX: 16-bit attention on tensor cores (wgmma) with asynchronous K/V copies, fp32 attention
exact (no tensor cores), row gather with 16-byte vector loads; and that each default tile shape fits sm_90's
shared memory, in both variants of the attention kernel (causal self blocks, unmasked prefix blocks). It
compiles with the installed Triton, which pyproject.toml pins to the one the GPU install of torch requires
(tests/test_k8s_image.py checks that pin).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from triton.backends import backends

ROOT = Path(__file__).resolve().parents[2]
SM90_SHARED_BYTES = 227 * 1024  # most shared memory one block may use on compute capability 9.0 (CUDA guide)
pytestmark = [
    pytest.mark.slow,  # about 110 s of CPU with a cold Triton cache (ptxas included), a few s warm
    pytest.mark.skipif("nvidia" not in backends, reason="this triton build has no NVIDIA backend"),
]


@pytest.fixture(scope="module")
def ptx_counts() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    script = Path(__file__).with_name("compile_sm90.py")
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


KINDS = ["causal", "prefix"]


@pytest.mark.parametrize("kind", KINDS)
def test_attention_uses_tensor_cores_and_async_copies(ptx_counts, kind):
    assert ptx_counts[f"attention {kind} bf16 D=128"]["wgmma.mma_async"] > 0
    assert ptx_counts[f"attention {kind} bf16 D=128"]["cp.async"] > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_default_tiles_fit_sm90_shared_memory(ptx_counts, kind, dtype, head_dim):
    """A launch that asks for more shared memory than the GPU has fails at the first batch, on the GPU only."""
    assert 0 < ptx_counts[f"attention {kind} {dtype} D={head_dim}"]["shared"] <= SM90_SHARED_BYTES


@pytest.mark.parametrize("kind", KINDS)
def test_float32_attention_compiles_exact(ptx_counts, kind):
    """fp32 uses input_precision="ieee": exact fp32 products on CUDA cores, no tf32 tensor-core rounding."""
    assert ptx_counts[f"attention {kind} fp32 D=64"]["wgmma.mma_async"] == 0
    assert ptx_counts[f"attention {kind} fp32 D=64"]["cp.async"] > 0


@pytest.mark.parametrize("kernel", ["gather bf16", "gather fp32"])
def test_gather_moves_16_byte_vectors(ptx_counts, kernel):
    assert ptx_counts[kernel]["ld.global.v4"] > 0
    assert ptx_counts[kernel]["ld.global.b16"] == 0
