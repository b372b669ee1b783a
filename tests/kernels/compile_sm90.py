"""Compile the kernels for sm_90 (H100/H200) without a GPU and print what their PTX does, as JSON.

Run by `test_compile.py` in a subprocess without TRITON_INTERPRET (the test process interprets its kernels).
Integer arguments carry the divisibility-by-16 hint Triton gives them at launch for real model shapes.
"""

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from radix_core.kernels.compact_attention import _compact_attention_kernel, default_tiles
from radix_core.kernels.row_gather import _gather_rows_kernel

TARGET = GPUTarget("cuda", 90, 32)
ALIGNED = [["tt.divisibility", 16]]


def compile_kernel(fn, arg_types: list[str], constexprs: dict, aligned: list[int], **options) -> str:
    signature = dict(zip(fn.arg_names, arg_types)) | {name: "constexpr" for name in constexprs}
    source = ASTSource(fn, signature, constexprs, {(i,): ALIGNED for i in aligned})
    return triton.compile(source, target=TARGET, options=options).asm["ptx"]


def attention_ptx(dtype: str, head_dim: int) -> str:
    tiles = default_tiles(head_dim)
    types = [f"*{dtype}"] * 4 + ["*i32"] * 3 + ["fp32"] + ["i32"] * 8  # pointers, scale, 8 strides
    constexprs = dict(NUM_HEADS=32, GROUP=4, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_M=tiles.block_m,
                      BLOCK_N=tiles.block_n, PRECISION="ieee" if dtype == "fp32" else "tf32", WIDEN=False)
    return compile_kernel(_compact_attention_kernel, types, constexprs, [*range(7), *range(8, 16)],
                          num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def gather_ptx(dtype: str) -> str:
    return compile_kernel(_gather_rows_kernel, [f"*{dtype}", "*i64", f"*{dtype}", "i32", "i32"],
                          dict(BLOCK_ROWS=8, BLOCK_COLS=1024), [0, 1, 2, 4], num_warps=4)


def counts(ptx: str) -> dict:
    return {op: ptx.count(op) for op in ("wgmma.mma_async", "cp.async", "ld.global.v4", "ld.global.b16")}


if __name__ == "__main__":
    print(json.dumps({
        "attention bf16 D=128": counts(attention_ptx("bf16", 128)),
        "attention fp32 D=64": counts(attention_ptx("fp32", 64)),
        "gather bf16": counts(gather_ptx("bf16")),
        "gather fp32": counts(gather_ptx("fp32")),
    }))
