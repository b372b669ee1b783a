"""The last layer on the rows a batch reads, against finishing every row: the engine in-process, side by side.

A scoring batch reads few final states (a rerank's and a last-token embedding's last row per sequence), so
`Engine.run_jobs` runs the last layer's work after attention (output projection, MLP, final norm) on those rows
only (`radix_core.forward.select_final_rows`). This runs the workloads of `bench/peer_vllm.py` (MS MARCO-shaped
8- and 256-document reranks, 16-text embeddings with and without a shared instruction; the same drawing, seed 0)
on the `bench` preset (Qwen3, hidden 512, 8 layers, random weights) in this process, each workload its clients'
requests a batch, two ways:

* **rows read**: `Engine.run_jobs`, as the engine replica runs every batch;
* **every row**: the same batches through `Engine.run` without `reads`, then `finish_jobs`: what the engine did
  before.

The prefix cache is off (every round repeats the same batches, which a cache would answer from memory), radix
`auto` warmed up as the replica warms it. Timings are `timing.interleaved_timings` (one warm-up each, rounds in
rotating order); the two answers must agree within `--tolerance`. Writes `final_rows.md` to `--out`.

    python bench/final_rows.py --rounds 5
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from engine_side_by_side import bench_model, peer_batches, table_row, values, write_report
from timing import interleaved_timings

from radix_core.engine import Engine
from radix_core.finish import finish_jobs, read_tokens
from radix_core.forward_result import ForwardResult
from radix_core.tokens import TokenSequences


def finished(engine: Engine, jobs: list, rows_read: bool) -> tuple[ForwardResult, list]:
    """`run_jobs` laid open: the jobs' forward (finishing the rows they read, or every row) and their partial
    results."""
    prepared = engine.prepare(TokenSequences.concat([job.sequences for job in jobs]))
    result = engine.run(prepared, reads=read_tokens(jobs, prepared.cu_seqlens) if rows_read else None)
    with engine.numerics():
        return result, finish_jobs(result, jobs)


def every_row(engine: Engine, jobs: list) -> list:
    """`run_jobs` finishing every row: the forward without `reads`, then the jobs' finish."""
    return finished(engine, jobs, False)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per candidate and workload")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest |difference| of the two answers")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        engine = Engine.from_pretrained(bench_model(Path(work)), device="cpu", radix="auto", prefix_cache_bytes=0)
        engine.warm_up()
        rows = []
        for workload, jobs, batches in peer_batches(engine):
            runs = [finished(engine, batch, True) for batch in batches]  # (result, partials) per batch
            read = [p for _, partials in runs for p in partials]
            every = [p for batch in batches for p in every_row(engine, batch)]
            diff = max(float(np.abs(values(a) - values(b)).max()) for a, b in zip(read, every))
            if diff > args.tolerance:
                raise SystemExit(f"{workload.name}: the two ways disagree by {diff:.3g} (tolerance {args.tolerance})")
            share = sum(result.num_computed if result.plan.final_rows is None else result.plan.final_rows.shape[0]
                        for result, _ in runs) / sum(result.num_computed for result, _ in runs)
            timings = interleaved_timings({
                "rows read": lambda: [engine.run_jobs(batch) for batch in batches],
                "every row": lambda: [every_row(engine, batch) for batch in batches]}, args.rounds)
            rows.append(table_row(workload, jobs, batches, [
                f"{share:.3f}", str(timings["every row"]), str(timings["rows read"]),
                f"**{timings['every row'].median / timings['rows read'].median:.2f}x**", f"{diff:.1e}"]))
            print(rows[-1], flush=True)
    write_report(args.out, "final_rows", "The last layer on the rows a batch reads", args.rounds,
                 ["rows the last layer finishes / computed rows", "every row, s (min-max)", "rows read, s (min-max)",
                  "speed-up", "max \\|answer diff\\|"], rows)


if __name__ == "__main__":
    main()
