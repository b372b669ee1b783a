"""Batch invariance (issue 32): what changes a sequence's bits today, and what the batch-invariant mode costs.

* `--part variation`: one MS MARCO-shaped sequence (template + query + passage + suffix) run alone, among its
  query's 8 passages, among the whole 64-sequence batch, and after 7 sequences of another query; each with the
  prefix cache off and on (on: the batch runs three times and the third run, which reads the cached prefixes, is
  kept; the 64-sequence batch runs with the cache off only, to keep the run short); in each radix mode (off, mlp,
  full); float32 and bfloat16. Per engine setting: how many distinct bit patterns the sequence's final hidden
  state (what every head and pooling reads) takes over those 21 runs, and their largest difference. Settings:
  the default engine; the default engine with its matmuls in fixed row tiles (`radix_core.invariant_matmul`) but
  the default attention, which isolates what attention changes; and `batch_invariant=True`.
* `--part cost`: the default engine (radix auto, attention auto) against `batch_invariant=True` (radix auto) on the
  engine bench's shapes (MS MARCO-shaped rerank, synthetic shared prefix 32 x (512 + 64), no sharing), float32 and
  bfloat16, without the prefix cache, on one torch thread, timed by CPU time (`time.process_time`: other load on a
  shared machine adds less to it than to wall time), both engines side by side in rounds whose order rotates
  (`timing.interleaved_timings`).

Model: the `bench` preset (Qwen3, hidden 512, 8 layers), random weights.

    PYTHONPATH=.:bench python bench/batch_invariance.py --part variation [--out bench/results]
    PYTHONPATH=.:bench python bench/batch_invariance.py --part cost --threads 1 --repeats 3 [--out bench/results]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from timing import interleaved_timings
from workloads import make_batch

from radix_core.engine import Engine
from radix_core.invariant_matmul import RowTiledLinear
from radix_core.tiny_models import PRESETS, make_tiny_model

DTYPES = ("float32", "bfloat16")
MODES = ("off", "mlp", "full")
COST_SHAPES = ("msmarco-rerank 64 seqs", "synthetic 32x(512+64)", "no sharing 32x(128..384)")
SETTINGS = ("default", "tiled matmuls, default attention", "batch_invariant")


def companions() -> dict[str, tuple[list[list[int]], int]]:
    """Batches holding the target sequence, and where it is in each."""
    batch = make_batch("msmarco-rerank 64 seqs")
    target = batch[0]
    return {"alone": ([target], 0), "its query's 8": (batch[:8], 0), "all 64": (batch, 0),
            "after 7 of another query": (batch[56:63] + [target], 7)}


def target_state(engine: Engine, sequences: list[list[int]], where: int, mode: str, cached: bool,
                 tiled: bool) -> torch.Tensor:
    """The target's final hidden state at its last token (hidden,)."""
    context = RowTiledLinear() if tiled else contextlib.nullcontext()
    if engine.prefix_cache is not None:
        engine.prefix_cache.clear()
    with context:
        prepared = engine.prepare(sequences, mode)
        for _ in range(2 if cached else 0):  # the first sighting leaves a ghost, the second admits
            engine.run(prepared)
        result = engine.run(prepared)
    assert not cached or result.cached_lengths[where] > 0, "the second run read nothing from the cache"
    return result.hidden[int(result.rows(np.array([where]), np.array([-1]))[0])].clone()


def variation(model_dir: str) -> list[str]:
    lines = ["| dtype | setting | distinct final states over the 21 runs | largest difference |", "|---|---|---|---|"]
    for dtype in DTYPES:
        engines = {"default": Engine.from_pretrained(model_dir, device="cpu", dtype=dtype, radix="off"),
                   "batch_invariant": Engine.from_pretrained(model_dir, device="cpu", dtype=dtype, radix="off",
                                                             batch_invariant=True)}
        for setting in SETTINGS:
            engine = engines["batch_invariant" if setting == "batch_invariant" else "default"]
            states = [target_state(engine, seqs, where, mode, cached, setting.startswith("tiled"))
                      for name, (seqs, where) in companions().items() for mode in MODES
                      for cached in ((False,) if name == "all 64" else (False, True))]
            distinct = {s.float().numpy().tobytes() for s in states}
            spread = max((s.float() - states[0].float()).abs().max().item() for s in states)
            lines.append(f"| {dtype} | {setting} | {len(distinct)} | {spread:.2e} |")
            print(lines[-1], flush=True)
    return lines


def cost(model_dir: str, repeats: int) -> list[str]:
    lines = ["| dtype | shape | default s | batch_invariant s | batch_invariant / default |", "|---|---|---|---|---|"]
    for dtype in DTYPES:
        engines = {name: Engine.from_pretrained(model_dir, device="cpu", dtype=dtype, prefix_cache_bytes=0,
                                                batch_invariant=name == "batch_invariant")
                   for name in ("default", "batch_invariant")}
        for engine in engines.values():
            engine.warm_up()
        for shape in COST_SHAPES:
            batch = make_batch(shape)
            runners = {name: (lambda e=e: e.last_hidden_states(batch)) for name, e in engines.items()}
            times = interleaved_timings(runners, repeats, clock=time.process_time)
            ratio = times["batch_invariant"].median / times["default"].median
            lines.append(f"| {dtype} | {shape} | {times['default']} | {times['batch_invariant']} | {ratio:.2f} |")
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("variation", "cost"), required=True)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the table to OUT/batch_invariance_PART.md")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "bench", "qwen3", "causal_lm", **PRESETS["bench"]))
        lines = variation(model_dir) if args.part == "variation" else cost(model_dir, args.repeats)
    header = (f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); command: `PYTHONPATH=.:bench python "
              f"bench/batch_invariance.py --part {args.part}"
              + (f" --threads {args.threads}" if args.threads else "")
              + (f" --repeats {args.repeats}" if args.part == "cost" else "") + "`")
    print(header)
    if args.out:
        (args.out / f"batch_invariance_{args.part}.md").write_text("\n".join([header, "", *lines]) + "\n")


if __name__ == "__main__":
    main()
