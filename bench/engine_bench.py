"""Engine modes side by side on the workloads of docs/ARCHITECTURE.md section 7, with FLOP bounds and peak memory.

Model: Qwen3 architecture, hidden 512, 8 layers, 8 heads, 4 KV heads, head dim 64, intermediate 1536, random
weights, float32 (the `bench` preset of `radix_core.tiny_models`). For each shape, every mode runs in one
process with the modes interleaved per repetition; the table gives the median time, the speed-up over `off`,
the FLOP bound of that speed-up (position-wise and attention FLOPs of both layouts), achieved / bound, and the
peak memory growth of one forward (RSS high-water mark over the RSS before it, in a fresh subprocess per
cell). Plain transformers on a padded
batch is timed as the reference users run today. A sweep of the shared-prefix length (batch 32, suffix 64)
gives the speed-up plot.

    python bench/engine_bench.py [--repeats 5] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from timing import interleaved_timings
from tqdm import tqdm

from radix_core.engine import Engine
from radix_core.index import build_radix_index, flatten_sequences
from radix_core.tiny_models import PRESETS, make_tiny_model

MODES = ("off", "mlp", "full", "auto")
VOCAB = 2000
SWEEP_PREFIXES = (0, 64, 128, 256, 512, 768, 1024)


def tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(0, VOCAB, n).tolist()


def msmarco_rerank(rng) -> list[list[int]]:
    """64 sequences: 8 queries x 8 passages; 50 shared template tokens, the query shared by its passages,
    passages of 40-120 tokens, a 10-token assistant suffix."""
    template, suffix = tokens(rng, 50), tokens(rng, 10)
    batch = []
    for _ in range(8):
        query = tokens(rng, int(rng.integers(8, 20)))
        batch += [template + query + tokens(rng, int(rng.integers(40, 121))) + suffix for _ in range(8)]
    return batch


def synthetic_prefix(rng, prefix: int = 512, suffix: int = 64, batch: int = 32) -> list[list[int]]:
    shared = tokens(rng, prefix)
    return [shared + tokens(rng, suffix) for _ in range(batch)]


def embedding_instruction(rng) -> list[list[int]]:
    """64 texts of 50-200 tokens behind one 20-token instruction."""
    instruction = tokens(rng, 20)
    return [instruction + tokens(rng, int(rng.integers(50, 201))) for _ in range(64)]


def no_sharing(rng) -> list[list[int]]:
    return [tokens(rng, int(rng.integers(128, 385))) for _ in range(32)]


SHAPES = {
    "msmarco-rerank 64 seqs": msmarco_rerank,
    "synthetic 32x(512+64)": synthetic_prefix,
    "embed 64x(20+50..200)": embedding_instruction,
    "no sharing 32x(128..384)": no_sharing,
}


@dataclass
class ModelSize:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    def rowwise_flops(self) -> float:
        """Matmul FLOPs per computed row, all layers: q/k/v/o projections and the gated MLP."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        out = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return 2.0 * (qkv + out + mlp) * self.layers

    def pair_flops(self) -> float:
        """FLOPs per visible (query, key) pair, all layers: QK^T and PV."""
        return 4.0 * self.heads * self.head_dim * self.layers


def mode_flops(size: ModelSize, sequences, mode: str, threshold: float) -> float:
    """Position-wise plus attention FLOPs of one forward in `mode` (auto counted as the mode it picks)."""
    ids, cu = flatten_sequences(sequences)
    index = build_radix_index(ids, cu)
    lengths = np.diff(cu).astype(np.float64)
    causal_pairs = float((lengths * (lengths + 1) / 2).sum())
    if mode == "off" or (mode == "auto" and index.compression > threshold):
        return size.rowwise_flops() * index.num_tokens + size.pair_flops() * causal_pairs
    rows = size.rowwise_flops() * index.num_compact
    if mode == "mlp":
        return rows + size.pair_flops() * causal_pairs
    lq = np.diff(index.cu_seqlens_q).astype(np.float64)
    full_pairs = float((lq * (lengths - lq) + lq * (lq + 1) / 2).sum())
    return rows + size.pair_flops() * full_pairs


def padded_transformers(model, sequences) -> torch.Tensor:
    """What users run today: one padded batch through transformers, last real token per sequence."""
    longest = max(map(len, sequences))
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L_max, hidden)
    return hidden[torch.arange(len(sequences)), mask.sum(1) - 1]


def peak_memory_mb(model_dir: Path, shape: str, mode: str) -> float:
    """Peak RSS growth of one forward, in a fresh process so earlier runs do not hide it."""
    out = subprocess.run([sys.executable, __file__, "--memory-cell", str(model_dir), shape, mode],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]


def memory_cell(model_dir: str, shape: str, mode: str) -> None:
    sequences = SHAPES[shape](np.random.default_rng(0))
    if mode == "transformers":
        from transformers import AutoModel

        model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
        run = lambda: padded_transformers(model, sequences)  # noqa: E731
    else:
        engine = Engine.from_pretrained(model_dir, device="cpu")
        run = lambda: engine.last_hidden_states(sequences, mode=mode)  # noqa: E731
    before = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current RSS
    run()
    print(json.dumps({"peak_mb": (_status_kb("VmHWM") - before) / 1024}))


def _status_kb(field: str) -> int:
    """A `/proc/self/status` memory figure in kB (Linux)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def bench_shapes(engine, hf_model, size, model_dir, repeats) -> list[str]:
    rows = ["| shape | N | N'/N | mode | time s, median (min-max) | speed-up vs off | FLOP bound | achieved/bound "
            "| peak MB |",
            "|---|---|---|---|---|---|---|---|---|"]
    for shape, make in tqdm(SHAPES.items(), desc="shapes", unit="shape"):
        sequences = make(np.random.default_rng(0))
        ids, cu = flatten_sequences(sequences)
        index = build_radix_index(ids, cu)
        runners = {m: (lambda m=m: engine.last_hidden_states(sequences, mode=m)) for m in MODES}
        runners["transformers (padded)"] = lambda: padded_transformers(hf_model, sequences)
        times = interleaved_timings(runners, repeats)
        off_flops = mode_flops(size, sequences, "off", engine.radix_threshold)
        for name, timing in times.items():
            speedup = times["off"].median / timing.median
            bound = off_flops / mode_flops(size, sequences, name if name in MODES else "off", engine.radix_threshold)
            memory = peak_memory_mb(model_dir, shape, name if name in MODES else "transformers")
            rows.append(f"| {shape} | {index.num_tokens} | {index.compression:.3f} | {name} | {timing} | "
                        f"{speedup:.2f}x | {bound:.2f}x | {speedup / bound:.2f} | {memory:.0f} |")
            tqdm.write(rows[-1])
    return rows


def sweep(engine, repeats) -> dict[str, list[float]]:
    """Speed-up over `off` against the shared-prefix length (batch 32, suffix 64)."""
    speedups = {"mlp": [], "full": []}
    for prefix in tqdm(SWEEP_PREFIXES, desc="prefix sweep", unit="length"):
        sequences = synthetic_prefix(np.random.default_rng(1), prefix=prefix)
        times = interleaved_timings({m: (lambda m=m: engine.last_hidden_states(sequences, mode=m))
                                     for m in ("off", "mlp", "full")}, repeats)
        for mode in speedups:
            speedups[mode].append(times["off"].median / times[mode].median)
        tqdm.write(f"prefix {prefix}: " + ", ".join(f"{m} {v[-1]:.2f}x" for m, v in speedups.items()))
    return speedups


def plot(speedups: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, values in speedups.items():
        ax.plot(SWEEP_PREFIXES, values, marker="o", label=mode)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="shared prefix tokens (batch 32, suffix 64)", ylabel="speed-up over off",
           title="radixserve engine on CPU (Qwen3 hidden 512, 8 layers)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sweep-repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--memory-cell", nargs=3, metavar=("MODEL_DIR", "SHAPE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_cell:
        return memory_cell(*args.memory_cell)
    from transformers import AutoModel

    model_dir = make_tiny_model(Path(tempfile.mkdtemp()) / "bench", "qwen3", "base", **PRESETS["bench"])
    engine = Engine.from_pretrained(str(model_dir), device="cpu")
    hf_model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = hf_model.config
    size = ModelSize(config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                     config.num_key_value_heads, config.head_dim, config.intermediate_size)
    header = (f"# Engine modes on CPU\n\nCommand: `python bench/engine_bench.py --repeats {args.repeats}`; "
              f"{torch.get_num_threads()} threads, torch {torch.__version__}; medians of {args.repeats} "
              f"interleaved runs; auto threshold {engine.radix_threshold}.\n\n")
    rows = bench_shapes(engine, hf_model, size, model_dir, args.repeats)
    speedups = sweep(engine, args.sweep_repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    sweep_rows = ["| shared prefix | " + " | ".join(f"{m} speed-up" for m in speedups) + " |",
                  "|---|" + "---|" * len(speedups)]
    sweep_rows += [f"| {p} | " + " | ".join(f"{speedups[m][i]:.2f}x" for m in speedups) + " |"
                   for i, p in enumerate(SWEEP_PREFIXES)]
    (args.out / "engine_bench.md").write_text(header + "\n".join(rows) + "\n\n## Shared-prefix sweep\n\n"
                                              + "\n".join(sweep_rows) + "\n\n![speed-up](engine_speedup.png)\n")
    plot(speedups, args.out / "engine_speedup.png")
    print(f"wrote {args.out / 'engine_bench.md'} and {args.out / 'engine_speedup.png'}")


if __name__ == "__main__":
    main()
