"""Index building: `radix_core.build_radix_index` against the `radix-mlp` package, side by side.

Both get the same uint32 ids, positions and cu_seqlens (radix-mlp's native input); ours also returns each
sequence's added block (`cu_seqlens_q`). Timings are medians over interleaved repetitions in one process. Writes
the table and, next to it, a plot of build time against N'/N (`index_bench.png`).

    python bench/index_bench.py [--repeats 15] [--out bench/results/index_bench.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from machine import machine
from radix_mlp import compute_fold_and_scatter
from timing import interleaved_timings
from tqdm import tqdm

from radix_core.index import build_radix_index

SHAPES = [(32, 512), (256, 512), (2048, 512)]
RATIOS = [0.0, 0.25, 0.5, 0.75, 1.0]
VOCAB = 32000


def make_batch(batch: int, length: int, ratio: float, rng: np.random.Generator):
    """`batch` sequences of `length` tokens sharing their first `ratio * length` tokens."""
    shared = rng.integers(0, VOCAB, int(round(ratio * length)))
    ids = np.concatenate([np.concatenate([shared, rng.integers(0, VOCAB, length - shared.size)])
                          for _ in range(batch)]).astype(np.uint32)  # (B*L,)
    pos = np.tile(np.arange(length, dtype=np.uint32), batch)  # (B*L,)
    cu = (np.arange(batch + 1) * length).astype(np.uint32)  # (B+1,)
    return ids, pos, cu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "index_bench.md")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = ["| shape | shared | N'/N | radix-mlp ms | ours ms | ours/radix-mlp throughput | numpy fallback ms |",
            "|---|---|---|---|---|---|---|"]
    points: dict[str, list[tuple[float, dict[str, float]]]] = {}  # shape -> [(N'/N, ms by builder)]
    grid = [(batch, length, ratio) for batch, length in SHAPES for ratio in RATIOS]
    for batch, length, ratio in tqdm(grid, desc="index builds", unit="shape"):
        ids, pos, cu = make_batch(batch, length, ratio, rng)
        timings = interleaved_timings({
            "rust": lambda: compute_fold_and_scatter(ids, pos, cu),
            "ours": lambda: build_radix_index(ids, cu, pos),
            "numpy": lambda: build_radix_index(ids, cu, pos, backend="numpy"),
        }, args.repeats, warmup=False)
        t = {name: timing.median for name, timing in timings.items()}
        compression = build_radix_index(ids, cu, pos).compression
        points.setdefault(f"{batch}x{length}", []).append((compression, {k: v * 1e3 for k, v in t.items()}))
        rows.append(f"| {batch}x{length} | {ratio:.2f} | {compression:.3f} | {t['rust'] * 1e3:.3f} | "
                    f"{t['ours'] * 1e3:.3f} | {t['rust'] / t['ours']:.2f}x | {t['numpy'] * 1e3:.3f} |")
        tqdm.write(rows[-1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("# Index building\n\nCommand: `python bench/index_bench.py`\n\n" + "\n".join(rows)
                        + f"\n\n![build time against N'/N]({args.out.with_suffix('.png').name})\n")
    plot(points, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def plot(points: dict[str, list[tuple[float, dict[str, float]]]], path: Path) -> None:
    """Build time (ms, log scale) against N'/N, one line per shape and builder."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for shape, series in points.items():
        for builder, style in (("ours", "-o"), ("rust", "--s"), ("numpy", ":^")):
            ax.plot([c for c, _ in series], [ms[builder] for _, ms in series], style, label=f"{shape} {builder}")
    ax.set(xlabel="N'/N", ylabel="build time, ms", yscale="log")
    fig.suptitle(f"radix index build, token ids only (no model) on {machine()}", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
