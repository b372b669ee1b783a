"""Golden tests: every engine mode equals transformers run on each sequence alone, on every family and head."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from radix_core import forward
from radix_core.engine import Engine

FAMILIES = ["qwen3", "qwen2", "llama", "mistral"]
HEADS = ["causal_lm", "seq_cls", "base"]
# "auto" runs "off" or "full" per batch, so its golden cases would repeat theirs; test_batch_equals_per_sequence
# runs it, and tests/test_mode_cost.py checks that it gives exactly the outputs of the mode it picked.
MODES = ["off", "mlp", "full"]
VOCAB = 400  # below every tiny model's vocabulary
INVARIANT = {"default": {}, "batch_invariant": {"batch_invariant": True}}  # engine settings of the heads' tests


def golden_batches() -> dict[str, list[list[int]]]:
    rng = np.random.default_rng(0)
    tokens = lambda n: rng.integers(0, VOCAB, n).tolist()  # noqa: E731
    shared = tokens(300)
    stem = tokens(12)
    system, query_a, query_b, other = tokens(40), tokens(10), tokens(7), tokens(25)
    return {
        "long-shared-prefix": [shared + tokens(n) for n in (20, 64, 1, 33)],
        "duplicates-and-prefixes": [stem + [5, 6], stem, stem + [5, 6], stem[:4], [stem[0]], stem + [5, 6, 7]],
        "single-tokens": [[3], [3], [4], [3, 4]],
        "one-sequence": [tokens(50)],
        "no-sharing": [tokens(n) for n in (17, 1, 40)],
        "up-to-1024": [shared + tokens(724), shared + tokens(100), tokens(1024)],
        # two independent trees, depths 3 and 1, interleaved; a sequence ends where the tree branches
        "prefix-groups-of-depths": [system + query_a + tokens(30), other + tokens(5), system + query_b + tokens(3),
                                    system + query_a + tokens(17), other + tokens(20), system,
                                    system + query_b + tokens(41), tokens(9), system + query_a[:4] + tokens(2)],
    }


BATCHES = golden_batches()


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """Per (family, batch name): transformers' final-normed hidden states, one sequence at a time."""
    cache = {}

    def get(family: str, name: str) -> list[torch.Tensor]:
        if (family, name) not in cache:
            model = AutoModel.from_pretrained(tiny_model_dir(family, "base"), dtype=torch.float32).eval()
            with torch.no_grad():
                cache[family, name] = [model(torch.tensor([s])).last_hidden_state[0] for s in BATCHES[name]]
        return cache[family, name]

    return get


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    cache = {}

    def get(family: str, head: str, **kwargs) -> Engine:
        key = (family, head, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = Engine.from_pretrained(str(tiny_model_dir(family, head)), device="cpu", **kwargs)
        return cache[key]

    return get


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(BATCHES))
def test_hidden_states_equal_transformers(engines, reference, family, mode, name):
    got = engines(family, "base").hidden_states(BATCHES[name], mode=mode)
    want = reference(family, name)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)



@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["long-shared-prefix", "prefix-groups-of-depths"])
def test_position_wise_work_in_row_chunks_equals_transformers(engines, reference, monkeypatch, family, mode, name):
    """On the CPU the layers run position-wise work chunk by chunk of rows (`forward.chunk_rows`); the golden
    batches fit one chunk, so here every chunk is 16 rows."""
    monkeypatch.setattr(forward, "chunk_rows", lambda arch, h: 16)
    assert sum(map(len, BATCHES[name])) > 4 * 16  # several chunks
    got = engines(family, "base").hidden_states(BATCHES[name], mode=mode)
    for g, w in zip(got, reference(family, name), strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", MODES)
def test_batch_invariant_hidden_states_equal_transformers(engines, reference, family, mode):
    """`batch_invariant` (fixed row tiles, keys in fixed chunks) is the same function as the model, within 1e-4."""
    engine = engines(family, "base", batch_invariant=True)
    for name, batch in BATCHES.items():
        for g, w in zip(engine.hidden_states(batch, mode=mode), reference(family, name)):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("setting", list(INVARIANT))
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", MODES)
def test_lm_logits_equal_transformers(engines, tiny_model_dir, family, mode, setting):
    batch = BATCHES["duplicates-and-prefixes"] + BATCHES["long-shared-prefix"] + BATCHES["prefix-groups-of-depths"]
    positions = [[0, -1], [-1], [1, 2, -1], [-1], [0], [3, -2, -1], [-1, 0], [-1], [-1], [5, -1]]
    positions += [[-1, 45], [0, -1], [-1], [-1], [-2, -1], [-1], [50, -1], [-1], [-1]]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(family, "causal_lm"), dtype=torch.float32).eval()
    got = engines(family, "causal_lm", **INVARIANT[setting]).lm_logits(batch, positions, mode=mode)
    for seq, pos, g in zip(batch, positions, got):
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0]  # (L, vocab)
        torch.testing.assert_close(g, logits[pos], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("setting", list(INVARIANT))
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", MODES)
def test_classification_scores_equal_transformers(engines, tiny_model_dir, family, mode, setting):
    batch = BATCHES["long-shared-prefix"] + BATCHES["single-tokens"] + BATCHES["prefix-groups-of-depths"]
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir(family, "seq_cls"),
                                                               dtype=torch.float32).eval()
    got = engines(family, "seq_cls", **INVARIANT[setting]).classification_scores(batch, mode=mode)
    with torch.no_grad():
        want = torch.cat([model(torch.tensor([s])).logits for s in batch])  # (B, 1)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("head", HEADS)
def test_every_head_gives_the_base_hidden_states(engines, reference, head):
    got = engines("qwen3", head).hidden_states(BATCHES["duplicates-and-prefixes"], mode="full")
    for g, w in zip(got, reference("qwen3", "duplicates-and-prefixes")):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", [*MODES, "auto"])
def test_batch_equals_per_sequence(engines, mode):
    engine = engines("qwen2", "causal_lm")
    batch = BATCHES["long-shared-prefix"] + BATCHES["duplicates-and-prefixes"] + BATCHES["prefix-groups-of-depths"]
    together = engine.last_hidden_states(batch, mode=mode)
    alone = torch.cat([engine.last_hidden_states([s], mode=mode) for s in batch])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("setting", list(INVARIANT))
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_bfloat16_within_bf16_tolerance(engines, tiny_model_dir, reference, family, setting):
    """bf16 engine vs transformers in bf16: no further from the float32 truth than transformers itself."""
    model = AutoModel.from_pretrained(tiny_model_dir(family, "base"), dtype=torch.bfloat16).eval()
    batch = BATCHES["long-shared-prefix"]
    with torch.no_grad():
        hf = [model(torch.tensor([s])).last_hidden_state[0].float() for s in batch]
    truth = reference(family, "long-shared-prefix")
    hf_error = max((h - t).abs().mean().item() for h, t in zip(hf, truth))
    engine = engines(family, "base", dtype="bfloat16", **INVARIANT[setting])
    for mode in ("off", "mlp", "full"):
        got = engine.hidden_states(batch, mode=mode)
        for g, h, t in zip(got, hf, truth):
            assert g.dtype == torch.bfloat16
            torch.testing.assert_close(g.float(), h, atol=0.25, rtol=0.05)
            assert (g.float() - t).abs().mean().item() <= 1.5 * hf_error
