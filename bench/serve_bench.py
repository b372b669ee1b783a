"""The served path end to end against the engine in-process and against what users deploy today.

One run, one machine, the same model (the `bench` preset: Qwen3, hidden 512, 8 layers, random weights, float32 on
CPU) and the same request streams for every configuration:

* `in-process`: `Engine.run_jobs` on the requests in arrival order, `--clients` requests per batch (what a server
  with that many requests in flight could batch at best), the radix mode `auto`, warmed up as the replica is
  (`Engine.warm_up`: without it `auto` chooses by an uncalibrated cost model), in a child process without Ray
  (`bench/child_process.py` says why);
* `served`: the application as `serve run serve_config.yaml` builds it (`deployments.app:build` with the YAML's
  args, `placement.accelerator: cpu`, one engine replica, `placement.topology` as `--topology` says, CPU
  reservations and the radix mode at their defaults), called through Ray Serve's gRPC proxy by `--clients`
  concurrent `ScoringClient`s;
* each of those with the prefix cache at its default (`engine.prefix_cache_bytes: auto`) and off (`0`);
* `padded baseline` (`bench/padded_baseline.py`): a Ray Serve deployment with `@serve.batch` running
  transformers' `AutoModelForCausalLM` on right-padded batches (the reranker's yes/no logits, the LM head at the
  last token only; the last token's final hidden state for embeddings), the same prompts, reserving the same CPUs
  as the engine and ingress together; called through its DeploymentHandle (no proxy, which favours it).

In-process and served run round by round with the same cache setting, alternating which goes first, after a warm-up
round each (both caches then hold what the warm-up left), so other load on the machine touches both alike; the
load generator (this process) runs at the replicas' priority (`placement.niceness`, 0). Each served round reads the
server's stage trace (`Ingress.info`: the ingress's encode, engine call and merge, the replica's share of the engine
call, the batcher's stages per batch), so a gap between served and in-process shows where it is.

Streams (`bench/workloads.py`): MS MARCO-shaped rerank (`--queries` queries x `--docs` passages of 40-120
tokens, shuffled requests of `--request-docs` passages of one query) and embedding with an instruction
(`--embed-texts` of the same passages, `--request-docs` per request). Every request is sent once by `--clients`
closed-loop clients (`bench/load_driver.py`). Each round sends a stream of its own, drawn afresh from that shape
(new queries, passages and texts; the prompt template and the instruction stay), the same one to in-process and
served: a cache then saves what a stream shares, never a round's answers to the round before it (which the same
requests sent again would be: the embedding texts would all be cached after two rounds).

    python bench/serve_bench.py [--clients 8] [--queries 12] [--docs 32] [--streams rerank embed] [--no-baseline]
                                [--topology split|combined]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import get_args

import numpy as np
import ray
from child_process import ChildProcess
from in_process_worker import serve_bench_candidate
from load_driver import LoadDriver
from local_serve import app_args, run_app, start_serve
from machine import plot_title, tiny_model
from ray import serve
from tqdm import tqdm
from workloads import (
    MsMarco,
    embed_requests,
    msmarco_texts,
    rerank_stream,
    token_counter,
)

from deployments.batcher import BATCH_STAGES
from deployments.config import Topology
from radix_core.tiny_models import PRESETS, make_tiny_model, make_tiny_tokenizer
from radixserve.client import ScoringClient

CACHES = {"default": "auto", "off": 0}  # engine.prefix_cache_bytes of each configuration


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


def compare(model_dir: str, cache: str, rounds: list[list[tuple[str, dict]]], clients: int, config: dict,
            port: int, topology: str) -> dict[str, dict]:
    """In-process and served with the prefix cache `cache`, round by round (each sends every request of its round
    once; the first round is a warm-up), alternating which goes first, so the machine's drift touches both
    alike. Each gets its round of median docs/s; the served one also its rounds' stage trace, and the ratio of
    each round's pair."""
    engine = ChildProcess(serve_bench_candidate, model_dir, CACHES[cache], rounds, clients)
    handle = run_app(app_args(config, model=model_dir, engine={"prefix_cache_bytes": CACHES[cache]},
                              placement={"accelerator": "cpu", "topology": topology, "engine": {"num_replicas": 1}}))
    with ScoringClient(f"127.0.0.1:{port}", timeout_s=600) as client:
        runners = {"in-process": lambda r: engine.call("in-process", r),
                   "served": lambda r: served(client, handle, rounds[r], clients)}
        runs: dict[str, list[dict]] = {name: [] for name in runners}
        for r in tqdm(range(len(rounds)), desc=f"cache {cache}", unit="round"):
            for name in (list(runners) if r % 2 else list(runners)[::-1]):
                runs[name].append(runners[name](r))
    serve.delete("radixserve")
    engine.close()
    ratios = [i["seconds"] / s["seconds"] for i, s in zip(runs["in-process"][1:], runs["served"][1:])]
    best = {name: median_round(rounds[0], timed[1:]) for name, timed in runs.items()}
    best["served"]["ratios"] = ratios
    return {f"{name}, cache {cache}": result for name, result in best.items()}


def served(client: ScoringClient, handle, requests: list[tuple[str, dict]], clients: int) -> dict:
    """Every request through the gRPC proxy by `clients` closed-loop clients, with the server's stage trace of
    the round (`trace`)."""
    def call(task: str, request: dict) -> int:
        return getattr(client, task)(**request).usage.input_tokens

    before = handle.info.remote().result()  # the ingress's, with its one engine replica's counts
    seconds, latencies, tokens = drive(call, requests, clients, "served")
    after = handle.info.remote().result()
    computed, tokens_run = (after[key] - before[key] for key in ("computed_tokens", "input_tokens"))
    compression = computed / tokens_run
    return {"seconds": seconds, "latencies": latencies, "tokens": tokens, "compression": compression,
            "trace": trace(before, after, latencies)}


def trace(before: dict, after: dict, latencies: list[float]) -> dict[str, float]:
    """Milliseconds per request of each stage between two `Ingress.info` reads: the ingress's encode, engine call
    and merge, the replica's share of the engine call, the hops (engine call less the replica's share: Ray's
    handle call, pickling, the replica's event loop), the client's latency less the ingress's stages (the gRPC
    proxy and client); and per batch: items and the batcher's stages."""
    def grown(stages: str, stage: str) -> tuple[int, float]:
        now, then = after[stages][stage], before[stages][stage]
        return now["count"] - then["count"], now["seconds"] - then["seconds"]

    per_request = {stage: 1000 * s / max(n, 1) for stage, (n, s) in
                   ((stage, grown("request_stages", stage)) for stage in ("encode", "engine", "merge"))}
    calls, replica_s = grown("engine_request_stages", "replica")
    per_request["replica"] = 1000 * replica_s / max(calls, 1)
    per_request["hops"] = per_request["engine"] - per_request["replica"]
    per_request["proxy"] = 1000 * float(np.mean(latencies)) - sum(per_request[s] for s in ("encode", "engine",
                                                                                            "merge"))
    batcher, then = after["batcher"], before["batcher"]
    batches = max(batcher["num_batches"] - then["num_batches"], 1)
    per_batch = {"batches": batcher["num_batches"] - then["num_batches"],
                 "items": (batcher["num_items"] - then["num_items"]) / batches,
                 **{stage: 1000 * (batcher[f"total_{stage}_s"] - then[f"total_{stage}_s"]) / batches
                    for stage in BATCH_STAGES}}
    return {**{f"{k} ms": v for k, v in per_request.items()}, **{f"batch {k}": v for k, v in per_batch.items()}}


def median_round(requests: list[tuple[str, dict]], runs: list[dict]) -> dict:
    """The summary of the round of median seconds (every round has as many items as `requests`)."""
    run = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    return {**summary(requests, run["seconds"], run["latencies"], run["tokens"], run["compression"]),
            **({"trace": run["trace"]} if "trace" in run else {})}


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
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of each, after a warm-up round")
    parser.add_argument("--streams", nargs="+", choices=("rerank", "embed"), default=["rerank", "embed"])
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="leave the padded baseline out (a shorter run)")
    parser.add_argument("--topology", choices=get_args(Topology), default="split",
                        help="placement.topology of the served application")
    args = parser.parse_args()
    model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / "bench-qwen3", "qwen3", "causal_lm",
                                    **PRESETS["bench"]))
    rng = np.random.default_rng(args.seed)
    drawn = [streams(args, rng) for _ in range(args.repeats + 1)]  # a warm-up round, then the timed ones
    work = {name: [round_[name] for round_ in drawn] for name in args.streams}
    cpus = float(os.cpu_count() or 1)
    results, load_before = {}, os.getloadavg()[0]
    config, port = start_serve()
    for name, rounds in work.items():
        for cache in CACHES:
            compared = compare(model_dir, cache, rounds, args.clients, config, port, args.topology)
            results.update({(name, label): r for label, r in compared.items()})
        if args.baseline:
            results[name, "padded baseline"] = baseline(model_dir, rounds[-1], args.clients, cpus)
    serve.shutdown()
    ray.shutdown()
    write_report(results, args, cpus, (load_before, os.getloadavg()[0]))


def write_report(results: dict, args, cpus: float, loads: tuple[float, float]) -> None:
    rows = ["| stream | configuration | docs/s | tokens/s | p50 s | p90 s | p99 s | N'/N | vs in-process, same cache "
            "| each round's served / in-process | vs baseline |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (stream, label), r in results.items():
        cache = label.rpartition("cache ")[2] or "default"
        ratio = {ref: ratio_to(r, results.get((stream, ref)))
                 for ref in (f"in-process, cache {cache}", "padded baseline")}
        rounds = ", ".join(f"{x:.2f}" for x in r.get("ratios", [])) or "-"
        rows.append(f"| {stream} | {label} | {r['docs/s']:.1f} | {r['tokens/s']:.0f} | {r['p50 s']:.2f} | "
                    f"{r['p90 s']:.2f} | {r['p99 s']:.2f} | {r['compression']:.3f} | "
                    f"{ratio[f'in-process, cache {cache}']} | {rounds} | {ratio['padded baseline']} |")
    traced = [(key, r["trace"]) for key, r in results.items() if "trace" in r]
    columns = list(traced[0][1]) if traced else []
    trace_rows = ["| stream | configuration | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    trace_rows += [f"| {stream} | {label} | " + " | ".join(f"{t[c]:.1f}" for c in columns) + " |"
                   for (stream, label), t in traced]
    command = (f"python bench/serve_bench.py --clients {args.clients} --queries {args.queries} --docs {args.docs} "
               f"--request-docs {args.request_docs} --embed-texts {args.embed_texts} --repeats {args.repeats} "
               f"--streams {' '.join(args.streams)} --topology {args.topology}"
               + ("" if args.baseline else " --no-baseline"))
    text = (f"# The served path\n\nCommand: `{command}` ({cpus:.0f} CPUs, 1-minute load average {loads[0]:.1f} "
            f"before and {loads[1]:.1f} after, `bench` preset Qwen3, float32; see the script's docstring for each "
            "configuration). In-process and served alternate round by round; each row is its round of median time. "
            "Latency is per request as its client saw it; N'/N is the rows computed (after in-batch sharing and the "
            "prefix cache) over the input tokens: in-process from the answers' usage, served by the engine replica's "
            "own count.\n\n" + "\n".join(rows)
            + "\n\nThe served rounds' stage trace (that round's, from `Ingress.info`: per request, ms: the ingress's "
            "encode, engine call and merge, the replica's time from the call's arrival to its answer, hops = engine "
            "call less replica, proxy = the client's latency less the ingress's stages; per batch: items, and ms of "
            "queue (the oldest item's), build, wait for the device, forward):\n\n" + "\n".join(trace_rows) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_bench.md").write_text(text)
    (args.out / "serve_bench.json").write_text(json.dumps({f"{s} | {c}": {k: v for k, v in r.items()
                                                                       if k != "latencies"}
                                                         for (s, c), r in results.items()}, indent=1))
    plot(results, args.out / "serve_bench.png")
    print(text)


def ratio_to(result: dict, reference: dict | None) -> str:
    return f"{result['docs/s'] / reference['docs/s']:.2f}" if reference is not None else "-"


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
        lat = results[streams_[0], label]["latencies"]
        cdf.plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=label)
    bars.set_xticks(np.arange(len(streams_)) + width * (len(labels) - 1) / 2, streams_)
    bars.set_ylabel("documents / s")
    bars.legend(fontsize=8)
    cdf.set_xlabel(f"{streams_[0]} request latency (s)")
    cdf.set_ylabel("fraction of requests")
    cdf.legend(fontsize=8)
    fig.suptitle(plot_title("the served path against the engine in-process and a padded baseline", tiny_model("bench")),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
