"""The engine with `attention="triton"` (interpreted on the CPU) equals transformers, in every mode."""

import numpy as np
import pytest
import torch
from transformers import AutoModel

from radix_core.engine import Engine


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("mode", ["off", "mlp", "full"])
def test_triton_engine_equals_transformers(tiny_model_dir, family, mode):
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 400, 24).tolist()
    batch = [shared + rng.integers(0, 400, n).tolist() for n in (5, 1, 9)] + [shared[:10], shared[:10], [3]]
    engine = Engine.from_pretrained(str(tiny_model_dir(family, "base")), device="cpu", attention="triton")
    assert engine.info["attention"] == "triton"
    model = AutoModel.from_pretrained(tiny_model_dir(family, "base"), dtype=torch.float32).eval()
    for got, seq in zip(engine.hidden_states(batch, mode=mode), batch):
        with torch.no_grad():
            want = model(torch.tensor([seq])).last_hidden_state[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
