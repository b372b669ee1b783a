"""Sustained load and overload through the gRPC proxy: zero errors below capacity, fast refusals above it, and
no work burnt on requests that fail.

The application as `serve_config.yaml` builds it (`placement.accelerator: cpu`, one engine replica, CPU reservations
at their defaults, `batching.max_queue_wait_s` from the workload: the latency bound the replica keeps under
overload), driven by two workloads in turn:

* `rerank8`: MS MARCO-shaped rerank requests of 8 documents (`bench/workloads.py`, the stream of
  `serve_bench.py`) on the `bench` preset Qwen3 model;
* `mix`: realistic request sizes, reranks of 8 to 1000 documents (log-uniform; Cohere's clients send up to 1000)
  of about 100 tokens each, on the `small` preset (a 1000-document rerank takes seconds, not minutes, on 2 CPUs).

For each, the phases (sent by the load driver of `bench/load_driver.py`):

1. unloaded: one request at a time (16 of them), its latency;
2. capacity: `--clients` closed-loop clients for `--capacity-s` seconds, requests answered per second;
3. sustained: open-loop Poisson arrivals at `--load` x capacity for `--sustain-s` seconds (the target: no error),
   with the client retrying refusals as users run it;
4. overload: arrivals at `--overload` x capacity for `--overload-s` seconds, no client retries: refusals
   (RESOURCE_EXHAUSTED) and their latency, accepted requests and theirs;
5. recovery: after the overload stops, one request at a time until one is back within 1.5x the unloaded latency.

Goodput is the share of the rows the engine computed during a phase that belonged to requests answered OK (their
`usage.computed_tokens` over the replica's `computed_tokens`): work spent on a request that is refused, cancelled
or fails lowers it.

    python bench/load_bench.py [--workloads rerank8 mix] [--load 0.7] [--overload 3] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path

import numpy as np
import ray
from load_driver import LoadDriver, Outcome
from local_serve import app_args, run_app, start_serve
from machine import plot_title, tiny_model
from ray import serve
from tqdm import tqdm
from workloads import (
    MsMarco,
    mixed_reranks,
    msmarco_texts,
    rerank_stream,
    token_counter,
)

from radix_core.tiny_models import PRESETS, make_tiny_model, make_tiny_tokenizer
from radixserve.client import ScoringClient


@dataclass(frozen=True)
class Workload:
    """Requests to cycle through, the model preset that serves them, and the replica's latency bound."""

    name: str
    preset: str
    requests: Callable[[np.random.Generator], list[dict]]
    max_queue_wait_s: float
    description: str


def rerank8_requests(rng: np.random.Generator) -> list[dict]:
    """The MS MARCO-shaped texts as serve_bench.py streams them: 12 queries x 32 passages, requests of 8."""
    shape = MsMarco(queries=12, passages_per_query=32)
    return rerank_stream(msmarco_texts(rng, token_counter(make_tiny_tokenizer()), shape), 8, rng)


WORKLOADS = {
    "rerank8": Workload("rerank8", "bench", rerank8_requests, 1.0,
                        "`bench` preset Qwen3, MS MARCO-shaped rerank requests of 8 documents"),
    "mix": Workload("mix", "small", mixed_reranks, 5.0,
                    "`small` preset Qwen3, reranks of 8 to 1000 documents of about 100 tokens (log-uniform)"),
}


class Driver(LoadDriver):
    """The shared load driver sending rerank requests from a cycle through one shared channel; an outcome's tokens
    are the rows the engine computed for it. `retrying`: the client retries refusals as users run it (3 times,
    jittered backoff, the server's hint), as every phase but the overload does."""

    def __init__(self, address: str, requests: list[dict]):
        self.clients = {False: ScoringClient(address, timeout_s=300, retries=0),
                        True: ScoringClient(address, timeout_s=300, retries=3)}
        self.retrying = True
        super().__init__(self.rerank, cycle(requests))

    def rerank(self, request: dict) -> int:
        return self.clients[self.retrying].rerank(**request).usage.computed_tokens


def latencies(outcomes: list[Outcome], code: str | None = None) -> np.ndarray:
    return np.array([o.latency_s for o in outcomes if code is None or o.code == code])


def pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def computed_tokens() -> int:
    """Rows the (one) engine replica has computed so far."""
    return serve.get_app_handle("radixserve").info.remote().result(timeout_s=60)["computed_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--capacity-s", type=float, default=20)
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--sustain-s", type=float, default=60)
    parser.add_argument("--overload", type=float, default=3.0)
    parser.add_argument("--overload-s", type=float, default=20)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    config, port = start_serve()
    reports = {}
    for name in args.workloads:
        workload = WORKLOADS[name]
        model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / f"{workload.preset}-qwen3", "qwen3", "causal_lm",
                                        **PRESETS[workload.preset]))
        run_app(app_args(config, model=model_dir, batching={"max_queue_wait_s": workload.max_queue_wait_s},
                         placement={"accelerator": "cpu", "engine": {"num_replicas": 1}}))
        reports[name] = run_workload(Driver(f"127.0.0.1:{port}", workload.requests(np.random.default_rng(0))),
                                     args, name)
        serve.delete("radixserve")
    serve.shutdown()
    ray.shutdown()
    write_report(reports, args)


def run_workload(driver: Driver, args, name: str) -> dict:
    """The five phases on one deployed workload; the outcomes of the sustained and overload phases are kept for the
    plot."""
    rng = np.random.default_rng(1)
    driver.closed_loop(args.clients, 5, f"{name} warm-up")
    unloaded = [driver.one() for _ in tqdm(range(16), desc=f"{name} unloaded", unit="req")]
    base = pct(latencies(unloaded), 50)
    capacity_run = driver.closed_loop(args.clients, args.capacity_s, f"{name} capacity")
    capacity = sum(o.code == "OK" for o in capacity_run) / args.capacity_s  # answered, not refused
    sustained = measured(lambda: driver.open_loop(args.load * capacity, args.sustain_s,
                                                  f"{name} {args.load:g}x capacity", rng))
    driver.retrying = False
    overloaded = measured(lambda: driver.open_loop(args.overload * capacity, args.overload_s,
                                                   f"{name} {args.overload:g}x capacity", rng))
    stopped, recovery = time.perf_counter(), []
    while len(recovery) < 60:
        recovery.append(driver.one())
        if recovery[-1].code == "OK" and recovery[-1].latency_s <= 1.5 * base:
            break
    return {"unloaded p50 s": base, "unloaded p99 s": pct(latencies(unloaded), 99), "capacity req/s": capacity,
            "sustained": phase(*sustained), "overload": phase(*overloaded), "recovery s": time.perf_counter() - stopped,
            "outcomes": {"sustained": sustained[0], "overload": overloaded[0]}}


def measured(run: Callable[[], list[Outcome]]) -> tuple[list[Outcome], int]:
    """The phase's outcomes, and the rows the engine computed during it (all its requests answered)."""
    before = computed_tokens()
    outcomes = run()
    return outcomes, computed_tokens() - before


def phase(outcomes: list[Outcome], computed: int) -> dict:
    codes = {}
    for o in outcomes:
        codes[o.code] = codes.get(o.code, 0) + 1
    refused = latencies(outcomes, "RESOURCE_EXHAUSTED")
    ok = latencies(outcomes, "OK")
    return {"sent": len(outcomes), "codes": codes, "ok p50 s": pct(ok, 50), "ok p99 s": pct(ok, 99),
            "refused p50 s": pct(refused, 50), "refused p99 s": pct(refused, 99),
            "goodput": sum(o.tokens for o in outcomes) / computed if computed else float("nan")}


def write_report(reports: dict, args) -> None:
    command = (f"python bench/load_bench.py --workloads {' '.join(reports)} --clients {args.clients} --capacity-s "
               f"{args.capacity_s:g} --load {args.load:g} --sustain-s {args.sustain_s:g} --overload "
               f"{args.overload:g} --overload-s {args.overload_s:g}")
    text = [f"# Load and overload\n\nCommand: `{command}` (2 CPUs; the sustained phase with the client's retries, "
            "the overload without). Goodput: the share of the rows the engine computed in the phase that belonged to "
            "requests answered OK.\n"]
    for name, report in reports.items():
        workload = WORKLOADS[name]
        rows = ["| phase | sent | answers by code | OK p50 s | OK p99 s | refused p50 s | refused p99 s | goodput |",
                "|---|---|---|---|---|---|---|---|"]
        for label, key, seconds in ((f"{args.load:g}x capacity", "sustained", args.sustain_s),
                                    (f"{args.overload:g}x capacity", "overload", args.overload_s)):
            p = report[key]
            rows.append(f"| {label}, {seconds:g} s | {p['sent']} | {p['codes']} | {p['ok p50 s']:.2f} | "
                        f"{p['ok p99 s']:.2f} | {p['refused p50 s']:.3f} | {p['refused p99 s']:.3f} | "
                        f"{p['goodput']:.3f} |")
        text.append(f"## {name}: {workload.description}, max_queue_wait_s {workload.max_queue_wait_s:g}\n\n"
                    f"Unloaded latency p50 {report['unloaded p50 s']:.2f} s, p99 {report['unloaded p99 s']:.2f} s; "
                    f"capacity {report['capacity req/s']:.2f} requests/s ({args.clients} closed-loop clients); back "
                    f"within 1.5x the unloaded latency {report['recovery s']:.1f} s after the overload stopped.\n\n"
                    + "\n".join(rows) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load_bench.md").write_text("\n".join(text))
    summary = {name: {k: v for k, v in report.items() if k != "outcomes"} for name, report in reports.items()}
    (args.out / "load_bench.json").write_text(json.dumps(summary, indent=1))
    plot({name: report["outcomes"] for name, report in reports.items()}, args.out / "load_bench.png")
    print("\n".join(text))


def plot(outcomes: dict[str, dict[str, list[Outcome]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(outcomes), 1, figsize=(10, 4.5 * len(outcomes)), squeeze=False)
    colours = {"OK": "tab:green", "RESOURCE_EXHAUSTED": "tab:orange"}
    for ax, (name, phases) in zip(axes[:, 0], outcomes.items()):
        both = phases["sustained"] + phases["overload"]
        t0 = min(o.sent for o in both)
        for code in sorted({o.code for o in both}):
            points = [(o.sent - t0, o.latency_s) for o in both if o.code == code]
            ax.scatter(*zip(*points), s=6, label=code, color=colours.get(code, "tab:red"))
        ax.axvline(min(o.sent for o in phases["overload"]) - t0, color="grey", linestyle="--", label="overload starts")
        ax.set_title(plot_title(name, tiny_model(WORKLOADS[name].preset)), fontsize=9)
        ax.set_xlabel("request sent at (s)")
        ax.set_ylabel("latency (s)")
        ax.set_yscale("log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
