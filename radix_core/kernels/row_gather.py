"""Row gather `out = x[index]`: the fold (`x[fold_gather]`) and scatter (`x_c[scatter]`) of the radix index.

One kernel serves both directions, since both are a gather of whole rows. Each program copies a
`BLOCK_ROWS x BLOCK_COLS` tile: it loads `BLOCK_ROWS` source row numbers once, then moves contiguous column
runs, which the compiler turns into 16-byte vector loads when the width is a multiple of 16 (Triton
specialises integer arguments on divisibility by 16; model widths are). The grid is (row blocks, column
blocks); row blocks go on axis 0, whose limit is 2**31 - 1 (axes 1 and 2 stop at 65535).

No fused variant (gather + residual add or RMSNorm): in the engine no gather sits right beside an add or a
norm (`mlp` mode gathers attention outputs before the output projection; the final scatter feeds the heads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radix_core.kernels.capability import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dtype,
    check_ndim,
    check_runnable,
    launch_device,
)

_MAX_BLOCK_COLS = 1024
_TILE_ELEMENTS = 8192  # 16 KiB of bf16 per program; untuned, bench/gpu_check.py times it against index_select


@triton.jit
def _gather_rows_kernel(
    x_ptr,
    index_ptr,
    out_ptr,
    num_rows,
    width,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # (BLOCK_ROWS,) output rows
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)  # (BLOCK_COLS,)
    cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_COLS), BLOCK_COLS)  # vector-load hints
    row_ok = rows < num_rows
    src = tl.load(index_ptr + rows, mask=row_ok, other=0).to(tl.int64)  # (BLOCK_ROWS,) source rows
    mask = row_ok[:, None] & (cols[None, :] < width)  # (BLOCK_ROWS, BLOCK_COLS)
    tile = tl.load(x_ptr + src[:, None] * width + cols[None, :], mask=mask)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * width + cols[None, :], tile, mask=mask)


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`x[index]` for a contiguous `x` `(rows, width)` (fp32, fp16 or bf16) and `index` `(n,)` (int32/int64).

    Returns a new contiguous `(n, width)` tensor. Index values must lie in `[0, rows)`; they are not checked,
    since a check would cost a device synchronisation on every call (the radix index is exact by construction).
    """
    _check_gather_args(x, index)
    out = torch.empty((index.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)  # (n, width)
    if out.numel() == 0:
        return out
    block_cols = min(triton.next_power_of_2(x.shape[1]), _MAX_BLOCK_COLS)
    block_rows = _TILE_ELEMENTS // block_cols
    grid = (triton.cdiv(out.shape[0], block_rows), triton.cdiv(out.shape[1], block_cols))
    with launch_device(x):
        _gather_rows_kernel[grid](x, index, out, out.shape[0], out.shape[1], BLOCK_ROWS=block_rows,
                                  BLOCK_COLS=block_cols)
    return out


def gather_rows_reference(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The plain torch `x[index]` that `gather_rows` must equal bit for bit."""
    return x.index_select(0, index)  # (n, width)


def _check_gather_args(x: torch.Tensor, index: torch.Tensor) -> None:
    name = "gather_rows"
    check_ndim(name, "x", x, 2, "(rows, width)")
    check_ndim(name, "index", index, 1, "(n,)")
    check_dtype(name, "x", x, FLOAT_DTYPES)
    check_dtype(name, "index", index, INDEX_DTYPES)
    if not x.is_contiguous():
        raise ValueError(f"gather_rows: x must be contiguous (strides {x.stride()}); call .contiguous() first")
    if not index.is_contiguous():
        raise ValueError("gather_rows: index must be contiguous; call .contiguous() first")
    if x.shape[0] == 0 and index.shape[0] > 0:
        raise ValueError(f"gather_rows: x has no rows but index asks for {index.shape[0]}")
    check_runnable(name, x, index)
