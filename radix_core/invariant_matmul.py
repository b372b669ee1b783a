"""Matmuls whose every row is computed the same way whatever the other rows: fixed row tiles (batch-invariant mode).

A BLAS gemm picks its kernel, blocking and threading from the matrix shape, so a row's bits in `x @ W.T` depend on
how many rows `x` has. Measured on this project's CPU (torch 2.13, MKL 2024.2, oneDNN 3.12, AVX-512 with AMX): in
float32 with one thread a row comes out one way alone (gemv), another way among 2-15 rows, a third among 16 or
more; with two threads some shapes take yet another path for 63-129 rows (hidden 1536 -> 512) or from 129 rows on
(1024 -> 3072); in bfloat16 (oneDNN) rows of a 128- or 256-row call differ from the same rows inside a 1,024-row
call. A gemm of one fixed shape, by contrast, gives each row the same bits at any position of its tile, whatever
the other rows hold, and a loop of such gemms gives each row the same bits whatever the number of tiles (checked
for every shape of the bench model, one and two threads, both dtypes: `tests/test_batch_invariance.py`).

So in batch-invariant mode every `F.linear` (projections, MLP, heads) runs as gemms of exactly `row_tile(dtype)`
rows: the rows in tiles, the last tile padded with zeros, each tile one `addmm` into its slice of the output. The
padding costs at most a tile less one row per call. Tile sizes, from one run of the bench model's forward on the
MS MARCO-shaped batch (one thread, CPU time, noisy to a few %): float32 tiles of 128 / 256 / 512 / 1,024 rows cost
+10 / +8 / +16 / +13% over one call per matmul; bfloat16 tiles +25 / +10 / +10 / +0% (oneDNN's per-call cost
weighs more next to AMX's speed). So float32 takes 256-row tiles, 16-bit floats 1,024. On the matmuls alone (a
layer's five linears at 2,560 / 5,836 / 8,200 rows, one thread): float32 +5 / +4 / +13%, bfloat16 +58 / +43 / +59%
(oneDNN's AMX gemm gains from one large call; weights prepacked for the tile's row count were no faster).
`RowTiledLinear` is a torch function mode: inside it, the model's own modules (transformers' `nn.Linear`, whose
forward calls `F.linear`) run tiled, with no module replaced.

Reductions over the last dimension (RMSNorm's and q/k-norm's `mean`, the heads' `sum` and `logsumexp`, the
embeddings' `norm`): on the CPU torch reduces each row on its own whatever the number of rows (measured: one row's
`mean`, `sum`, `logsumexp`, `softmax` over 512 to 16,384 values have the same bits among 1 to 20,000 rows, one and
two threads, both dtypes), so they run as they are. CUDA's reduction kernels choose their launch (and may split a
row across blocks) by the number of rows, so on CUDA the mode runs them in row tiles of `ROW_TILE` too
(`tile_reductions`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

ROW_TILE = 256  # rows of every float32 (and float64) gemm in batch-invariant mode
HALF_ROW_TILE = 1024  # rows of every bfloat16 and float16 gemm
HALF_DTYPES = (torch.bfloat16, torch.float16)


def row_tile(dtype: torch.dtype) -> int:
    """Rows of every gemm in `dtype` in batch-invariant mode (module docstring)."""
    return HALF_ROW_TILE if dtype in HALF_DTYPES else ROW_TILE


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 tile: int | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` as gemms of exactly `tile` rows (default `row_tile(x.dtype)`): x (..., K),
    weight (N, K) -> (..., N)."""
    tile = tile or row_tile(x.dtype)
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])  # (M, K)
    m = rows.shape[0]
    whole = m - m % tile
    out = rows.new_empty(whole + (tile if whole < m else 0), weight.shape[0])  # (M rounded up, N)
    wt = weight.t()  # (K, N)
    for start in range(0, whole, tile):
        _gemm(rows[start:start + tile], wt, bias, out[start:start + tile])
    if whole < m:
        last = rows.new_zeros(tile, rows.shape[1])  # (tile, K): the remaining rows, then zeros
        last[:m - whole] = rows[whole:]
        _gemm(last, wt, bias, out[whole:])
    return out[:m].view(*lead, weight.shape[0])


def _gemm(x: torch.Tensor, wt: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    if bias is None:
        torch.mm(x, wt, out=out)
    else:
        torch.addmm(bias, x, wt, out=out)


def tiled_rows(func, x: torch.Tensor, *args, tile: int = ROW_TILE, **kwargs) -> torch.Tensor:
    """`func(x, *args, **kwargs)` for a reduction over x's last dimension, on row tiles of exactly `tile` rows (the
    last padded with zeros), results concatenated: (..., K) -> (..., 1) with keepdim, else (...)."""
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])  # (M, K)
    m = rows.shape[0]
    pad = -m % tile
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])  # (M rounded up, K)
    out = torch.cat([func(rows[start:start + tile], *args, **kwargs) for start in range(0, rows.shape[0], tile)])
    return out[:m].view(*lead, *out.shape[1:])


_REDUCTIONS = {torch.Tensor.mean: 1, torch.mean: 1, torch.Tensor.sum: 1, torch.sum: 1, torch.Tensor.logsumexp: 1,
               torch.logsumexp: 1, torch.Tensor.norm: 2, torch.norm: 2, torch.linalg.vector_norm: 2}  # -> dim's place


def _reduces_last_dim(func, args, kwargs) -> bool:
    x, place = args[0], _REDUCTIONS[func]
    dim = kwargs.get("dim", args[place] if len(args) > place else None)
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    return isinstance(x, torch.Tensor) and x.dim() >= 2 and len(dims) == 1 and dims[0] in (-1, x.dim() - 1)


class RowTiledLinear(TorchFunctionMode):
    """Inside `with RowTiledLinear():` every `F.linear` runs as `tiled_linear`, and with `tile_reductions` (default:
    on CUDA) every `mean`, `sum`, `logsumexp` or `norm` over the last dimension as `tiled_rows`; everything else as
    usual."""

    def __init__(self, tile_reductions: bool | None = None):
        super().__init__()
        self.tile_reductions = tile_reductions

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            return tiled_linear(*args, **kwargs)
        if func in _REDUCTIONS and _reduces_last_dim(func, args, kwargs):
            tile = self.tile_reductions if self.tile_reductions is not None else args[0].is_cuda
            if tile:  # the tiles are 2-D: the dimension as -1
                if "dim" in kwargs:
                    kwargs = {**kwargs, "dim": -1}
                else:
                    args = (*args[:_REDUCTIONS[func]], -1, *args[_REDUCTIONS[func] + 1:])
                return tiled_rows(func, *args, **kwargs)
        return func(*args, **kwargs)
