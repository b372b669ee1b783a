"""The dense families' norms, MLPs and rotary in fewer passes against upstream's modules: the engine in-process.

On the CPU the engine loads Llama, Mistral, Qwen2 and Qwen3 checkpoints with `radix_core.lean_layers` in place of
upstream's RMSNorm, SiLU MLP and rotary: the same operations in the same order, fewer allocations and passes, so
the same bits. This runs the workloads of `bench/peer_vllm.py` (MS MARCO-shaped 8- and 256-document reranks,
16-text embeddings with and without a shared instruction; the same drawing, seed 0) on the `bench` preset (Qwen3,
hidden 512, 8 layers, random weights) in this process, each workload its clients' requests a batch, on two
engines of one checkpoint:

* **lean**: `Engine.from_pretrained`, as the engine replica loads it;
* **upstream**: the same with `load_architecture(..., lean=False)`: transformers' own modules around the packed
  linears, what the engine ran before.

The prefix cache is off (every round repeats the same batches, which a cache would answer from memory), radix
`auto` warmed up as the replica warms it. Timings are `timing.interleaved_timings` (one warm-up each, rounds in
rotating order); every score and vector of the two must be equal bit for bit. Writes `lean_layers.md` to `--out`.

    python bench/lean_layers.py --rounds 5
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from engine_side_by_side import bench_model, peer_batches, table_row, values, write_report
from timing import interleaved_timings

from radix_core.architectures import load_architecture
from radix_core.engine import Engine
from radix_core.engine_config import EngineConfig


def engines(model_dir: str) -> dict[str, Engine]:
    """The lean engine as `from_pretrained` loads it and one on upstream's modules, both warmed up."""
    config = EngineConfig(device="cpu", radix="auto", prefix_cache_bytes=0)
    lean = Engine.from_pretrained(model_dir, config)
    arch = load_architecture(model_dir, lean.device, lean.dtype, packed=True, lean=False)
    upstream = Engine(arch, lean.device, lean.dtype, config, model=model_dir, prompts=lean.prompts)
    for engine in (lean, upstream):
        engine.warm_up()
    return {"lean": lean, "upstream": upstream}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per engine and workload")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        both = engines(bench_model(Path(work)))
        rows = []
        for workload, jobs, batches in peer_batches(both["lean"]):
            answers = {name: [values(p) for batch in batches for p in engine.run_jobs(batch)]
                       for name, engine in both.items()}
            if not all(np.array_equal(a, b) for a, b in zip(answers["lean"], answers["upstream"])):
                raise SystemExit(f"{workload.name}: the lean engine's answers differ from upstream modules'")
            timings = interleaved_timings({name: lambda e=engine: [e.run_jobs(batch) for batch in batches]
                                           for name, engine in both.items()}, args.rounds)
            rows.append(table_row(workload, jobs, batches, [
                str(timings["upstream"]), str(timings["lean"]),
                f"**{timings['upstream'].median / timings['lean'].median:.3f}x**", "bit for bit"]))
            print(rows[-1], flush=True)
    write_report(args.out, "lean_layers", "Lean norms, MLPs and rotary against upstream's modules", args.rounds,
                 ["upstream modules, s (min-max)", "lean, s (min-max)", "speed-up", "answers"], rows)


if __name__ == "__main__":
    main()
