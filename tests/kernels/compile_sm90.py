"""Compile the kernels for sm_90 (H100/H200) without a GPU and print, as JSON, what their PTX does and the shared
memory each launch needs.

Run by `test_compile.py` in a subprocess without TRITON_INTERPRET (the test process interprets its kernels).
Integer arguments carry the divisibility-by-16 hint Triton gives them at launch for real model shapes.
"""

import json

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from radix_core.kernels.row_gather import _gather_rows_kernel
from radix_core.kernels.segment_attention import _segment_attention_kernel, default_tiles

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ALIGNED = [["tt.divisibility", 16]]


def compile_kernel(fn, arg_types: list[str], constexprs: dict, aligned: list[int], **options):
    signature = dict(zip(fn.arg_names, arg_types)) | {name: "constexpr" for name in constexprs}
    source = ASTSource(fn, signature, constexprs, {(i,): ALIGNED for i in aligned})
    return triton.compile(source, target=TARGET, options=options)


def attention_kernel(dtype: str, head_dim: int, causal: bool):
    """The attention kernel with this process's `default_tiles(head_dim, dtype)`, queries read through `q_rows`
    (as the engine launches prefix blocks), in the `causal` (self) or the unmasked (prefix) variant."""
    tiles = default_tiles(head_dim, DTYPES[dtype])
    types = [f"*{dtype}"] * 4 + ["*fp32", "*i64"] + ["*i32"] * 3 + ["fp32"] + ["i32"] * 8  # pointers, scale, strides
    constexprs = dict(NUM_HEADS=32, GROUP=4, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_M=tiles.block_m,
                      BLOCK_N=tiles.block_n, CAUSAL=causal, PRECISION="ieee" if dtype == "fp32" else "tf32",
                      WIDEN=False)
    return compile_kernel(_segment_attention_kernel, types, constexprs, [*range(9), *range(10, 18)],
                          num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def gather_kernel(dtype: str):
    return compile_kernel(_gather_rows_kernel, [f"*{dtype}", "*i64", f"*{dtype}", "i32", "i32"],
                          dict(BLOCK_ROWS=8, BLOCK_COLS=1024), [0, 1, 2, 4], num_warps=4)


def report(kernel) -> dict:
    """PTX instruction counts and the shared memory (bytes) one program needs."""
    ptx = kernel.asm["ptx"]
    ops = ("wgmma.mma_async", "cp.async", "ld.global.v4", "ld.global.b16")
    return {op: ptx.count(op) for op in ops} | {"shared": kernel.metadata.shared}


if __name__ == "__main__":
    attention = {f"attention {kind} {dtype} D={d}": attention_kernel(dtype, d, kind == "causal")
                 for kind in ("causal", "prefix") for dtype in DTYPES for d in (64, 128, 256)}
    gather = {f"gather {dtype}": gather_kernel(dtype) for dtype in ("bf16", "fp32")}
    print(json.dumps({name: report(kernel) for name, kernel in (attention | gather).items()}))
