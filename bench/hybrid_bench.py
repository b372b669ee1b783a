"""Hybrid models (issue 33): a Qwen3.5-shaped model (Gated DeltaNet + gated attention, 3:1) in every radix mode.

Model: the `bench` preset of `radix_core.tiny_models` as `qwen3_5`: hidden 512, 8 layers (layers 4 and 8 gated
attention, the other 6 Gated DeltaNet), 8 heads, 4 KV heads, head dim 64 (a quarter rotated), DeltaNet 4 key heads
and 8 value heads of 64, intermediate 1536, random weights, float32, on the CPU. Workloads from `workloads.py`: the
MS MARCO-shaped rerank (64 sequences: 8 queries x 8 passages behind one template) and the embedding batch (64 texts
of 50-200 tokens behind one 20-token instruction), without the prefix cache; and the few-shot stream of
`prefix_cache_engine.py` (batches of 4 inputs behind one of 16 prompts of 1,024 tokens) through an engine with the
cache at its default budget and one without, alternating batch by batch.

Per workload and mode: the forward's time (`timing.interleaved_timings`: median (min-max) over rounds, every mode
in one process, the order rotating), its speed-up over `off`, and the bound N/N' (original tokens over the compact
rows the trie leaves: the speed-up if every cost followed the rows). Then the share of the forward the recurrent
layers take (their `gated_delta_block` calls timed inside the same forwards, synchronously on the CPU) in `off` and
in `full`, and how much of the recurrent time the trie saves. For the few-shot stream: seconds with the cache and
without, rows computed over tokens (N'/N) each way, the hit ratio.

    PYTHONPATH=.:bench python bench/hybrid_bench.py --repeats 5 [--threads 1] [--out bench/results]

`--threads`: torch's CPU threads. On a machine whose cores other processes keep busy, the rule's batched
`torch.linalg.solve_triangular` (one small solve per chain, head and 64-row chunk) waits at an OpenMP barrier per
solve: 3.5 s for 384 solves of 64 x 64 with 2 threads against 8 ms with 1, measured on the 2 shared cores here.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from prefix_cache_engine import few_shot, run_stream
from timing import Timing, interleaved_timings
from workloads import embedding_instruction, msmarco_ids

from radix_core import hybrid_layers
from radix_core.engine import Engine
from radix_core.index import build_radix_index, flatten_sequences
from radix_core.tiny_models import PRESETS, make_tiny_model

MODES = ("off", "mlp", "full", "auto")
FEW_SHOT_BATCHES = 24
WORKLOADS: dict[str, Callable[[np.random.Generator], list[list[int]]]] = {
    "msmarco-rerank 64 seqs": msmarco_ids,
    "embed 64x(20+50..200)": embedding_instruction,
}


class RecurrentClock:
    """Seconds spent in the Gated DeltaNet layers while installed (`hybrid_layers.gated_delta_block` wrapped)."""

    def __init__(self):
        self.seconds = 0.0
        self._inner = hybrid_layers.gated_delta_block

    def __enter__(self) -> RecurrentClock:
        def timed(*args):
            start = time.perf_counter()
            out = self._inner(*args)
            self.seconds += time.perf_counter() - start
            return out

        hybrid_layers.gated_delta_block = timed
        return self

    def __exit__(self, *exc) -> None:
        hybrid_layers.gated_delta_block = self._inner


def bound(batch: list[list[int]]) -> float:
    """N / N': the speed-up if every cost followed the computed rows."""
    index = build_radix_index(*flatten_sequences(batch))
    return index.num_tokens / index.num_compact


def recurrent_share(engine: Engine, batch: list[list[int]], mode: str, repeats: int) -> tuple[float, float]:
    """(least forward seconds, its recurrent layers' seconds) over `repeats` forwards of `batch` in `mode`."""
    best = (float("inf"), 0.0)
    for _ in range(repeats):
        with RecurrentClock() as clock:
            start = time.perf_counter()
            engine.forward(batch, mode)
            total = time.perf_counter() - start
        best = min(best, (total, clock.seconds))
    return best


def run(repeats: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "qwen3_5-bench", "qwen3_5", "base", **PRESETS["bench"])
        engine = Engine.from_pretrained(str(model), device="cpu", dtype="float32", radix="auto", prefix_cache_bytes=0)
        cached = Engine.from_pretrained(str(model), device="cpu", dtype="float32", radix="auto")
    for warmed in (engine, cached):
        warmed.warm_up()  # calibrates the cost model auto chooses by
    lines = ["| workload | N / N' | " + " | ".join(f"{m} s" for m in MODES) + " | mlp x | full x | auto x (ran) |",
             "|---|---|" + "---|" * len(MODES) + "---|---|---|"]
    shares = ["| workload | mode | forward s | recurrent s | recurrent share |", "|---|---|---|---|---|"]
    saved = []
    for name, make in WORKLOADS.items():
        batch = make(np.random.default_rng(0))
        with torch.inference_mode():
            times: dict[str, Timing] = interleaved_timings(
                {mode: (lambda mode=mode: engine.forward(batch, mode)) for mode in MODES}, repeats)
            ran = engine.prepare(batch, "auto").mode
            split = {mode: recurrent_share(engine, batch, mode, repeats) for mode in ("off", "full")}
        off = times["off"].median
        lines.append(f"| {name} | {bound(batch):.2f} | " + " | ".join(str(times[m]) for m in MODES)
                     + f" | {off / times['mlp'].median:.2f} | {off / times['full'].median:.2f} | "
                       f"{off / times['auto'].median:.2f} ({ran}) |")
        for mode, (total, recurrent) in split.items():
            shares.append(f"| {name} | {mode} | {total:.3f} | {recurrent:.3f} | {recurrent / total:.0%} |")
        saved.append(f"* {name}: the recurrent layers take {split['off'][1]:.3f} s in `off` and "
                     f"{split['full'][1]:.3f} s in `full` ({split['off'][1] / split['full'][1]:.2f}x less).")
    with torch.inference_mode():
        stream = run_stream(cached, engine, few_shot(np.random.default_rng(0), FEW_SHOT_BATCHES))
    plain_rows, cached_rows = stream["N'/N no cache"], stream["N'/N cache"]
    few = ["| stream | seconds cache | seconds no cache | speed-up | N'/N no cache | N'/N cache | hit ratio |",
           "|---|---|---|---|---|---|---|",
           f"| few-shot 16x1024 + 4x(20..60), {FEW_SHOT_BATCHES} batches | {stream['seconds cache']:.2f} | "
           f"{stream['seconds no cache']:.2f} | {stream['speed-up']:.2f} | {plain_rows:.3f} | {cached_rows:.3f} | "
           f"{stream['hit ratio']:.3f} |"]
    return "\n".join(["## Modes", "", *lines, "", "## The recurrent layers' share of the forward", "", *shares, "",
                      *saved, "", "## Few-shot stream, prefix cache vs none", "", *few, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per mode (default 5)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch CPU threads (default: torch's, here %(default)s)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    report = run(args.repeats)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hybrid_bench.md").write_text(f"# Hybrid models (Qwen3.5-shaped): bench/hybrid_bench.py\n\n"
                                              f"`PYTHONPATH=.:bench python bench/hybrid_bench.py --repeats "
                                              f"{args.repeats} --threads {args.threads}`\n\n{report}")


if __name__ == "__main__":
    main()
