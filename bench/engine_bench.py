"""Engine modes side by side on CPU (issue 15): shapes, auto's choice, what `prepare` costs, prefix sweep, sequences
per prefix.

The workloads of `workloads.py` (docs/ARCHITECTURE.md section 7, the paper's long shared prefix), which mode `auto`
picks on each and whether it was the fastest (issue 23), what `prepare` costs, and how the cost grows with the
number of sequences sharing one prefix.

Model: Qwen3 architecture, hidden 512, 8 layers, 8 heads, 4 KV heads, head dim 64, intermediate 1536, random
weights, float32 (the `bench` preset of `radix_core.tiny_models`). Every timing comes from
`timing.interleaved_timings`: the candidates of one row group run in one process, one warm-up each, then rounds
whose order rotates; median (min-max). The engine runs without the prefix cache (the rounds repeat one batch) and
warms up first, which calibrates the cost model `auto` chooses by (`radix_core.mode_calibration`). Four parts, each
can be skipped (`--skip`, as can the peak memory cells):

* shapes: per shape every mode, its speed-up over `off`, the FLOP bound of that speed-up (position-wise and
  attention FLOPs of both layouts), achieved / bound, the time of `engine.prepare` (checks, index, mode choice:
  numpy on the host) and the peak memory growth of one forward (RSS high-water mark over the RSS before it, in a
  fresh subprocess per cell; `--skip memory` leaves it out). Plain transformers on a padded batch
  (`padded_baseline.padded_last_hidden`) is timed as the reference users run today, except on the long shape
  (`Shape.long`). Then per shape auto's choice: the time each mode was predicted to take (the calibrated cost
  model, and the mode the static FLOP-count model would pick), the mode auto picked, the fastest measured (least
  time over the rounds), and the picked mode's time over the fastest's. `--skip padded` leaves the reference out.
* no-sharing: `off` against `auto` alone on the batch without sharing (auto runs off there), more rounds: what
  auto costs where it cannot help.
* prefix sweep: speed-up of mlp and full over off against the shared-prefix length (batch 32, suffix 64), plotted
  to `engine_speedup.png`.
* scaling: 8, 32 and 128 sequences sharing one 1024-token prefix, 64 own tokens each, in full and mlp: the time per
  added sequence against the time per sequence of the 64-token suffixes alone, plotted to `engine_scaling.png`.

    python bench/engine_bench.py --repeats 5 --long-repeats 3 [--sweep-repeats 1] [--out bench/results]
    python bench/engine_bench.py --shapes "no sharing 32x(128..384)" --skip memory prefix-sweep scaling

A whole run takes about half an hour on 2 cores: shapes 20 minutes (10 of them the long shape, whose `off` forward
takes over a minute), prefix sweep 3, scaling 5.
Run from the repository root with `PYTHONPATH=.:bench`, or from bench/ with `PYTHONPATH=..:.`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from padded_baseline import padded_last_hidden
from timing import Timing, interleaved_timings
from tqdm import tqdm
from workloads import (
    SCALING_COUNTS,
    SCALING_PREFIX,
    SCALING_SUFFIX,
    SHAPES,
    make_batch,
    scaling_name,
    suffixes_name,
    synthetic_prefix,
)

from radix_core.cascade import cascade_plan
from radix_core.engine import Engine
from radix_core.index import build_radix_index, flatten_sequences
from radix_core.mode_calibration import static_costs
from radix_core.mode_cost import ModeCosts, ModelShape, ModeWork, mode_works
from radix_core.tiny_models import PRESETS, make_tiny_model

MODES = ("off", "mlp", "full", "auto")
PADDED = "transformers (padded)"
PARTS = ("shapes", "memory", "padded", "no-sharing", "prefix-sweep", "scaling")
NO_SHARING = "no sharing 32x(128..384)"
PREPARE_REPEATS = 20  # prepare takes milliseconds: more rounds for a steady median cost nothing
SWEEP_PREFIXES = (0, 64, 128, 256, 512, 768, 1024)

def work(sequences: Sequence[Sequence[int]], mode: str) -> ModeWork:
    """The work of one forward in `mode` ("off", "mlp" or "full"): computed rows, visible query-key pairs (off and
    mlp attend per sequence, L(L+1)/2 pairs; full from each compact row at position p to its path, p + 1 keys),
    rows scattered (mlp) and merged (full), as `auto`'s cost model counts them (`radix_core.mode_cost`)."""
    index = build_radix_index(*flatten_sequences(sequences))
    return mode_works(index, cascade_plan(index))[mode]


def marginal_costs(counts: Sequence[int], totals: Sequence[float]) -> list[float | None]:
    """Cost per added sequence between consecutive counts, (t(n2) - t(n1)) / (n2 - n1); None for the first."""
    steps = zip(counts, counts[1:], totals, totals[1:])
    return [None] + [(t2 - t1) / (n2 - n1) for n1, n2, t1, t2 in steps]


def peak_memory_mb(model_dir: Path, batch: str, mode: str) -> float:
    """Peak RSS growth of one forward of `BATCHES[batch]`, in a fresh process so earlier runs do not hide it."""
    out = subprocess.run([sys.executable, __file__, "--memory-cell", str(model_dir), batch, mode],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]


def memory_cell(model_dir: str, batch: str, mode: str) -> None:
    sequences = make_batch(batch)
    if mode == "transformers":
        from transformers import AutoModel

        model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
        run = lambda: padded_last_hidden(model, sequences)  # noqa: E731
    else:
        engine = Engine.from_pretrained(model_dir, device="cpu", prefix_cache_bytes=0)
        run = lambda: engine.last_hidden_states(sequences, mode=mode)  # noqa: E731
    before = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current RSS
    run()
    print(json.dumps({"peak_mb": (_status_kb("VmHWM") - before) / 1024}))


def _status_kb(field: str) -> int:
    """A `/proc/self/status` memory figure in kB (Linux)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


@dataclass
class Bench:
    """What the parts share: the engine, the padded reference model, the model's size, where its files are."""

    engine: Engine
    reference: Any  # transformers AutoModel of the same checkpoint
    shape: ModelShape
    model_dir: Path
    memory: bool  # measure peak memory, one subprocess per cell
    padded: bool  # time the padded transformers reference in the shapes table

    def forward(self, sequences, mode: str) -> Callable[[], torch.Tensor]:
        return lambda: self.engine.last_hidden_states(sequences, mode=mode)

    def peak_mb(self, batch: str, mode: str) -> str:
        return f"{peak_memory_mb(self.model_dir, batch, mode):.0f}" if self.memory else "-"


@dataclass
class ShapeRun:
    """One shape's timings, the mode auto chose and the work of each mode, for the table of auto's choices."""

    name: str
    times: dict[str, Timing]
    chosen: str
    works: dict[str, ModeWork]


def shape_rows(bench: Bench, name: str, repeats: int) -> tuple[list[str], ShapeRun]:
    """The table rows of one shape: every mode (and the padded reference unless long), rotated timings."""
    shape, sequences = SHAPES[name], make_batch(name)
    runners = {m: bench.forward(sequences, m) for m in MODES}
    if bench.padded and not shape.long:
        runners[PADDED] = lambda: padded_last_hidden(bench.reference, sequences)
    times = interleaved_timings(runners, repeats)
    prepare = interleaved_timings({m: (lambda m=m: bench.engine.prepare(sequences, m)) for m in MODES},
                                  PREPARE_REPEATS)
    chosen = bench.engine.prepare(sequences, "auto").mode
    counts = {m: work(sequences, m) for m in ("off", "mlp", "full")}
    flops = {m: bench.shape.flops(c) for m, c in counts.items()}
    n_tokens, n_compact = counts["off"].rows, counts["full"].rows
    label = f"{name} ¹" if shape.long else name
    rows = []
    for runner, timing in times.items():
        mode = chosen if runner == "auto" else runner if runner in MODES else "off"
        speedup, bound = times["off"].median / timing.median, flops["off"] / flops[mode]
        prep = (f"{prepare[runner].median * 1000:.2f} ({100 * prepare[runner].median / timing.median:.2g}%)"
                if runner in MODES else "-")
        memory = bench.peak_mb(name, mode if runner in MODES else "transformers")  # auto: the mode it chose here
        rows.append(f"| {label} | {n_tokens} | {n_compact / n_tokens:.3f} | "
                    f"{f'auto → {chosen}' if runner == 'auto' else runner} | {timing} | {speedup:.2f}x | "
                    f"{bound:.2f}x | {speedup / bound:.2f} | {prep} | {memory} |")
        tqdm.write(rows[-1])
    return rows, ShapeRun(name, times, chosen, counts)


def shapes_section(bench: Bench, names: Sequence[str], repeats: int, long_repeats: int) -> tuple[str, list[ShapeRun]]:
    rows = ["| shape | N | N'/N | mode | time s, median (min-max) | speed-up vs off | FLOP bound | achieved/bound "
            "| prepare ms (share of forward) | peak MB |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    runs = []
    for name in tqdm(names, desc="shapes", unit="shape"):
        shape_table, run = shape_rows(bench, name, long_repeats if SHAPES[name].long else repeats)
        rows += shape_table
        runs.append(run)
    text = ("## Shapes\n\nHow to read: per shape every mode timed side by side; speed-up vs off over its FLOP bound "
            "says how much of the saved work turned into saved time (`auto → x`: the mode auto chose, its bound "
            "that mode's). prepare is `engine.prepare` alone (flatten, checks, index, mode choice), median of "
            f"{PREPARE_REPEATS}, and its share of that mode's forward, which includes it; auto on the no-sharing "
            "shape runs off, so its prepare is its only extra work. Peak MB: RSS growth of one forward in a "
            "fresh process (`-`: `--skip memory`).\n\n" + "\n".join(rows) + "\n")
    long = [name for name in names if SHAPES[name].long]
    if long:
        text += (f"\n¹ {', '.join(long)}: median of {long_repeats} rounds (`--long-repeats`; its `off` forward takes "
                 f"over a minute on 2 cores). No {PADDED} row: its peak memory grows with batch x 2304² (530 MB for 4 "
                 "of these sequences in a development run, so about 4 GB for 32) and each forward takes about as "
                 "long as off's, several more minutes of rounds.\n")
    return text, runs


def auto_section(costs: ModeCosts, static: ModeCosts, runs: Sequence[ShapeRun]) -> str:
    """Per shape: each mode's time predicted under `costs` and measured, auto's pick, the fastest measured, and the
    pick under the `static` model."""
    rows = ["| shape | predicted s: off / mlp / full | measured s, least: off / mlp / full | auto picked | "
            "fastest measured | picked / fastest | static model's pick |", "|---|---|---|---|---|---|---|"]
    for run in runs:
        least = {mode: run.times[mode].low for mode in ("off", "mlp", "full")}
        fastest = fastest_mode(run)
        predicted = " / ".join(f"{costs.predict(w):.3f}" for w in run.works.values())
        measured = " / ".join(f"{t:.3f}" for t in least.values())
        mark = "" if run.chosen == fastest else " ²"
        rows.append(f"| {run.name} | {predicted} | {measured} | {run.chosen}{mark} | {fastest} | "
                    f"{least[run.chosen] / least[fastest]:.2f} | {static.choose(run.works)} |")
    missed = [missed_note(run) for run in runs if run.chosen != fastest_mode(run)]
    return (f"## auto's choice\n\nHow to read: auto picks the mode of least predicted time under the cost model the "
            f"engine's warm-up measured ({costs.source}: seconds per row {costs.rows:.3g}, per pair {costs.pairs:.3g}, "
            f"per scattered row {costs.scattered:.3g}, per merged row {costs.merged:.3g}, per query past mlp's rows "
            f"{costs.queries:.3g}; `radix_core/mode_cost.py`). "
            "Measured: the least time of each mode over the shapes table's rounds (other load on the machine only "
            "adds time, so the least is the round it disturbed least); picked / fastest: the picked mode's over the "
            "fastest's. Static model: the mode an engine that never warmed up picks (FLOP counts). Picked the "
            f"fastest on {len(runs) - len(missed)} of {len(runs)} shapes.\n\n" + "\n".join(rows) + "\n"
            + "".join(f"\n² {note}" for note in missed) + ("\n" if missed else ""))


def fastest_mode(run: ShapeRun) -> str:
    """The mode of least measured time (the least of its rounds)."""
    return min(("off", "mlp", "full"), key=lambda mode: run.times[mode].low)


def missed_note(run: ShapeRun) -> str:
    """Where auto's pick was not the fastest measured: by how much, and how their medians compare."""
    picked, fastest = run.times[run.chosen], run.times[fastest_mode(run)]
    medians = "also" if picked.median > fastest.median else "but not"
    return (f"{run.name}: {run.chosen} {picked} against {fastest_mode(run)} {fastest} "
            f"({picked.low / fastest.low:.2f}x the least time; {medians} by median).")


def no_sharing_section(bench: Bench, repeats: int) -> str:
    """`auto` against `off` on the batch without sharing, the two alone: what auto costs where it cannot help."""
    sequences = make_batch(NO_SHARING)
    assert bench.engine.prepare(sequences, "auto").mode == "off"
    times = interleaved_timings({mode: partial(bench.engine.last_hidden_states, sequences, mode=mode)
                                 for mode in ("off", "auto")}, repeats)
    prepare = interleaved_timings({"auto": partial(bench.engine.prepare, sequences, "auto")}, PREPARE_REPEATS)
    ratio = times["off"].median / times["auto"].median
    return (f"## auto without sharing\n\nHow to read: {NO_SHARING}, `off` and `auto` (which runs `off`) alone, "
            f"{repeats} rounds alternating which goes first; auto's only extra work is `prepare`'s index build and "
            f"mode choice.\n\n| mode | time s, median (min-max) | speed-up vs off |\n|---|---|---|\n"
            f"| off | {times['off']} | 1.00x |\n| auto → off | {times['auto']} | {ratio:.2f}x |\n\n"
            f"auto's prepare: {prepare['auto'].median * 1000:.2f} ms, "
            f"{prepare['auto'].median / times['auto'].median:.3%} of its forward.\n")


def prefix_sweep(bench: Bench, repeats: int) -> dict[str, list[float]]:
    """Speed-up over `off` against the shared-prefix length (batch 32, suffix 64)."""
    speedups = {"mlp": [], "full": []}
    for prefix in tqdm(SWEEP_PREFIXES, desc="prefix sweep", unit="length"):
        sequences = synthetic_prefix(np.random.default_rng(1), prefix=prefix)
        times = interleaved_timings({m: bench.forward(sequences, m) for m in ("off", "mlp", "full")}, repeats)
        for mode in speedups:
            speedups[mode].append(times["off"].median / times[mode].median)
        tqdm.write(f"prefix {prefix}: " + ", ".join(f"{m} {v[-1]:.2f}x" for m, v in speedups.items()))
    return speedups


def prefix_sweep_section(speedups: dict[str, list[float]], repeats: int) -> str:
    rows = ["| shared prefix | " + " | ".join(f"{m} speed-up" for m in speedups) + " |",
            "|---|" + "---|" * len(speedups)]
    rows += [f"| {p} | " + " | ".join(f"{speedups[m][i]:.2f}x" for m in speedups) + " |"
             for i, p in enumerate(SWEEP_PREFIXES)]
    return (f"## Shared-prefix sweep\n\nHow to read: 32 sequences of one shared prefix plus 64 own tokens; speed-up "
            f"of each mode over off at each prefix length (median of {repeats}).\n\n" + "\n".join(rows)
            + "\n\n![speed-up](engine_speedup.png)\n")


def scaling(bench: Bench, repeats: int) -> dict[str, list[Timing]]:
    """full and mlp on `n` sequences sharing one prefix, and the `n` suffixes alone in off, per count."""
    times: dict[str, list[Timing]] = {"full": [], "mlp": [], "suffixes alone (off)": []}
    for n in tqdm(SCALING_COUNTS, desc="scaling", unit="count"):
        shared, alone = make_batch(scaling_name(n)), make_batch(suffixes_name(n))
        round_ = interleaved_timings({"full": bench.forward(shared, "full"), "mlp": bench.forward(shared, "mlp"),
                                      "suffixes alone (off)": bench.forward(alone, "off")}, repeats)
        for name, timing in round_.items():
            times[name].append(timing)
        tqdm.write(f"{n} sequences: " + ", ".join(f"{k} {v}" for k, v in round_.items()))
    return times


def scaling_section(bench: Bench, times: dict[str, list[Timing]], repeats: int) -> str:
    full = [t.median for t in times["full"]]
    alone = [t.median / n for t, n in zip(times["suffixes alone (off)"], SCALING_COUNTS)]  # s per sequence
    marginal = marginal_costs(SCALING_COUNTS, full)
    flop_full = marginal_costs(SCALING_COUNTS, [bench.shape.flops(work(make_batch(scaling_name(n)), "full"))
                                                for n in SCALING_COUNTS])
    flop_alone = [bench.shape.flops(work(make_batch(suffixes_name(n)), "off")) / n for n in SCALING_COUNTS]
    rows = ["| sequences | full s | mlp s | marginal s per added sequence | suffix alone s per sequence "
            "| marginal / suffix | FLOP ratio | full peak MB |", "|---|---|---|---|---|---|---|---|"]
    for i, n in enumerate(SCALING_COUNTS):
        step = "-" if marginal[i] is None else f"{marginal[i]:.4f}"
        ratio = "-" if marginal[i] is None else f"{marginal[i] / alone[i]:.2f}"
        flop_ratio = "-" if flop_full[i] is None else f"{flop_full[i] / flop_alone[i]:.2f}"
        rows.append(f"| {n} | {times['full'][i]} | {times['mlp'][i]} | {step} | {alone[i]:.4f} | {ratio} | "
                    f"{flop_ratio} | {bench.peak_mb(scaling_name(n), 'full')} |")
    return (f"## Sequences sharing one prefix\n\nHow to read: n sequences of one {SCALING_PREFIX}-token prefix plus "
            f"{SCALING_SUFFIX} own tokens, full and mlp, and the n {SCALING_SUFFIX}-token suffixes alone in off, "
            f"timed side by side (median of {repeats}). Marginal: (t(n2) - t(n1)) / (n2 - n1) of full between "
            "consecutive counts; marginal / suffix near the FLOP ratio (full's added FLOPs per sequence over a "
            f"suffix's alone: its {SCALING_SUFFIX} rows also attend to the prefix) means an added sequence costs "
            f"its suffix, not its prefix. No off column: {max(SCALING_COUNTS)} x {SCALING_PREFIX + SCALING_SUFFIX} "
            "tokens in off take minutes per forward on 2 cores.\n\n" + "\n".join(rows)
            + "\n\n![scaling](engine_scaling.png)\n")


def plot_speedup(speedups: dict[str, list[float]], path: Path) -> None:
    fig, ax = _axes()
    for mode, values in speedups.items():
        ax.plot(SWEEP_PREFIXES, values, marker="o", label=mode)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="shared prefix tokens (batch 32, suffix 64)", ylabel="speed-up over off",
           title="radixserve engine on CPU (Qwen3 hidden 512, 8 layers)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_scaling(times: dict[str, list[Timing]], path: Path) -> None:
    fig, ax = _axes()
    for name, series in times.items():
        ax.plot(SCALING_COUNTS, [t.median for t in series], marker="o", label=name,
                linestyle="--" if name.startswith("suffixes") else "-")
    ax.set(xlabel=f"sequences sharing one {SCALING_PREFIX}-token prefix ({SCALING_SUFFIX} own tokens each)",
           ylabel="forward time s", title="radixserve engine on CPU (Qwen3 hidden 512, 8 layers)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6, 4))


def command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run."""
    parts = ["python bench/engine_bench.py", f"--repeats {args.repeats}", f"--long-repeats {args.long_repeats}",
             f"--no-sharing-repeats {args.no_sharing_repeats}", f"--sweep-repeats {args.sweep_repeats}"]
    if args.shapes != list(SHAPES):
        parts.append("--shapes " + " ".join(f'"{s}"' for s in args.shapes))
    if args.skip:
        parts.append("--skip " + " ".join(args.skip))
    return " ".join(parts)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds per shape and per scaling count")
    parser.add_argument("--long-repeats", type=int, default=3, help="rounds for the long shapes (Shape.long)")
    parser.add_argument("--no-sharing-repeats", type=int, default=11,
                        help="rounds of off against auto alone on the batch without sharing")
    parser.add_argument("--sweep-repeats", type=int, default=1, help="rounds per prefix length of the prefix sweep")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES), metavar="SHAPE",
                        help=f"the shapes table's shapes (default all: {', '.join(SHAPES)})")
    parser.add_argument("--skip", nargs="+", choices=PARTS, default=[],
                        help="parts to leave out: the shapes table, the peak memory cells (a subprocess each), "
                        "the padded reference's rows, the sweeps")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--memory-cell", nargs=3, metavar=("MODEL_DIR", "BATCH", "MODE"), help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.memory_cell:
        return memory_cell(*args.memory_cell)
    from transformers import AutoModel

    model_dir = make_tiny_model(Path(tempfile.mkdtemp()) / "bench", "qwen3", "base", **PRESETS["bench"])
    reference = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = Engine.from_pretrained(str(model_dir), device="cpu", radix_threshold=1.0, prefix_cache_bytes=0)
    warm_up_s = engine.warm_up()  # calibrates auto's cost model
    tqdm.write(f"warm-up {warm_up_s:.1f} s: {engine.mode_costs}")
    bench = Bench(engine, reference, ModelShape.of(reference.config), model_dir, memory="memory" not in args.skip,
                  padded="padded" not in args.skip)
    sections = [f"# Engine modes on CPU\n\nCommand: `{command(args)}`; {torch.get_num_threads()} threads, torch "
                f"{torch.__version__}; auto threshold {engine.radix_threshold} (the cost model decides every batch), "
                f"warm-up {warm_up_s:.1f} s ({engine.mode_costs.source}), no prefix cache. Model: the `bench` preset "
                "(Qwen3, hidden 512, 8 layers), random weights, float32. Times: median (min-max) of rounds whose "
                "order rotates (`bench/timing.py`).\n"]
    args.out.mkdir(parents=True, exist_ok=True)
    written = [args.out / "engine_bench.md"]
    if "shapes" not in args.skip:
        shapes, runs = shapes_section(bench, args.shapes, args.repeats, args.long_repeats)
        static = static_costs(engine.arch, engine.device, engine.dtype)
        sections += [auto_section(engine.mode_costs, static, runs), shapes]
    if "no-sharing" not in args.skip:
        sections.append(no_sharing_section(bench, args.no_sharing_repeats))
    if "prefix-sweep" not in args.skip:
        speedups = prefix_sweep(bench, args.sweep_repeats)
        sections.append(prefix_sweep_section(speedups, args.sweep_repeats))
        plot_speedup(speedups, args.out / "engine_speedup.png")
        written.append(args.out / "engine_speedup.png")
    if "scaling" not in args.skip:
        times = scaling(bench, args.repeats)
        sections.append(scaling_section(bench, times, args.repeats))
        plot_scaling(times, args.out / "engine_scaling.png")
        written.append(args.out / "engine_scaling.png")
    written[0].write_text("\n".join(sections))
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
