"""How fast bad input is refused, and `Info` answered, while the engine computes, on each `placement.topology`.

With `combined` the ingress's event loop shares a process with the engine's forward; this measures whether a
stranger's malformed request, or an operator's `Info`, waits for it. For each topology in turn, on a local Ray Serve
with serve_config.yaml's application (`bench/local_serve.py`; the model a random-weight `--preset`, one engine
replica): `--busy-clients` gRPC clients send `--docs`-document reranks without pause, and after `--settle-s` one
more client sends `--probes` reranks with an empty document (refused INVALID_ARGUMENT at the ingress, before any
tokenizing) and `Info` calls, one every `--gap-s`. Reports the median and largest latency of each, and how many
busy reranks were answered meanwhile (the engine was computing throughout). Writes `bench/results/busy_refusals.md`.

    python bench/busy_refusals.py [--preset tiny] [--docs 1000] [--probes 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import get_args

import grpc
import ray
from local_serve import app_args, run_app, start_serve
from machine import machine, tiny_model
from ray import serve

from deployments.config import Topology
from radix_core.tiny_models import PRESETS, make_tiny_model
from radixserve.client import ScoringClient


def probe(model_dir: str, topology: str, args) -> dict[str, float]:
    """Latencies (ms) of the refusals and `Info` calls made while the busy clients kept the engine computing."""
    config, port = start_serve()
    try:
        run_app(app_args(config, model=model_dir, placement={"topology": topology}))
        address = f"127.0.0.1:{port}"
        docs = [f"passage {i}: {'a radix tree stores strings by their shared prefixes ' * 8}" for i in
                range(args.docs)]
        with ScoringClient(address, timeout_s=300, retries=5) as client:
            client.rerank("warm up", docs[:8])
        done = threading.Event()
        answered = [0] * args.busy_clients

        def busy(i: int) -> None:
            with ScoringClient(address, timeout_s=600) as client:
                while not done.is_set():
                    client.rerank(f"busy query {i} {answered[i]}", docs)
                    answered[i] += 1

        threads = [threading.Thread(target=busy, args=(i,)) for i in range(args.busy_clients)]
        for thread in threads:
            thread.start()
        time.sleep(args.settle_s)
        refusals, infos = [], []
        with ScoringClient(address, timeout_s=60, retries=0) as client:
            for _ in range(args.probes):
                began = time.perf_counter()
                try:
                    client.rerank("a query", ["a document", ""])
                    raise RuntimeError("a rerank with an empty document was answered")
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
                        raise
                refusals.append(time.perf_counter() - began)
                began = time.perf_counter()
                client.info()
                infos.append(time.perf_counter() - began)
                time.sleep(args.gap_s)
        done.set()
        for thread in threads:
            thread.join()
        return {"refusal_p50": 1e3 * statistics.median(refusals), "refusal_max": 1e3 * max(refusals),
                "info_p50": 1e3 * statistics.median(infos), "info_max": 1e3 * max(infos),
                "busy_answered": sum(answered)}
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--docs", type=int, default=1000, help="documents per busy rerank")
    parser.add_argument("--busy-clients", type=int, default=2)
    parser.add_argument("--probes", type=int, default=20, help="refused reranks, and Info calls, each")
    parser.add_argument("--gap-s", type=float, default=0.2, help="pause between probes")
    parser.add_argument("--settle-s", type=float, default=3.0, help="busy time before the first probe")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / "model", "qwen3", "causal_lm", **PRESETS[args.preset]))
    lines = ["# Bad input refused while the engine computes", "",
             f"Command: `{' '.join(['python', 'bench/busy_refusals.py', *sys.argv[1:]])}`; {tiny_model(args.preset)} "
             f"on {machine()}; {args.busy_clients} clients sending {args.docs}-document reranks without pause, "
             f"{args.probes} refused reranks (an empty document) and {args.probes} `Info` calls between them.", "",
             "| topology | refusal ms, median | refusal ms, max | Info ms, median | Info ms, max "
             "| busy reranks answered |",
             "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for topology in get_args(Topology):
        r = probe(model_dir, topology, args)
        lines.append(f"| {topology} | {r['refusal_p50']:.1f} | {r['refusal_max']:.1f} | {r['info_p50']:.1f} | "
                     f"{r['info_max']:.1f} | {r['busy_answered']} |")
        print(lines[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "busy_refusals.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
