"""The dense families' norms, MLPs and rotary in fewer passes (`radix_core.lean_layers`): each module equals its
upstream class bit for bit, in float32 and bfloat16, and so does the engine's whole forward."""

import numpy as np
import pytest
import torch
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.qwen3 import modeling_qwen3

from radix_core.architectures import load_architecture
from radix_core.engine import Engine
from radix_core.engine_config import EngineConfig
from radix_core.lean_layers import MLPS, NORMS, ROTARY_FAMILIES, LeanMLP, LeanRMSNorm, lean_layers, lean_rotary
from radix_core.tokens import TokenSequences

DTYPES = [torch.float32, torch.bfloat16]
# rows x hidden as the forward's chunks have them, Qwen3's per-head q/k-norm input, odd sizes
SHAPES = [(352, 512), (37, 8, 64), (5, 4, 128), (3, 96)]


def inputs(shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """Random inputs of several magnitudes."""
    generator = torch.Generator().manual_seed(sum(shape))
    return [(torch.randn(shape, generator=generator) * scale).to(dtype) for scale in (1e-3, 1.0, 30.0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_class", NORMS)
def test_a_lean_norm_equals_its_upstream_class_bit_for_bit(norm_class, dtype):
    for shape in SHAPES:
        upstream = norm_class(shape[-1], eps=1e-6).to(dtype)
        nn.init.normal_(upstream.weight)
        lean = LeanRMSNorm(upstream)
        for x in inputs(shape, dtype):
            assert torch.equal(lean(x), upstream(x)), (norm_class.__name__, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mlp_class", MLPS)
def test_a_lean_mlp_equals_its_upstream_class_bit_for_bit(mlp_class, dtype):
    config = LlamaConfig(hidden_size=96, intermediate_size=160, hidden_act="silu")  # every field the MLPs read
    torch.manual_seed(0)
    upstream = mlp_class(config).to(dtype)
    lean = LeanMLP(upstream)
    for x in inputs((41, 96), dtype):
        assert torch.equal(lean(x), upstream(x)), (mlp_class.__name__, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lean_rotary_equals_upstream_rotary_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(3)
    for rows, heads, kv_heads, dim in ((352, 8, 4, 64), (7, 2, 1, 128), (1, 1, 1, 16)):
        q, k = (torch.randn(rows, h, dim, generator=generator).to(dtype) for h in (heads, kv_heads))
        angles = torch.rand(rows, dim // 2, generator=generator) * 100
        cos, sin = (f(torch.cat([angles, angles], -1)).to(dtype) for f in (torch.cos, torch.sin))  # (rows, D)
        ours = lean_rotary(q, k, cos, sin, unsqueeze_dim=1)
        theirs = modeling_qwen3.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs)), (rows, heads, dim, dtype)


def test_lean_layers_swaps_only_those_classes_and_silu_mlps():
    config = modeling_qwen3.Qwen3Config(hidden_size=32, intermediate_size=48, hidden_act="silu")

    class CustomNorm(modeling_qwen3.Qwen3RMSNorm):
        pass

    gelu = modeling_qwen3.Qwen3MLP(config)
    gelu.act_fn = ACT2FN["gelu"]
    norm, mlp = modeling_qwen3.Qwen3RMSNorm(32), modeling_qwen3.Qwen3MLP(config)
    model = nn.Sequential(norm, nn.Sequential(mlp), CustomNorm(32), gelu)
    assert lean_layers(model) == 2
    assert type(model[0]) is LeanRMSNorm and type(model[1][0]) is LeanMLP
    assert type(model[2]) is CustomNorm and type(model[3]) is modeling_qwen3.Qwen3MLP
    assert model[0].weight is norm.weight and model[1][0].down_proj is mlp.down_proj  # shared, not copied


def engine_pair(model_dir: str, dtype: str) -> tuple[Engine, Engine]:
    """The same checkpoint with the lean modules (as `from_pretrained` loads it) and with upstream's."""
    config = EngineConfig(device="cpu", dtype=dtype, prefix_cache_bytes=0)
    lean = Engine.from_pretrained(model_dir, config)
    upstream = Engine(load_architecture(model_dir, lean.device, lean.dtype, packed=True, lean=False), lean.device,
                      lean.dtype, config, model=model_dir, prompts=lean.prompts)
    return lean, upstream


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama", "mistral"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_engines_forward_on_lean_modules_equals_upstream_modules_bit_for_bit(tiny_model_dir, family, dtype):
    lean, upstream = engine_pair(str(tiny_model_dir(family)), dtype)
    modules = list(lean.arch.layers.modules()) + [lean.arch.norm]
    assert any(type(m) is LeanRMSNorm for m in modules) and any(type(m) is LeanMLP for m in modules)
    assert lean.arch.apply_rotary is lean_rotary and family in ROTARY_FAMILIES
    assert not any(type(m) in (LeanRMSNorm, LeanMLP) for m in upstream.arch.layers.modules())
    rng = np.random.default_rng(0)
    prefix = rng.integers(5, 200, size=30).tolist()
    sequences = TokenSequences.from_lists([prefix + rng.integers(5, 200, size=n).tolist() for n in (3, 17, 40, 9)])
    for mode in ("off", "mlp", "full"):
        ours, theirs = (e.hidden_states(sequences, mode) for e in (lean, upstream))
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs)), (family, dtype, mode)


def test_hybrid_families_keep_their_own_modules(tiny_model_dir):
    engine = Engine.from_pretrained(str(tiny_model_dir("qwen3_5")), device="cpu")
    assert engine.arch.apply_rotary is not lean_rotary
    assert not any(type(m) is LeanRMSNorm for m in engine.arch.layers.modules())
