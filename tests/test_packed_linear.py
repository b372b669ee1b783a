"""The decoder layers' linears on prepacked oneDNN weights: where they apply, and that they compute `nn.Linear`."""

import pytest
import torch
from torch import nn

from radix_core.engine import Engine
from radix_core.packed_linear import PackedLinear, pack_linears, packs

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")


def linears(engine: Engine) -> tuple[int, int]:
    """(packed, plain) linears in the engine's decoder layers."""
    modules = list(engine.arch.layers.modules())
    return sum(isinstance(m, PackedLinear) for m in modules), sum(type(m) is nn.Linear for m in modules)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "qwen3_5"])
def test_a_float32_cpu_engine_runs_every_layer_linear_packed(tiny_model_dir, arch):
    engine = Engine.from_pretrained(str(tiny_model_dir(arch)), device="cpu", dtype="float32")
    packed, plain = linears(engine)
    assert packed > 0 and plain == 0


def test_batch_invariant_and_bfloat16_engines_keep_the_plain_linears(tiny_model_dir):
    model = str(tiny_model_dir("qwen3"))
    invariant = Engine.from_pretrained(model, device="cpu", dtype="float32", batch_invariant=True)
    half = Engine.from_pretrained(model, device="cpu", dtype="bfloat16")
    assert linears(invariant)[0] == 0 and linears(invariant)[1] > 0
    assert linears(half)[0] == 0 and not packs(torch.device("cpu"), torch.bfloat16)


@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_linear_computes_the_linear_on_any_rows(bias):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=bias)
    packed = PackedLinear(linear)
    for x in (torch.randn(1, 64), torch.randn(300, 64), torch.randn(2, 5, 64), torch.randn(7, 128)[:, ::2]):
        torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)
    assert packed(torch.randn(0, 64)).shape == (0, 96)


def test_pack_linears_swaps_nested_linears_only_of_that_class():
    class Custom(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 4), nn.ReLU()), Custom(4, 4))
    assert pack_linears(model) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[1][0], PackedLinear)
    assert type(model[2]) is Custom
