"""What Ray and Serve running beside a CPU forward cost it, when neither is in the forward's process.

A served forward is measured against the engine in a process of its own (`bench/host_path.py`,
`bench/serve_bench.py`), but with Ray and the application up on the same node during both, so the cost of the
node's control plane is in both. Here the engine runs in a child process without Ray (`bench/child_process.py`)
on the same batches every pass, in three phases a round: the node **quiet** (no Ray); **Ray + Serve up**: a local
Ray with Serve and the application of serve_config.yaml deployed on the same model (one engine replica, idle:
nothing is sent to it); and the same with **every Ray thread SCHED_IDLE** (each thread of every Ray process, daemons
included, moved to Linux's idle scheduling class, which runs a thread only on a CPU nothing else wants: what no nice
level or `placement.niceness` can go beyond). Odd rounds start with Ray up, so neither order is always first.

During each phase's first passes it counts every process's context switches (each a wake-up) and CPU time from
/proc: what shares the cores with the forward's OpenMP threads.

Workload (`--preset`, default `bench`): the peer benchmark's "embed, no instruction" (`bench/peer_vllm.py`):
`--requests` embedding requests of 16 MS MARCO-shaped passages, `--per-batch` requests a batch, radix `auto`
warmed up as the replica is, no prefix cache.

    python bench/ray_presence.py [--preset bench] [--rounds 2] [--passes 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
from child_process import ChildProcess
from in_process_worker import presence_candidate
from local_serve import app_args, run_app, start_serve
from machine import machine, tiny_model
from peer_vllm_processes import proc_stat
from ray import serve
from workloads import MsMarco, msmarco_texts, token_counter

from radix_core.tiny_models import PRESETS, make_tiny_model, make_tiny_tokenizer

PHASES = ("quiet", "Ray + Serve up", "every Ray thread SCHED_IDLE")
TEXTS_PER_REQUEST = 16


def ray_threads(skip: set[int]) -> list[int]:
    """Thread ids of every Ray process on the node (workers, proxies, the controller, GCS, raylet, agents), the
    pids in `skip` left out."""
    tids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) in skip:
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            if "ray" in command or "gcs_server" in command or "raylet" in command:
                tids += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:  # gone since the listing
            continue
    return tids


def make_idle(tids: list[int]) -> int:
    """Move each thread to SCHED_IDLE; how many moved (a thread may have exited since it was listed)."""
    moved = 0
    for tid in tids:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            moved += 1
        except OSError:
            continue
    return moved


def process_counts() -> dict[int, tuple[str, int, int]]:
    """Per process id: (its name, context switches of all its threads, CPU clock ticks)."""
    counts = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            ticks = proc_stat(int(pid))[0]
            switches = 0
            for tid in os.listdir(f"/proc/{pid}/task"):
                for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                    if "ctxt_switches" in line:  # voluntary and nonvoluntary
                        switches += int(line.split()[1])
            counts[int(pid)] = (name, switches, ticks)
        except (OSError, ValueError):
            continue
    return counts


def node_activity(before: dict, after: dict, seconds: float, skip: set[int]) -> dict[str, tuple[float, float]]:
    """Per process name: (wake-ups/s, share of one CPU) of the processes of that name that woke during the window
    (between the `process_counts` `before` and `after`), the kernel's work queue threads as one (a kworker's name
    changes with the work it last ran); the pids in `skip` left out."""
    tick = os.sysconf("SC_CLK_TCK")
    rows: dict[str, tuple[float, float]] = {}
    for pid, (name, switches, ticks) in after.items():
        _, was_switches, was_ticks = before.get(pid, (name, 0, 0))
        if pid in skip or switches <= was_switches:
            continue
        name = "kworker/* (the kernel's work queues)" if name.startswith("kworker/") else name
        wakeups, cpu = rows.get(name, (0.0, 0.0))
        rows[name] = (wakeups + (switches - was_switches) / seconds, cpu + (ticks - was_ticks) / tick / seconds)
    return rows


def requests(count: int, seed: int) -> list[tuple[str, dict]]:
    rng = np.random.default_rng(seed)
    passages = msmarco_texts(rng, token_counter(make_tiny_tokenizer()),
                             MsMarco(queries=1, passages_per_query=count * TEXTS_PER_REQUEST))[0].passages
    return [("embed", {"texts": passages[i:i + TEXTS_PER_REQUEST]})
            for i in range(0, len(passages), TEXTS_PER_REQUEST)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="bench")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--per-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--passes", type=int, default=3, help="timed passes over the requests per phase and round")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / f"{args.preset}-qwen3", "qwen3", "causal_lm",
                                    **PRESETS[args.preset]))
    child = ChildProcess(presence_candidate, model_dir, requests(args.requests, args.seed),
                         args.per_batch)
    skip = {os.getpid(), child.pid}
    child.call("forward")  # warm-up
    times: dict[str, list[float]] = {phase: [] for phase in PHASES}
    activity: dict[str, dict[str, tuple[float, float]]] = {}
    moved: list[int] = []  # threads moved to SCHED_IDLE, per round

    def passes(phase: str) -> None:
        before, start = process_counts(), time.perf_counter()
        times[phase] += [child.call("forward") for _ in range(args.passes)]
        activity.setdefault(phase, node_activity(before, process_counts(), time.perf_counter() - start, skip))

    def with_ray() -> None:
        config, _ = start_serve()
        run_app(app_args(config, model=model_dir, placement={"engine": {"num_replicas": 1}}))
        passes(PHASES[1])
        moved.append(make_idle(ray_threads(skip)))
        passes(PHASES[2])
        serve.shutdown()
        ray.shutdown()

    for r in range(args.rounds):
        if r % 2:
            with_ray()
            passes(PHASES[0])
        else:
            passes(PHASES[0])
            with_ray()
    child.close()
    write_report(times, activity, moved, args)


def write_report(times: dict[str, list[float]], activity: dict[str, dict[str, tuple[float, float]]], moved: list[int],
                 args) -> None:
    quiet = float(np.median(times[PHASES[0]]))
    rows = ["| phase | seconds per pass, median (min-max) | / quiet |", "|---|---|---|"]
    for phase, seconds in times.items():
        rows.append(f"| {phase} | {np.median(seconds):.3f} ({min(seconds):.3f}-{max(seconds):.3f}) | "
                    f"{np.median(seconds) / quiet:.2f} |")
    busiest = sorted({name for rows in activity.values() for name in rows},
                     key=lambda name: -max(rows.get(name, (0.0, 0.0))[0] for rows in activity.values()))[:14]

    def cell(wakeups: float, cpu: float) -> str:
        return f"{wakeups:,.0f} / {cpu:.1%}"

    totals = {p: (sum(w for w, _ in activity[p].values()), sum(c for _, c in activity[p].values())) for p in PHASES}
    table = ["| process | " + " | ".join(PHASES) + " |", "|---|" + "---|" * len(PHASES),
             *(f"| `{name}` | " + " | ".join(cell(*activity[p].get(name, (0.0, 0.0))) for p in PHASES) + " |"
               for name in busiest),
             "| **all (the child and this driver left out)** | " + " | ".join(cell(*totals[p]) for p in PHASES) + " |"]
    command = (f"python bench/ray_presence.py --preset {args.preset} --requests {args.requests} --per-batch "
               f"{args.per_batch} --rounds {args.rounds} --passes {args.passes}")
    text = "\n".join([
        "# What Ray and Serve beside a CPU forward cost it", "",
        f"Command: `{command}` on {machine()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Model: "
        f"{tiny_model(args.preset)}. A pass: {args.requests} embedding requests of {TEXTS_PER_REQUEST} MS "
        f"MARCO-shaped passages, {args.per_batch} a batch, in a child process without Ray; {args.rounds} rounds of "
        f"{args.passes} passes per phase (the script's docstring says what each phase is); threads moved to "
        f"SCHED_IDLE each round: {', '.join(map(str, moved))}.", "",
        *rows, "",
        "What else ran while the forward did (the first round of each phase; the application's replicas idle): "
        "wake-ups/s (context switches of all its threads) / share of one CPU, per process name, the processes "
        "busiest in any phase first:", "",
        *table, ""])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ray_presence.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
