"""Sustained load and overload through the gRPC proxy: zero errors below capacity, fast refusals above it.

The application as `serve_config.yaml` builds it (`accelerator: cpu`, one engine replica, the `bench` preset Qwen3
model, CPU reservations at their defaults, `max_queue_wait_s` from `--max-queue-wait-s`: the latency bound the
replica keeps under overload), MS MARCO-shaped rerank requests of 8 documents:

1. unloaded: one request at a time, its latency;
2. capacity: `--clients` closed-loop clients for `--capacity-s` seconds, requests answered per second;
3. sustained: open-loop Poisson arrivals at `--load` x capacity for `--sustain-s` seconds (the target: no error),
   with the client retrying refusals as users run it;
4. overload: arrivals at `--overload` x capacity for `--overload-s` seconds, no client retries: refusals
   (RESOURCE_EXHAUSTED) and their latency, accepted requests and theirs;
5. recovery: after the overload stops, one request at a time until one is back within 1.5x the unloaded latency.

    python bench/load_bench.py [--load 0.7] [--sustain-s 60] [--overload 3] [--overload-s 20] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import cycle
from pathlib import Path

import grpc
import numpy as np
import ray
from ray import serve
from serve_bench import start_serve, streams
from tqdm import tqdm

from deployments.app import build
from radix_core.tiny_models import PRESETS, make_tiny_model
from radixserve.client import ScoringClient


class Driver:
    """Sends rerank requests from a cycle through one shared channel; each records (code, latency, sent at).
    `retrying`: the client retries refusals as users run it (3 times, jittered backoff, the server's hint), as
    every phase but the overload does."""

    def __init__(self, address: str, requests: list[dict], threads: int = 64):
        self.clients = {False: ScoringClient(address, timeout_s=300, retries=0),
                        True: ScoringClient(address, timeout_s=300, retries=3)}
        self.retrying = True
        self.requests = cycle(requests)
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(threads)

    def one(self) -> tuple[str, float, float]:
        with self.lock:
            request = next(self.requests)
        sent = time.perf_counter()
        try:
            self.clients[self.retrying].rerank(**request)
            code = "OK"
        except grpc.RpcError as err:
            code = err.code().name
        return code, time.perf_counter() - sent, sent

    def closed_loop(self, clients: int, seconds: float, label: str) -> list[tuple[str, float, float]]:
        end = time.perf_counter() + seconds
        results, bar = [], tqdm(desc=label, unit="req")

        def client():
            while time.perf_counter() < end:
                outcome = self.one()
                with self.lock:
                    results.append(outcome)
                    bar.update()

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bar.close()
        return results

    def open_loop(self, rate: float, seconds: float, label: str, rng: np.random.Generator):
        """Poisson arrivals at `rate` per second for `seconds`; waits for every answer."""
        futures, start = [], time.perf_counter()
        at = start
        with tqdm(total=round(rate * seconds), desc=label, unit="req") as bar:
            while at - start < seconds:
                at += rng.exponential(1 / rate)
                time.sleep(max(0.0, at - time.perf_counter()))
                futures.append(self.pool.submit(self.one))
                bar.update()
            return [f.result() for f in futures]


def latencies(outcomes, code: str | None = None) -> np.ndarray:
    return np.array([lat for c, lat, _ in outcomes if code is None or c == code])


def pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--capacity-s", type=float, default=20)
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--sustain-s", type=float, default=60)
    parser.add_argument("--overload", type=float, default=3.0)
    parser.add_argument("--overload-s", type=float, default=20)
    parser.add_argument("--max-queue-wait-s", type=float, default=1.0,
                        help="the replica's latency bound under overload (app arg max_queue_wait_s)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    stream_args = argparse.Namespace(queries=12, docs=32, request_docs=8, embed_texts=0)
    rerank = [request for _, request in streams(stream_args, np.random.default_rng(0))["rerank"]]
    model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / "bench-qwen3", "qwen3", "causal_lm",
                                    **PRESETS["bench"]))
    config, port = start_serve()
    app_args = {**config["applications"][0]["args"], "model": model_dir, "accelerator": "cpu", "engine_replicas": 1,
                "max_queue_wait_s": args.max_queue_wait_s}
    serve.run(build(app_args), name="radixserve", route_prefix="/")
    driver = Driver(f"127.0.0.1:{port}", rerank)
    rng = np.random.default_rng(1)
    driver.closed_loop(args.clients, 5, "warm-up")
    unloaded = [driver.one() for _ in tqdm(range(8), desc="unloaded", unit="req")]
    base = pct(latencies(unloaded), 50)
    capacity_run = driver.closed_loop(args.clients, args.capacity_s, "capacity")
    capacity = sum(code == "OK" for code, _, _ in capacity_run) / args.capacity_s  # answered, not refused
    sustained = driver.open_loop(args.load * capacity, args.sustain_s, f"{args.load:g}x capacity", rng)
    driver.retrying = False
    overloaded = driver.open_loop(args.overload * capacity, args.overload_s, f"{args.overload:g}x capacity", rng)
    stopped, recovery = time.perf_counter(), []
    while len(recovery) < 60:
        recovery.append(driver.one())
        if recovery[-1][0] == "OK" and recovery[-1][1] <= 1.5 * base:
            break
    recovered_s = time.perf_counter() - stopped
    serve.shutdown()
    ray.shutdown()
    report = {
        "unloaded p50 s": base, "unloaded p99 s": pct(latencies(unloaded), 99), "capacity req/s": capacity,
        "sustained": phase(sustained), "overload": phase(overloaded), "recovery s": recovered_s,
    }
    write_report(report, args, sustained, overloaded)


def phase(outcomes) -> dict:
    codes = {}
    for code, _, _ in outcomes:
        codes[code] = codes.get(code, 0) + 1
    refused = latencies(outcomes, "RESOURCE_EXHAUSTED")
    ok = latencies(outcomes, "OK")
    return {"sent": len(outcomes), "codes": codes, "ok p50 s": pct(ok, 50), "ok p99 s": pct(ok, 99),
            "refused p50 s": pct(refused, 50), "refused p99 s": pct(refused, 99)}


def write_report(report: dict, args, sustained, overloaded) -> None:
    s, o = report["sustained"], report["overload"]
    command = (f"python bench/load_bench.py --clients {args.clients} --capacity-s {args.capacity_s:g} --load "
               f"{args.load:g} --sustain-s {args.sustain_s:g} --overload {args.overload:g} --overload-s "
               f"{args.overload_s:g} --max-queue-wait-s {args.max_queue_wait_s:g}")
    rows = [
        "| phase | sent | answers by code | OK p50 s | OK p99 s | refused p50 s | refused p99 s |",
        "|---|---|---|---|---|---|---|",
        f"| {args.load:g}x capacity, {args.sustain_s:g} s | {s['sent']} | {s['codes']} | {s['ok p50 s']:.2f} | "
        f"{s['ok p99 s']:.2f} | {s['refused p50 s']:.3f} | {s['refused p99 s']:.3f} |",
        f"| {args.overload:g}x capacity, {args.overload_s:g} s | {o['sent']} | {o['codes']} | {o['ok p50 s']:.2f} | "
        f"{o['ok p99 s']:.2f} | {o['refused p50 s']:.3f} | {o['refused p99 s']:.3f} |",
    ]
    text = (f"# Load and overload\n\nCommand: `{command}` (2 CPUs, `bench` preset Qwen3 on CPU, rerank requests of 8 "
            "documents; the sustained phase with the client's retries, the overload without).\n\n"
            f"Unloaded latency p50 {report['unloaded p50 s']:.2f} s, "
            f"p99 {report['unloaded p99 s']:.2f} s; capacity {report['capacity req/s']:.2f} requests/s "
            f"({args.clients} closed-loop clients); back within 1.5x the unloaded latency "
            f"{report['recovery s']:.1f} s after the overload stopped.\n\n" + "\n".join(rows) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load_bench.md").write_text(text)
    (args.out / "load_bench.json").write_text(json.dumps(report, indent=1))
    plot(sustained, overloaded, args.out / "load_bench.png")
    print(text)


def plot(sustained, overloaded, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    t0 = min(sent for _, _, sent in sustained + overloaded)
    colours = {"OK": "tab:green", "RESOURCE_EXHAUSTED": "tab:orange"}
    for code in sorted({c for c, _, _ in sustained + overloaded}):
        points = [(sent - t0, lat) for c, lat, sent in sustained + overloaded if c == code]
        ax.scatter(*zip(*points), s=6, label=code, color=colours.get(code, "tab:red"))
    ax.axvline(min(sent for _, _, sent in overloaded) - t0, color="grey", linestyle="--", label="overload starts")
    ax.set_xlabel("request sent at (s)")
    ax.set_ylabel("latency (s)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
