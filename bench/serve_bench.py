"""The served path end to end against the engine in-process and against what users deploy today.

One run, one machine, the same model (the `bench` preset: Qwen3, hidden 512, 8 layers, random weights, float32 on
CPU) and the same request streams for every configuration:

* `in-process`: `Engine.run_jobs` on the requests in arrival order, `--clients` requests per batch (what a server
  with that many requests in flight could batch at best), no Ray;
* `served auto` / `served off`: the application as `serve run serve_config.yaml` builds it (`deployments.app:build`
  with the YAML's args, `placement.accelerator: cpu`, one engine replica, CPU reservations at their defaults, the
  prefix cache on as by default, so `off` too reads a query's template and query once cached), called
  through Ray Serve's gRPC proxy by `--clients` concurrent `ScoringClient`s;
* `padded baseline` (`bench/padded_baseline.py`): a Ray Serve deployment with `@serve.batch` running
  transformers' `AutoModelForCausalLM` on right-padded batches (the reranker's yes/no logits, the LM head at the
  last token only; the last token's final hidden state for embeddings), the same prompts, reserving the same CPUs
  as the engine and ingress together; called through its DeploymentHandle (no proxy, which favours it).

Streams (`bench/workloads.py`): MS MARCO-shaped rerank (`--queries` queries x `--docs` passages of 40-120
tokens, shuffled requests of `--request-docs` passages of one query) and embedding with an instruction
(`--embed-texts` of the same passages, `--request-docs` per request). Every request is sent once by `--clients`
closed-loop clients (`bench/load_driver.py`).

    python bench/serve_bench.py [--clients 8] [--queries 12] [--docs 32] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
from load_driver import LoadDriver
from local_serve import start_serve
from machine import plot_title, tiny_model
from ray import serve
from routing_bench import builder_stats
from tqdm import tqdm
from workloads import (
    MsMarco,
    embed_requests,
    msmarco_texts,
    rerank_stream,
    token_counter,
)

from deployments.app import build
from radix_core.engine import Engine
from radix_core.tasks import TASKS
from radix_core.tiny_models import PRESETS, make_tiny_model, make_tiny_tokenizer
from radixserve.client import ScoringClient


def streams(args, rng: np.random.Generator) -> dict[str, list[tuple[str, dict]]]:
    """Per stream the (task, request) list in the order clients send it."""
    shape = MsMarco(queries=args.queries, passages_per_query=args.docs)
    groups = msmarco_texts(rng, token_counter(make_tiny_tokenizer()), shape)
    rerank = rerank_stream(groups, args.request_docs, rng)
    passages = [p for g in groups for p in g.passages]
    texts = [passages[i] for i in rng.permutation(len(passages))[:args.embed_texts]]
    return {"rerank": [("rerank", r) for r in rerank],
            "embed": [("embed", r) for r in embed_requests(texts, args.request_docs)]}


def items(request: dict) -> int:
    return len(request.get("documents") or request.get("texts"))


def in_process(model_dir: str, requests: list[tuple[str, dict]], clients: int) -> dict:
    """The engine alone: `clients` consecutive requests per batch; every request's latency is its batch's."""
    engine = Engine.from_pretrained(model_dir, device="cpu", radix="auto")
    jobs = [(TASKS[task], TASKS[task].encode(engine.context, request)) for task, request in requests]
    engine.run_jobs([job for _, job in jobs[:clients]])  # warm-up
    latencies, tokens, computed = [], 0, 0
    start = time.perf_counter()
    for i in tqdm(range(0, len(jobs), clients), desc="in-process", unit="batch"):
        began = time.perf_counter()
        chunk = jobs[i:i + clients]
        results = [task.merge(job, [p]) for (task, job), p in zip(chunk, engine.run_jobs([j for _, j in chunk]))]
        latencies += [time.perf_counter() - began] * len(chunk)
        tokens += sum(r.usage.input_tokens for r in results)
        computed += sum(r.usage.computed_tokens for r in results)
    return summary(requests, time.perf_counter() - start, latencies, tokens, computed / tokens)


def drive(call, requests: list[tuple[str, dict]], clients: int, label: str) -> tuple[float, list[float], int]:
    """(seconds, per-request latencies, input tokens) of every request sent once by `clients` closed-loop
    clients; every request must succeed (a failure would make the figures meaningless), else a RuntimeError says
    how many failed and why."""
    start = time.perf_counter()
    outcomes = LoadDriver(lambda item: call(*item), iter(requests)).closed_loop(clients, label=label,
                                                                                 total=len(requests))
    seconds = time.perf_counter() - start
    failed = [o for o in outcomes if o.code != "OK"]
    if failed:
        raise RuntimeError(f"{label}: {len(failed)} of {len(requests)} requests failed, the first with "
                           f"{failed[0].error}")
    return seconds, [o.latency_s for o in outcomes], sum(o.tokens for o in outcomes)


def served(model_dir: str, radix: str, requests: list[tuple[str, dict]], clients: int, config: dict,
           port: int) -> dict:
    """The application of `config` (serve_config.yaml) through the gRPC proxy on `port`."""
    app = config["applications"][0]
    args = {**app["args"], "model": model_dir, "engine": {"radix": radix},
            "placement": {"accelerator": "cpu", "engine": {"num_replicas": 1}}}
    serve.run(build(args), name="radixserve", route_prefix="/")
    with ScoringClient(f"127.0.0.1:{port}", timeout_s=600) as client:
        def call(task: str, request: dict) -> int:
            return getattr(client, task)(**request).usage.input_tokens

        drive(call, requests[:clients], clients, f"warm-up {radix}")
        before = builder_totals()
        seconds, latencies, tokens = drive(call, requests, clients, f"served {radix}")
        after = builder_totals()
    serve.delete("radixserve")
    compression = (after["compact_tokens"] - before["compact_tokens"]) / (after["tokens"] - before["tokens"])
    return summary(requests, seconds, latencies, tokens, compression)


def builder_totals() -> dict[str, int]:
    stats = builder_stats()
    return {key: sum(s[key] for s in stats) for key in ("tokens", "compact_tokens")}


def baseline(model_dir: str, requests: list[tuple[str, dict]], clients: int, cpus: float) -> dict:
    """The padded transformers deployment (`bench/padded_baseline.py`) through its handle."""
    from padded_baseline import PaddedBaseline

    handle = serve.run(PaddedBaseline.options(ray_actor_options={"num_cpus": cpus}).bind(model_dir, clients),
                       name="baseline", route_prefix=None)

    def call(task: str, request: dict) -> int:
        return getattr(handle, task).remote(request).result(timeout_s=600)

    drive(call, requests[:clients], clients, "warm-up baseline")
    seconds, latencies, tokens = drive(call, requests, clients, "padded baseline")
    serve.delete("baseline")
    return summary(requests, seconds, latencies, tokens, 1.0)


def summary(requests, seconds: float, latencies: list[float], tokens: int, compression: float) -> dict:
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99]).tolist()
    return {"docs/s": sum(items(r) for _, r in requests) / seconds, "tokens/s": tokens / seconds, "p50 s": p50,
            "p90 s": p90, "p99 s": p99, "compression": compression, "latencies": sorted(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--queries", type=int, default=12)
    parser.add_argument("--docs", type=int, default=32, help="documents per query")
    parser.add_argument("--request-docs", type=int, default=8, help="documents (or texts) per request")
    parser.add_argument("--embed-texts", type=int, default=96)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / "bench-qwen3", "qwen3", "causal_lm",
                                    **PRESETS["bench"]))
    work = streams(args, np.random.default_rng(args.seed))
    cpus = float(os.cpu_count() or 1)
    results = {(name, "in-process"): in_process(model_dir, requests, args.clients) for name, requests in work.items()}
    config, port = start_serve()
    for name, requests in work.items():
        for radix in ("auto", "off"):
            results[name, f"served {radix}"] = served(model_dir, radix, requests, args.clients, config, port)
        results[name, "padded baseline"] = baseline(model_dir, requests, args.clients, cpus)
    serve.shutdown()
    ray.shutdown()
    write_report(results, args, cpus)


def write_report(results: dict, args, cpus: float) -> None:
    rows = ["| stream | configuration | docs/s | tokens/s | p50 s | p90 s | p99 s | N'/N | vs in-process "
            "| vs served off | vs baseline |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (stream, label), r in results.items():
        ratio = {ref: r["docs/s"] / results[stream, ref]["docs/s"]
                 for ref in ("in-process", "served off", "padded baseline")}
        rows.append(f"| {stream} | {label} | {r['docs/s']:.1f} | {r['tokens/s']:.0f} | {r['p50 s']:.2f} | "
                    f"{r['p90 s']:.2f} | {r['p99 s']:.2f} | {r['compression']:.3f} | {ratio['in-process']:.2f} | "
                    f"{ratio['served off']:.2f} | {ratio['padded baseline']:.2f} |")
    command = (f"python bench/serve_bench.py --clients {args.clients} --queries {args.queries} --docs {args.docs} "
               f"--request-docs {args.request_docs} --embed-texts {args.embed_texts}")
    text = (f"# The served path\n\nCommand: `{command}` ({cpus:.0f} CPUs, `bench` preset Qwen3, float32; see the "
            "script's docstring for each configuration). Latency is per request as its client saw it; N'/N is the "
            "compression of the batches the engine ran.\n\n" + "\n".join(rows) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_bench.md").write_text(text)
    (args.out / "serve_bench.json").write_text(json.dumps({f"{s} | {c}": {k: v for k, v in r.items()
                                                                       if k != "latencies"}
                                                         for (s, c), r in results.items()}, indent=1))
    plot(results, args.out / "serve_bench.png")
    print(text)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams_ = sorted({s for s, _ in results})
    labels = [c for s, c in results if s == streams_[0]]
    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        bars.bar(np.arange(len(streams_)) + i * width, [results[s, label]["docs/s"] for s in streams_], width,
                 label=label)
        lat = results["rerank", label]["latencies"]
        cdf.plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=label)
    bars.set_xticks(np.arange(len(streams_)) + width * (len(labels) - 1) / 2, streams_)
    bars.set_ylabel("documents / s")
    bars.legend(fontsize=8)
    cdf.set_xlabel("rerank request latency (s)")
    cdf.set_ylabel("fraction of requests")
    cdf.legend(fontsize=8)
    fig.suptitle(plot_title("the served path against the engine in-process and a padded baseline", tiny_model("bench")),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
