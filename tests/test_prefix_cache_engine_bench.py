"""The engine-level prefix cache benchmark (`bench/prefix_cache_engine.py`): its served few-shot stream is the
batches the engine replica runs on the served stream, and the cache admits from them what it admits served (each
request's prompt, never an input its labels share)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from prefix_cache_engine import run_stream, served_few_shot  # noqa: E402  (bench/ is not a package)


def test_a_served_few_shot_batch_is_two_requests_of_labelled_inputs_behind_their_prompts():
    stream = served_few_shot(np.random.default_rng(0), 3)
    requests_seen = []
    for batch, origins in stream:
        assert len(batch) == 16 and origins.requests.shape == origins.shared.shape == (16,)
        assert (origins.shared == 1024).all()
        for request in np.unique(origins.requests):
            sequences = [batch[i] for i in np.flatnonzero(origins.requests == request)]
            assert len(sequences) == 8 and len({tuple(s[:1024]) for s in sequences}) == 1  # one prompt
            inputs = [tuple(s[1024:-2]) for s in sequences]
            assert len(set(inputs)) == 4 and all(inputs.count(i) == 2 for i in set(inputs))  # two labels each
            assert {tuple(s[-2:]) for s in sequences} == {tuple(s[-2:]) for s in batch}  # the same two labels
        requests_seen += np.unique(origins.requests).tolist()
    assert len(set(requests_seen)) == len(requests_seen) == 6  # no request id twice


def test_the_served_stream_admits_each_prompt_once_and_no_input(tiny_model_dir):
    from radix_core.engine import Engine

    path = tiny_model_dir("qwen3", "base")
    cached, plain = Engine.from_pretrained(path, device="cpu"), Engine.from_pretrained(path, device="cpu",
                                                                                     prefix_cache_bytes=0)
    stream = served_few_shot(np.random.default_rng(1), 4)
    prompts = {tuple(s[:1024]) for batch, _ in stream for s in batch}
    row = run_stream(cached, plain, stream)
    assert cached.prefix_cache.stats().inserted_tokens == 1024 * len(prompts)
    assert row["N'/N cache"] < row["N'/N no cache"]
    assert row["speed-up / row ratio"] == pytest.approx(row["speed-up"] * row["N'/N cache"] / row["N'/N no cache"])
