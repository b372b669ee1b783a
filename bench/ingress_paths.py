"""What a small request's way into the engine costs: Ray Serve's proxy or its direct ingress, split or combined.

radixserve serves through Ray Serve's proxies (the default): the client's call reaches a proxy actor, which hands it
to an ingress replica. Ray 2.60 can instead start no proxy and let each ingress replica serve HTTP and gRPC on a port
of its own (`RAY_SERVE_ENABLE_DIRECT_INGRESS=1`, marked experimental; the controller allocates each replica's ports
from `RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT`.. and names them in its target groups). radixserve does not offer it
yet (its launcher's port checks, `/-/healthz` and the hostile-client protections assume the proxy); this measures
what it would save, with each `placement.topology`.

Each combination runs in a child process of its own (the flag is read when Serve starts), in turn, `--rounds`
times with the order reversed every other round: a local Ray and Serve (`bench/local_serve.py`) with
serve_config.yaml's application on a random-weight `--preset` model, one engine replica; `--warm-up` requests,
then `--requests` 8-document reranks one after another from one gRPC `ScoringClient` (latency), then `--clients`
closed-loop clients (`bench/load_driver.py`) sending `--clients` x `--load-requests` more through it (documents/s;
any failed request fails the run). Documents are MS MARCO-shaped passages (40-120 tokens,
`bench/workloads.py`), every request with a query of its own. Writes `bench/results/ingress_paths.md`.

    python bench/ingress_paths.py [--preset tiny] [--rounds 2] [--requests 200] [--clients 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import get_args

import numpy as np
import ray
from load_driver import LoadDriver
from local_serve import app_args, run_app, start_serve
from machine import machine, tiny_model
from ray import serve
from ray.serve.context import _get_global_client
from workloads import MsMarco, msmarco_texts, token_counter

from deployments.config import Topology
from radix_core.tiny_models import PRESETS, make_tiny_model, make_tiny_tokenizer
from radixserve.client import ScoringClient

INGRESSES = ("proxy", "direct")
DIRECT_ENV = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
PASSAGES = 64  # the query's passages, from which each request draws its documents
DOCS = 8  # documents per request


def grpc_address(port: int, direct: bool) -> str:
    """The proxy's gRPC address, or the ingress replica's own under direct ingress (the controller's target group)."""
    if not direct:
        return f"127.0.0.1:{port}"
    details = ray.get(_get_global_client()._controller.get_serve_instance_details.remote())
    targets = [t for g in details["target_groups"] if g["protocol"] == "gRPC" for t in g["targets"]]
    return f"{targets[0]['ip']}:{targets[0]['port']}"


def one(ingress: str, topology: str, model_dir: str, args) -> dict:
    """The figures of one combination, in this process (started with the flag set or not)."""
    config, port = start_serve()
    try:
        run_app(app_args(config, model=model_dir, placement={"topology": topology}))
        address = grpc_address(port, ingress == "direct")
        group = msmarco_texts(np.random.default_rng(args.seed), token_counter(make_tiny_tokenizer()),
                              MsMarco(queries=1, passages_per_query=PASSAGES))[0]
        rng = np.random.default_rng(args.seed + 1)

        def request(i: int) -> tuple[str, list[str]]:
            return f"{group.query} (asked {i})", [group.passages[j] for j in rng.choice(PASSAGES, DOCS, replace=False)]

        latencies = []
        with ScoringClient(address, timeout_s=60, retries=5) as client:
            for i in range(args.warm_up):
                client.rerank(*request(-1 - i))
            for i in range(args.requests):
                query, docs = request(i)
                began = time.perf_counter()
                client.rerank(query, docs)
                latencies.append(time.perf_counter() - began)
            total = args.clients * args.load_requests
            loaded = iter([request(args.requests + i) for i in range(total)])
            began = time.perf_counter()
            outcomes = LoadDriver(lambda r: (client.rerank(*r), 0)[1], loaded).closed_loop(
                args.clients, label=f"{ingress}, {topology}", total=total)
            seconds = time.perf_counter() - began
        failed = [o for o in outcomes if o.code != "OK"]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(outcomes)} requests failed, the first with {failed[0].error}")
        docs_s = DOCS * total / seconds
        return {"p50_ms": 1e3 * statistics.median(latencies),
                "p90_ms": 1e3 * statistics.quantiles(latencies, n=10)[-1], "docs_s": docs_s}
    finally:
        serve.shutdown()
        ray.shutdown()


def run_child(ingress: str, topology: str, model_dir: str, argv: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != DIRECT_ENV}
    if ingress == "direct":
        env[DIRECT_ENV] = "1"
    out = subprocess.run([sys.executable, __file__, *argv, "--one", ingress, topology, model_dir], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{ingress}, {topology}: exit {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm-up", type=int, default=20)
    parser.add_argument("--requests", type=int, default=200, help="sequential requests (latency)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--load-requests", type=int, default=100, help="requests per client at load")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--one", nargs=3, metavar=("INGRESS", "TOPOLOGY", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one, args)))
        return
    argv = sys.argv[1:]
    model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / "model", "qwen3", "causal_lm", **PRESETS[args.preset]))
    combos = [(i, t) for t in get_args(Topology) for i in INGRESSES]
    results: dict[tuple[str, str], list[dict]] = {c: [] for c in combos}
    for round_ in range(args.rounds):
        for combo in combos if round_ % 2 == 0 else combos[::-1]:
            results[combo].append(run_child(*combo, model_dir, argv))
            print(combo, results[combo][-1], flush=True)
    lines = ["# A small request's way into the engine", "",
             f"Command: `{' '.join(['python', 'bench/ingress_paths.py', *argv])}`; {tiny_model(args.preset)} on "
             f"{machine()}; {DOCS}-document MS MARCO-shaped reranks over gRPC, {args.requests} from one client, then "
             f"{args.clients} clients x {args.load_requests}; each round's figure, rounds in turn (the order "
             "reversed every other round).", "",
             "| topology | ingress | one client, median ms | one client, p90 ms | clients, docs/s |",
             "|---|---|---|---|---|"]
    for ingress, topology in combos:
        rs = results[(ingress, topology)]
        p50, p90, rate = (", ".join(format(r[key], spec) for r in rs)
                          for key, spec in (("p50_ms", ".1f"), ("p90_ms", ".1f"), ("docs_s", ".0f")))
        lines.append(f"| {topology} | {ingress} | {p50} | {p90} | {rate} |")
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ingress_paths.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
