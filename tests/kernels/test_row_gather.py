"""`gather_rows` equals `x[index]` exactly, for the fold and the scatter of real radix indices."""

import numpy as np
import pytest
import torch

from radix_core.kernels import gather_rows, gather_rows_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
WIDTHS = [1, 3, 100, 1000, 1031]  # one column, odd, under and over one 1024-column tile


def rows(num_rows: int, width: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, width, generator=torch.Generator().manual_seed(seed)).to(dtype)  # (rows, width)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fold_and_scatter_match_index_select(radix_batch, dtype, width, index_dtype):
    index = radix_batch(seed=width)
    fold = torch.from_numpy(index.fold_gather.astype(np.int64)).to(index_dtype)  # (N',)
    scatter = torch.from_numpy(index.scatter.astype(np.int64)).to(index_dtype)  # (N,)
    x = rows(index.num_tokens, width, dtype)  # (N, width)
    x_c = gather_rows(x, fold)  # (N', width)
    assert torch.equal(x_c, gather_rows_reference(x, fold))
    assert torch.equal(gather_rows(x_c, scatter), gather_rows_reference(x_c, scatter))  # (N, width)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_row(dtype):
    x = rows(1, 7, dtype)  # (1, 7)
    index = torch.zeros(3, dtype=torch.int32)
    assert torch.equal(gather_rows(x, index), x.expand(3, 7))
    assert torch.equal(gather_rows(x, index[:1]), x)


def test_empty_index_gives_no_rows():
    out = gather_rows(rows(5, 9, torch.float32), torch.zeros(0, dtype=torch.int64))
    assert out.shape == (0, 9)


@pytest.mark.parametrize(
    ("x", "index", "message"),
    [
        (torch.zeros(4, 2, 3), torch.zeros(2, dtype=torch.int64), r"x must be \(rows, width\)"),
        (torch.zeros(4, 3), torch.zeros(2, 1, dtype=torch.int64), r"index must be \(n,\)"),
        (torch.zeros(4, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.int64), "x must be one of float32"),
        (torch.zeros(4, 3), torch.zeros(2, dtype=torch.int16), "index must be one of int32, int64, got int16"),
        (torch.zeros(3, 4).t(), torch.zeros(2, dtype=torch.int64), "x must be contiguous"),
        (torch.zeros(0, 3), torch.zeros(2, dtype=torch.int64), "x has no rows but index asks for 2"),
    ],
)
def test_bad_arguments_say_what_is_wrong(x, index, message):
    with pytest.raises(ValueError, match=message):
        gather_rows(x, index)
