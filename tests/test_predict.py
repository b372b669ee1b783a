"""The predict task: a sequence-classification model's own labels per input equal transformers'
`AutoModelForSequenceClassification` run on each input alone, best first, for a one-label head (sigmoid) and a
multi-label head (softmax), raw logits too; split and merged equals whole; what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from radix_core import Engine
from radix_core.tasks import TASKS
from radix_core.tiny_models import make_tiny_model

INPUTS = ["a radix tree stores strings by shared prefixes", "bread rises in a warm oven", "Ünïcödé 😀 text",
          "a radix tree stores strings by shared prefixes, and more"]
TOL = 1e-4


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    """One-label (the shared fixture) and three-label tiny seq-cls models, Qwen3 and Llama."""
    root = tmp_path_factory.mktemp("predict")
    return {"qwen3-1": tiny_model_dir("qwen3", "seq_cls"),
            "qwen3-3": make_tiny_model(root / "qwen3-3", "qwen3", "seq_cls", num_labels=3),
            "llama-4": make_tiny_model(root / "llama-4", "llama", "seq_cls", num_labels=4, seed=1)}


def reference(model_dir, texts: list[str]) -> tuple[list[str], np.ndarray]:
    """(labels by id, (n, num_labels) float32 logits): transformers on each text alone, as `tokenizer(text)`."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with torch.no_grad():
        logits = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in texts]
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    return labels, torch.stack(logits).numpy()


@pytest.mark.parametrize("radix", ["off", "full"])
@pytest.mark.parametrize("name", ["qwen3-1", "qwen3-3", "llama-4"])
def test_predict_equals_transformers_on_each_input_alone(models, name, radix):
    engine = Engine.from_pretrained(str(models[name]), device="cpu", radix=radix)
    labels, logits = reference(models[name], INPUTS)
    probabilities = torch.from_numpy(logits).sigmoid() if len(labels) == 1 else torch.from_numpy(logits).softmax(-1)
    for raw, want in ((False, probabilities.numpy()), (True, logits)):
        result = engine.predict(INPUTS, raw_scores=raw)
        for row, expected in zip(result.results, want):
            assert [hit.label for hit in row] == [labels[i] for i in np.argsort(-expected, kind="stable")]
            got = {hit.label: hit.score for hit in row}
            np.testing.assert_allclose([got[label] for label in labels], expected, atol=TOL)
    assert result.usage.input_tokens == sum(len(engine.prompts.tokenizer(text)["input_ids"]) for text in INPUTS)
    if radix == "full":  # the first input is a prefix of the last: computed once
        assert result.usage.computed_tokens < result.usage.input_tokens


def test_split_predict_merges_to_the_whole(models):
    engine = Engine.from_pretrained(str(models["qwen3-3"]), device="cpu")
    task = TASKS["predict"]
    job = task.encode(engine.context, {"inputs": INPUTS})
    parts = task.split(job, 12)
    assert len(parts) > 1
    merged = task.merge(job, [partial for part in parts for partial in engine.run_jobs([part])])
    whole = engine.predict(INPUTS)
    for got, want in zip(merged.results, whole.results):
        assert [hit.label for hit in got] == [hit.label for hit in want]
        np.testing.assert_allclose([hit.score for hit in got], [hit.score for hit in want], atol=1e-6)


def test_truncation_keeps_the_start_or_the_end_of_an_input(models):
    engine = Engine.from_pretrained(str(models["qwen3-3"]), device="cpu", tasks={"max_tokens": 8})
    tokenizer = engine.prompts.tokenizer
    text = "one two three four five six seven eight nine ten eleven twelve"
    for direction, keeps in (("right", str.startswith), ("left", str.endswith)):
        (ids,) = TASKS["predict"].encode(engine.context, {"inputs": [text], "truncation_direction": direction})\
            .sequences.tolists()
        kept = tokenizer.decode(ids)
        assert len(ids) <= 8 and keeps(text, kept) and ids == tokenizer(kept)["input_ids"]
        np.testing.assert_allclose([h.score for h in engine.predict([text], truncation_direction=direction)
                                    .results[0]], [h.score for h in engine.predict([kept]).results[0]], atol=1e-6)
    with pytest.raises(ValueError, match=r"input 0 gives a sequence of \d+ tokens; the limit is 8"):
        engine.predict([text], truncate=False)


def test_predict_refuses_what_it_cannot_answer(models, tiny_model_dir):
    engine = Engine.from_pretrained(str(models["qwen3-1"]), device="cpu")
    with pytest.raises(ValueError, match="inputs is empty"):
        engine.predict([])
    with pytest.raises(ValueError, match=r"inputs\[1\] is empty: give every one at least one character"):
        engine.predict(["x", ""])
    with pytest.raises(ValueError, match="unknown truncation_direction 'Left': choose one of right, left"):
        engine.predict(["x"], truncation_direction="Left")
    lm = Engine.from_pretrained(str(tiny_model_dir("qwen3", "causal_lm")), device="cpu")
    with pytest.raises(ValueError, match="has no sequence-classification head, so it has no labels of its own"):
        lm.predict(["x"])
