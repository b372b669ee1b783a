"""Routing and pipelining of the Ray Serve application, on a local Ray with a tiny model on the CPU.

Stream: 32 queries x 64 documents as 8-document rerank requests (256 requests), sent through the ingress by
concurrent clients either one request at a time in shuffled order (`shuffled`) or a query's 8 requests together
(`bursts`). Each configuration deploys the app afresh and sends the same stream:

* prefix routing (PrefixAffinityRouter) vs Ray Serve's default router, 4 engine replicas each: the batches'
  compression (the rows the replicas computed, after in-batch sharing and their prefix caches, over their batches'
  tokens, each replica's own count from `EngineReplica.info`), throughput, and requests per replica (the parts its
  batcher ran: one per 8-document request; max / mean);
* one engine replica: the compression a single replica reaches on the same stream (the routing target is at
  least 0.9 of it);
* pipelining: one replica with the IndexBuilder actor (tokenize + index batch k+1 while batch k runs) vs
  building each batch inline, same stream.

    python bench/routing_bench.py [--clients 16] [--out bench/results/routing_bench.md]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import ray
from machine import plot_title, tiny_model
from ray import serve
from tqdm import tqdm

from deployments.app import build
from radix_core.tiny_models import make_tiny_model

WORDS = ("radix tree prefix token batch replica query passage shared compute router cache index score model "
         "attention layer sequence document search engine relevant answer question").split()


def queries(seed: int = 0) -> list[list[dict]]:
    """32 queries, each as its 8 rerank requests of 8 documents (64 documents per query)."""
    rng = random.Random(seed)
    text = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    groups = []
    for q in range(32):
        query = f"question {q}: " + text(rng.randint(6, 14))
        documents = [text(rng.randint(30, 90)) for _ in range(64)]
        groups.append([{"query": query, "documents": documents[i:i + 8]} for i in range(0, 64, 8)])
    return groups


def shuffled(groups: list[list[dict]], seed: int = 1) -> list[list[dict]]:
    """Every request on its own, in shuffled order (a query's requests spread over the whole run)."""
    units = [[request] for group in groups for request in group]
    random.Random(seed).shuffle(units)
    return units


def bursts(groups: list[list[dict]], seed: int = 1) -> list[list[dict]]:
    """Each query's 8 requests sent together (a client splitting 64 documents), queries in shuffled order."""
    units = list(groups)
    random.Random(seed).shuffle(units)
    return units


async def send(handle, units: list[list[dict]], clients: int) -> float:
    """Seconds to serve every unit; each of `clients` senders sends one unit's requests concurrently at a time."""
    queue = list(units)

    async def client():
        while queue:
            await asyncio.gather(*(handle.call.remote("rerank", request) for request in queue.pop()))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - start


def engine_totals(replicas: int, timeout_s: float = 30.0) -> dict[str, dict[str, int]]:
    """Per engine replica (its id): the batches and parts it ran, their tokens and the rows it computed, by its own
    count; asked through a handle of the engine deployment (its calls spread over the replicas) until each of
    `replicas` answered."""
    handle = serve.get_deployment_handle("EngineReplica", app_name="radixserve")
    seen, deadline = {}, time.monotonic() + timeout_s
    while len(seen) < replicas:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {replicas} engine replicas answered info in {timeout_s} s")
        info = handle.info.remote().result(timeout_s=timeout_s)
        seen[info["replica"]] = {"batches": info["batcher"]["num_batches"], "requests": info["batcher"]["num_items"],
                                 "tokens": info["input_tokens"], "computed": info["computed_tokens"]}
    return seen


def run_config(model_dir: str, units: list[list[dict]], clients: int, replicas: int, policy: str,
               index_builder: str) -> dict:
    args = {"model": model_dir, "router": {"policy": policy},
            "batching": {"index_builder": index_builder, "batch_wait_timeout_s": 0.02},
            "placement": {"engine": {"num_replicas": replicas, "cpus": 1.5 / replicas}, "ingress": {"cpus": 0.25}}}
    handle = serve.run(build(args), name="radixserve", route_prefix=None)
    asyncio.run(send(handle, units[:2], clients))  # warm-up: replicas loaded, routers' caches filled
    warm = engine_totals(replicas)
    seconds = asyncio.run(send(handle, units, clients))
    done = engine_totals(replicas)
    serve.delete("radixserve")
    delta = [{key: count - warm[replica][key] for key, count in counts.items()} for replica, counts in done.items()]
    per_replica = [d["requests"] for d in delta]
    return {"seconds": seconds, "docs_per_s": sum(len(r["documents"]) for u in units for r in u) / seconds,
            "compression": sum(d["computed"] for d in delta) / sum(d["tokens"] for d in delta),
            "batches": sum(d["batches"] for d in delta), "requests": per_replica,
            "max_over_mean": max(per_replica) / (sum(per_replica) / len(per_replica))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "routing_bench.md")
    args = parser.parse_args()
    model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / "tiny-reranker", "qwen3", "causal_lm"))
    groups = queries()
    streams = {"shuffled": (shuffled(groups), args.clients), "bursts": (bursts(groups), max(1, args.clients // 8))}
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}})
    serve.start(proxy_location="Disabled")
    configs = [(stream, label, replicas, policy, builder)
               for stream in streams
               for label, replicas, policy, builder in (("prefix routing, 4 replicas", 4, "prefix_affinity", "actor"),
                                                        ("default router, 4 replicas", 4, "power_of_two", "actor"),
                                                        ("one replica", 1, "prefix_affinity", "actor"))]
    configs.append(("shuffled", "one replica, index built inline", 1, "prefix_affinity", "inline"))
    results = {}
    for stream, label, replicas, policy, builder in tqdm(configs, desc="configurations", unit="config"):
        units, clients = streams[stream]
        results[stream, label] = run_config(model_dir, units, clients, replicas, policy, builder)
        tqdm.write(f"{stream} {label} {results[stream, label]}")
    serve.shutdown()
    ray.shutdown()
    write_report(results, args)


def write_report(results: dict, args) -> None:
    rows = ["| stream | configuration | N'/N | vs one replica | batches | requests per replica | max/mean | docs/s |",
            "|---|---|---|---|---|---|---|---|"]
    for (stream, label), r in results.items():
        single = results[stream, "one replica"]["compression"]
        rows.append(f"| {stream} | {label} | {r['compression']:.3f} | {single / r['compression']:.2f} | "
                    f"{r['batches']} | {r['requests']} | {r['max_over_mean']:.2f} | {r['docs_per_s']:.0f} |")
    pipelined = (results["shuffled", "one replica"]["docs_per_s"]
                 / results["shuffled", "one replica, index built inline"]["docs_per_s"])
    text = (f"# Routing and pipelining\n\nCommand: `python bench/routing_bench.py --clients {args.clients}` "
            "(tiny Qwen3 reranker, CPU, 2 cores; 32 queries x 64 documents as 256 rerank requests of 8 documents; "
            "`shuffled`: every request alone in shuffled order from the clients; `bursts`: each query's 8 requests "
            "sent together, clients / 8 senders).\n\n"
            "`vs one replica` is the single replica's N'/N divided by this one's on the same stream (1.0 = as much "
            "sharing as one replica finds; the target for prefix routing is >= 0.9).\n\n" + "\n".join(rows)
            + f"\n\nPipelined IndexBuilder vs inline build, one replica, shuffled stream: {pipelined:.2f}x "
              "throughput.\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + f"\n![N'/N and throughput per configuration]({args.out.with_suffix('.png').name})\n")
    plot(results, args.out.with_suffix(".png"))
    print(text)


def plot(results: dict, path: Path) -> None:
    """Throughput and N'/N of each configuration, one group of bars per stream."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{stream}: {label}" for stream, label in results]
    fig, (speed, ratio) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    speed.barh(names, [r["docs_per_s"] for r in results.values()])
    speed.set(xlabel="documents/s")
    ratio.barh(names, [r["compression"] for r in results.values()])
    ratio.set(xlabel="N'/N (lower: more shared)", xlim=(0, 1))
    fig.suptitle(plot_title("routing and pipelining", tiny_model("tiny")), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
