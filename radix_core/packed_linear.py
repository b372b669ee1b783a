"""The decoder layers' linear projections as oneDNN gemms on prepacked weights, on the CPU in float32.

torch's `F.linear` in float32 on the CPU calls MKL's sgemm on the weight as stored, for every call. oneDNN (which
torch ships) can reorder a weight once into the blocked layout its gemm kernels read, and then runs the same
products faster: measured on 2 CPUs (an AMD EPYC with AVX-512), torch 2.13, one chunk of rows of the `bench`
preset (341 rows, hidden 512, intermediate 1536): the MLP's 512 -> 3072 product at 212 GFLOP/s against MKL's 165,
1536 -> 512 at 226 against 197, a 7-row product 2.4x faster; a whole forward of the bench model 1.11-1.20x faster
(`off` and `full`, no sharing and MS MARCO reranks). vLLM's CPU backend takes the same route (its `onednn_mm`).
The sums run in another order than MKL's: results move by float32 rounding (1e-5 on the bench model's final
states), within the exactness bars against transformers.

`pack_linears` swaps every `nn.Linear` inside the decoder layers for a `PackedLinear` holding the reordered weight
(the original is released: no second copy); the upstream modules around them run unchanged. Batch-invariant mode
keeps the plain modules: its fixed row tiles (`radix_core.invariant_matmul`) work on `F.linear`.
"""

from __future__ import annotations

import torch
from torch import nn

PACKED_ROWS = 256  # the row count oneDNN picks the weight's layout for; any row count runs on it


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward on a weight reordered once for oneDNN."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_size=PACKED_ROWS)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def packs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `pack_linears` applies: float32 on a CPU build of torch with oneDNN."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


def pack_linears(module: nn.Module) -> int:
    """Replace every `nn.Linear` (exactly that class: a subclass may have its own forward) under `module` by a
    `PackedLinear`; returns how many."""
    count = 0
    for name, child in module.named_children():
        if type(child) is nn.Linear:
            setattr(module, name, PackedLinear(child))
            count += 1
        else:
            count += pack_linears(child)
    return count
