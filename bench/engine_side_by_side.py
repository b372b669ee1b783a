"""Two ways of the engine side by side in-process on `bench/peer_vllm.py`'s workloads: the model, the batches, the
answers' numbers and the report that `bench/final_rows.py` and `bench/lean_layers.py` share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from machine import machine, tiny_model
from peer_vllm import Workload, make_workloads

from radix_core.engine import Engine
from radix_core.tasks import TASKS
from radix_core.tiny_models import PRESETS, make_tiny_model

SIZES = SimpleNamespace(requests_8=48, requests_256=4, embed_requests=96)  # bench/peer_vllm.py's defaults


def bench_model(work: Path) -> str:
    """The `bench` preset (Qwen3, hidden 512, 8 layers, random weights) written under `work`."""
    return str(make_tiny_model(work / "bench-qwen3", "qwen3", "causal_lm", **PRESETS["bench"]))


def peer_batches(engine: Engine) -> Iterator[tuple[Workload, list, list[list]]]:
    """Each workload (seed 0) as (workload, its jobs encoded by `engine`, batches of its clients' requests)."""
    workloads, _ = make_workloads(SIZES, np.random.default_rng(0))
    for workload in workloads:
        jobs = [TASKS[workload.task].encode(engine.context, request) for request in workload.requests]
        yield workload, jobs, [jobs[i:i + workload.clients] for i in range(0, len(jobs), workload.clients)]


def values(partial) -> np.ndarray:
    """A rerank's scores or an embedding's vectors."""
    return np.asarray(partial.scores if hasattr(partial, "scores") else partial.embeddings, dtype=np.float64)


def table_row(workload: Workload, jobs: list, batches: list[list], cells: list[str]) -> str:
    """A workload's row: its name, its batches and items, then `cells`."""
    items = sum(len(job.sequences) for job in jobs)
    return " | ".join([f"| {workload.name}", f"{len(batches)} x {workload.clients} requests, {items} items",
                       *cells]) + " |"


def write_report(out: Path, script: str, title: str, rounds: int, header: list[str], rows: list[str]) -> None:
    """`results/<script>.md` under `out`: the title, the command and model, the table; printed too."""
    report = "\n".join([
        f"# {title}",
        "",
        f"Command: `python bench/{script}.py --rounds {rounds}` on {machine()}. Model: {tiny_model('bench')}, "
        "float32, radix `auto`, no prefix cache; the workloads of `bench/peer_vllm.py` (seed 0), each workload's "
        "clients' requests a batch; the script's docstring says what each column is.",
        "",
        "| " + " | ".join(["workload", "batches", *header]) + " |",
        "|" + "---|" * (len(header) + 2),
        *rows, ""])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{script}.md").write_text(report)
    print(report)
