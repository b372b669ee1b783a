"""The served prefix cache benchmark's streams (`bench/prefix_cache_bench.py`): a few-shot stream draws its
requests' prompts from as many prompts as it is given, each request behind one of them, and a stream without reuse
sends a new prompt every time."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from prefix_cache_bench import FEW_PROMPTS, PROMPTS, few_shot  # noqa: E402  (bench/ is not a package)


def count_words(text: str) -> int:
    return len(text.split())


def test_a_few_shot_stream_sends_its_requests_behind_as_many_prompts_as_it_is_given():
    for prompts in (FEW_PROMPTS, PROMPTS):
        stream = few_shot(np.random.default_rng(0), count_words, 64, prompts)
        sent = {}
        for task, request, which in stream:
            assert task == "classify" and len(request["inputs"]) == 4
            assert sent.setdefault(which, request["prefix"]) == request["prefix"]  # one text per prompt number
        assert set(sent) <= set(range(prompts)) and len(set(sent.values())) == len(sent)
        assert len(sent) > prompts // 2  # 64 draws reach most of them


def test_a_stream_without_reuse_sends_a_new_prompt_every_time():
    stream = few_shot(np.random.default_rng(0), count_words, 16, unique=True)
    assert len({request["prefix"] for _, request, _ in stream}) == 16
    assert all(which is None for _, _, which in stream)
