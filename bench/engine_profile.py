"""Where one forward's time goes: torch's profiler over the engine on a benchmark shape, per mode.

Runs the `bench` preset model (as `engine_bench.py`) on one named batch of `workloads.BATCHES` (a shape of its
table or a batch of its scaling part) in the given modes, profiles `--repeats` forwards of each after a warm-up,
and prints per mode the operators that take the most self CPU time, with the share of the forward spent in each
and the wall time of a forward. The time of a mode against its FLOP bound says how far it is from the bound; this
table says which operators make the gap.

    python bench/engine_profile.py --shape "msmarco-rerank 64 seqs" --modes off full [--out bench/results]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from workloads import BATCHES, make_batch

from radix_core.engine import Engine
from radix_core.tiny_models import PRESETS, make_tiny_model


def profile_mode(engine: Engine, sequences, mode: str, repeats: int, top: int) -> list[str]:
    """Markdown rows: the `top` operators by self CPU time over `repeats` forwards of `mode`."""
    engine.last_hidden_states(sequences, mode=mode)  # warm-up
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            engine.last_hidden_states(sequences, mode=mode)
    wall = (time.perf_counter() - start) / repeats
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    rows = [f"| {mode} | (forward, wall) | {wall * 1000:.0f} | 100% | - |"]
    for e in events[:top]:
        rows.append(f"| {mode} | `{e.key}` | {e.self_cpu_time_total / repeats / 1000:.1f} | "
                    f"{e.self_cpu_time_total / total:.1%} | {e.count // repeats} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(BATCHES), default="msmarco-rerank 64 seqs")
    parser.add_argument("--modes", nargs="+", default=["off", "full"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None, help="also write the table to OUT/engine_profile.md")
    args = parser.parse_args()
    model_dir = make_tiny_model(Path(tempfile.mkdtemp()) / "bench", "qwen3", "base", **PRESETS["bench"])
    engine = Engine.from_pretrained(str(model_dir), device="cpu", prefix_cache_bytes=0)  # compute, not cache hits
    sequences = make_batch(args.shape)
    rows = [f"## {args.shape}\n",
            f"`python bench/engine_profile.py --shape \"{args.shape}\" --modes {' '.join(args.modes)}`; "
            f"{torch.get_num_threads()} threads; self CPU time per forward, mean of {args.repeats}.\n",
            "| mode | operator | ms per forward | share | calls per forward |", "|---|---|---|---|---|"]
    for mode in args.modes:
        rows += profile_mode(engine, sequences, mode, args.repeats, args.top)
    table = "\n".join(rows) + "\n"
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "engine_profile.md").open("a") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
