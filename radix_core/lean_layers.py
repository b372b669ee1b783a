"""The dense families' RMSNorm, SiLU MLP and rotary in fewer passes over memory, bit for bit upstream's, on the CPU.

Upstream's modules spend a chunk of rows' elementwise work in allocations and extra passes: the RMSNorm as six
eager ops, the MLP's `act(gate) * up` into a fresh tensor, the rotary's `rotate_half` as a negation and a
concatenation before its product. On the CPU every such pass is a parallel region of the forward's OpenMP team
over data the linears just wrote. Here:

* `LeanRMSNorm`: `F.rms_norm`, which on the CPU is the same composite (upcast, `pow(2).mean`, `+ eps`, `rsqrt`,
  product) in one call, then `weight *` as upstream (after the cast back, so bfloat16 rounds where upstream does).
* `LeanMLP`: `down(silu(gate(x)) * up(x))` with the SiLU and the product in place.
* `lean_rotary`: `x * cos + rotate_half(x) * sin` as `x * cos + swap(x) * sin'`, where `sin'` is `sin` with its
  first half negated (`-a * b == a * -b` exactly): two half-width products into one buffer, no concatenation.

Every value is computed by the same operations in the same order as upstream's, so the results are identical bit
for bit (`tests/test_lean_layers.py` checks each module against its upstream class, float32 and bfloat16, and the
engine's forward against one on upstream's modules). Only on the CPU: on CUDA `F.rms_norm` is a fused kernel that
sums in another order. A small saving, as these ops are a few percent of a forward whose linears are ~70% of it:
on 2 CPUs (an Intel Xeon), the `bench` preset, one chunk of 352 rows, `F.rms_norm` 47 us against upstream's
RMSNorm 61 (Qwen3's q-norm 66 against 82); whole forwards 1.025x on 8- and 256-document reranks, within the
rounds' spread on embeddings (`python bench/lean_layers.py --rounds 3`, `bench/results/lean_layers.md`).

`lean_layers(base)` swaps the modules of exactly these classes (a subclass may compute something else) under a
text model; the weights are shared, not copied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import SiLUActivation
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
from transformers.models.mistral.modeling_mistral import MistralMLP, MistralRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

NORMS = (LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm)  # `weight * normed.to(dtype)`
MLPS = (LlamaMLP, MistralMLP, Qwen2MLP, Qwen3MLP)  # `down(act(gate(x)) * up(x))`
ROTARY_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # apply_rotary_pos_emb over the whole head, rotate_half
SILU = (SiLUActivation, nn.SiLU)  # what ACT2FN gives for "silu" and "swish"


class LeanRMSNorm(nn.Module):
    """An upstream RMSNorm's forward in one `F.rms_norm` call and the weight's product."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight, self.variance_epsilon = norm.weight, norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), self.weight.shape, None, self.variance_epsilon)  # float32, x's shape
        return self.weight * normed.to(x.dtype)


class LeanMLP(nn.Module):
    """A SiLU-gated MLP with its activation and product in place."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)  # (r, intermediate)
        return self.down_proj(F.silu(gate, inplace=True).mul_(self.up_proj(x)))


def lean_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense families' `apply_rotary_pos_emb`, the same bits."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    half = q.shape[-1] // 2
    sin_low, sin_high = -sin[..., :half], sin[..., half:]  # (r, 1, D / 2) each
    return _rotated(q, cos, sin_low, sin_high, half), _rotated(k, cos, sin_low, sin_high, half)


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin_low: torch.Tensor, sin_high: torch.Tensor,
             half: int) -> torch.Tensor:
    """`x * cos + cat(-x_high, x_low) * sin`, the second product written half by half."""
    turned = torch.empty_like(x)  # (r, H, D)
    torch.mul(x[..., half:], sin_low, out=turned[..., :half])
    torch.mul(x[..., :half], sin_high, out=turned[..., half:])
    return (x * cos).add_(turned)


def lean_layers(module: nn.Module) -> int:
    """Swap every module under `module` that has a lean twin for it; returns how many."""
    count = 0
    for name, child in module.named_children():
        twin = lean_twin(child)
        if twin is None:
            count += lean_layers(child)
        else:
            setattr(module, name, twin)
            count += 1
    return count


def lean_twin(module: nn.Module) -> nn.Module | None:
    """The lean twin of a module of the `NORMS` classes, or of the `MLPS` classes with a SiLU; else None."""
    if type(module) in NORMS:
        return LeanRMSNorm(module)
    if type(module) in MLPS and type(module.act_fn) in SILU:
        return LeanMLP(module)
    return None
