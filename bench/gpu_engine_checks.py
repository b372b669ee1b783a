"""The GPU check's engine sections: the engine and every task head on CUDA against a CPU float64 engine.

Models are tiny random-weight Qwen3 checkpoints from `radix_core.tiny_models` with the head size of real ones
(head_dim 128, 4 query heads over 2 kv heads, so grouped-query attention), one per head: `causal_lm` (rerank by
the yes/no logits, classify, score, embed) and `seq_cls` (rerank by the score head). Each dtype (fp32, bf16, fp16)
runs with each attention backend it allows, in `off` and `full` mode; `full` over batches with exact duplicates
and prefixes, the `[[7], [7]]` case included, where sequences add no queries.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gpu_report import Check, Report

from radix_core.engine import Engine
from radix_core.tiny_models import make_tiny_model

ENGINE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}  # error / max abs reference
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MODES = ("off", "full")
MODEL = dict(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512, head_dim=128)
QUERY = "which animal guards the radix tree"
DOCUMENTS = ["A trie stores strings by their prefixes.", "Bread rises when yeast ferments.",
             "A trie stores strings by their prefixes.", "Radix trees merge single-child nodes.", "Cats sleep."]
INPUTS = ["the movie was wonderful", "the movie was dull", "the movie was wonderful", "a fine day"]
LABELS = ["positive", "negative", "neutral"]
CONTEXT = "The capital of France is"
CONTINUATIONS = [" Paris", " Lyon", " Paris", " a city in Europe"]


def backends(dtype: torch.dtype, capability: tuple[int, int]) -> list[tuple[str, bool]]:
    """(attention, supported here) for `dtype`: flash-attn 4 runs half precision on compute capability >= 8."""
    if dtype == torch.float32:
        return [("torch", True), ("triton", True)]
    return [("torch", True), ("flash", capability >= (8, 0)), ("triton", True)]


def task_calls(head: str) -> dict[str, Callable[[Engine], np.ndarray]]:
    """Per task of `head`: the call that gives its numbers for the fixed requests, float64, in request order."""
    if head == "seq_cls":
        return {"rerank (score head)": rerank}
    return {
        "rerank (yes/no logits)": rerank,
        "embed": lambda e: e.embed(DOCUMENTS).embeddings.astype(np.float64),
        "classify": lambda e: e.classify(INPUTS, LABELS, prefix="Review sentiment: ").probabilities,
        "score": lambda e: _by_index([(s.index, s.logprob) for s in e.score(CONTEXT, CONTINUATIONS).scores]),
    }


def rerank(engine: Engine) -> np.ndarray:
    return _by_index([(h.index, h.score) for h in engine.rerank(QUERY, DOCUMENTS, raw_scores=True).results])


def _by_index(pairs: list[tuple[int, float]]) -> np.ndarray:
    return np.array([value for _, value in sorted(pairs)], dtype=np.float64)  # (n,)


def hidden_batches(vocab_size: int) -> dict[str, list[list[int]]]:
    """A reranking-like batch (shared template, two queries, passages, an exact duplicate) and item 3's case."""
    rng = np.random.default_rng(2)
    draw = lambda n: rng.integers(0, vocab_size, n).tolist()  # noqa: E731
    template, queries = draw(40), [draw(12), draw(9)]
    sequences = [template + queries[i % 2] + draw(int(rng.integers(5, 60))) for i in range(8)]
    return {"9 seqs, shared prefixes + duplicate": sequences + [list(sequences[3])],
            "[[7], [7]] (duplicate, one query)": [[7], [7]],
            "duplicates + prefixes": [template[:20], template, template[:20], template, template[:1]]}


def engine_checks(report: Report) -> None:
    """Hidden states of each dtype x backend x mode against the float64 CPU engine, on the head_dim 128 model."""
    capability = torch.cuda.get_device_capability()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "base", "qwen3", "base", **MODEL))
        reference = Engine.from_pretrained(model_dir, device="cpu", dtype=torch.float64, radix="off",
                                           attention="torch")
        batches = hidden_batches(reference.arch.vocab_size)
        expected = {name: torch.cat(reference.hidden_states(seqs)) for name, seqs in batches.items()}  # (N, hidden)
        for dtype in DTYPES:
            for attention, supported in backends(dtype, capability):
                for mode in MODES:
                    engine = _engine(report, model_dir, dtype, attention, mode, supported)
                    for name, seqs in batches.items():
                        if engine is not None:
                            report.guarded(f"engine attention={attention} mode={mode}", f"D=128, 4/2 heads, {name}",
                                           _name(dtype), ENGINE_TOLERANCE[dtype],
                                           lambda: _relative(torch.cat(engine.hidden_states(seqs)), expected[name]))


def task_checks(report: Report) -> None:
    """Every task head on CUDA (each dtype x backend, `full` mode) against the float64 CPU engine."""
    capability = torch.cuda.get_device_capability()
    with tempfile.TemporaryDirectory() as tmp:
        for head in ("causal_lm", "seq_cls"):
            model_dir = str(make_tiny_model(Path(tmp) / head, "qwen3", head, **MODEL))
            reference = Engine.from_pretrained(model_dir, device="cpu", dtype=torch.float64, radix="off",
                                               attention="torch")
            expected = {task: want for task, call in task_calls(head).items()
                        if (want := _reference(report, task, call, reference)) is not None}
            for dtype in DTYPES:
                for attention, supported in backends(dtype, capability):
                    engine = _engine(report, model_dir, dtype, attention, "full", supported)
                    for task, want in expected.items():
                        if engine is not None:
                            call = task_calls(head)[task]
                            report.guarded(f"task {task} attention={attention}", f"{head}, D=128, duplicates",
                                           _name(dtype), ENGINE_TOLERANCE[dtype],
                                           lambda: _relative_np(call(engine), want))


def _reference(report: Report, task: str, call, reference: Engine) -> np.ndarray | None:
    """The float64 CPU result, or None after recording the task's failure."""
    try:
        return call(reference)
    except Exception as err:
        report.check(Check(f"task {task}", "CPU float64 reference", "fp64", None, 0.0,
                           f"{type(err).__name__}: {str(err)[:100]}"))
        return None


def _engine(report: Report, model_dir: str, dtype, attention: str, mode: str, supported: bool) -> Engine | None:
    """The CUDA engine, or None after recording why it could not be built."""
    try:
        return Engine.from_pretrained(model_dir, device="cuda", dtype=dtype, attention=attention, radix=mode)
    except Exception as err:
        report.check(Check(f"engine attention={attention} mode={mode}", "load", _name(dtype), None,
                           ENGINE_TOLERANCE[dtype], f"{type(err).__name__}: {str(err)[:100]}", supported))
        return None


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got - expected| / max |expected|, in float64 on the CPU."""
    return ((got.cpu().double() - expected).abs().max() / expected.abs().max()).item()


def _relative_np(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, dtype=np.float64) - expected).max() / max(np.abs(expected).max(), 1e-12))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("float", "fp").replace("bfp", "bf")
