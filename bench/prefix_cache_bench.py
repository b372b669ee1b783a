"""The prefix cache served end to end (issue 23): the application through Ray Serve's gRPC proxy, side by side in one
run, with and without the cache and under each router.

Machine: everything on this one machine. On the 2-CPU machine of the committed results: 2 CPU engine replicas
(`placement.engine.num_replicas: 2`, CPU reservations at their defaults: 0.875 CPU and one torch thread each), one
ingress, Ray Serve's gRPC proxy, and `--clients` closed-loop `ScoringClient`s in this process, all sharing the
2 cores. Model: the `bench` preset (Qwen3, hidden 512, 8 layers, random weights, float32; 18,432 bytes per cached
row, so the default CPU budget of 256 MiB holds 14,563 rows: 14 of the few-shot prompts).

Workloads (texts from `radix_core/data/tiny_corpus.txt`, token counts by the tiny tokenizer, `bench/workloads.py`):

* `few-shot`: 16 distinct 1,024-token few-shot prompts; each request classifies 4 inputs of 20-60 tokens
  (`Classify`: the prompt is the request's `prefix`, shared by its inputs, with a template and two labels), the
  prompt drawn at random. Configurations: `cache + prefix routing` (the defaults), `default router, no cache` (Ray
  Serve's power-of-two-choices router, `engine.prefix_cache_bytes: 0`), `prefix routing, no cache`, each run twice,
  in the order of this list and then backwards, so a change of the machine's load falls on all. Classify, not a
  rerank with the prompt as instruction: its request shape is exactly a few-shot prompt in front of each
  classification request, the prompt the shared prefix of the request's sequences and so its prefix key.
* `few-shot, 6 prompts`: the same with 6 prompts (a classifier serving a handful of tasks), the same
  configurations. From cold caches each run computes every prompt at least once on the replica it goes to, a share
  of the run that grows with the prompts: 16 prompts on 2 replicas are 16 or more of 192 requests, 6 are 6 or more.
* `paged rerank`: 12 queries x 256 MS MARCO-shaped passages (40-120 tokens) as rerank requests of 8 documents,
  every query's 32 requests interleaved at random with the others' (a query whose documents arrive page by page):
  `cache + prefix routing` against `prefix routing, no cache`: rows computed over tokens (N'/N).
* `no reuse`: the few-shot shape with a new prompt in every request, so nothing is ever read back: what the cache's
  lookups, admissions (each prompt is shared by its request's 4 inputs, so it enters the cache) and evictions cost.
  `cache + prefix routing` against `prefix routing, no cache`, each run twice in the order on, off, off, on, so a
  drift of the machine's load falls on both.

Every prompt, input and document starts with its own number (`numbered`): the corpus has 258 sentences, so drawn
texts often start alike, and those shared rows would flatter both the batches and the cache.

Every configuration runs `serve_config.yaml`'s application args with `limits.max_request_tokens: 16384`: a few-shot
request is 4 inputs x 2 labels = 8 sequences, about 8,600 input tokens, which the default 8,192 would cut into two
parts, the second reading the prompt the first cached, so a "no reuse" request would reuse its own prompt. Every
configuration deploys the application afresh (cold caches), sends `--clients` small requests to warm the
code paths (a 64-token prompt, nothing the workload reads back), then its workload's requests, each sent once by
`--clients` closed-loop clients (`bench/load_driver.py`). Throughput counts the requests answered over the whole
stream, and over its second half alone (the caches start cold: each prompt is computed once on each replica that
gets it); latency is per request as its client saw it. From the answers' `usage`: N'/N (computed over input
tokens) and the share of input tokens read from the cache; `misses after a hit` counts the few-shot requests whose
prompt a replica had already cached for an earlier answer, yet that did not read it: sent to a replica without it
(a spill of bounded-load routing) or after an eviction. Every `--sample-s` a thread asks the engine replicas for
their cache's bytes and budget and their batchers' means (`EngineReplica.info`; each call reaches one replica).
`engine CPU s/request` is the CPU time the engine replicas' processes used over the stream, per request: unlike
throughput, it hardly moves when other people's work shares the machine, so it is the measure of what the cache
costs where nothing is reused. `busier replica's CPU share` is the larger of the two replicas' CPU seconds over
their sum (the mean of the runs'): 0.5 is an even split; with clients that wait for each answer, the busier
replica sets the pace while the other idles.

    python bench/prefix_cache_bench.py [--clients 8] [--few-shot-requests 192] [--no-reuse-requests 64]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from load_driver import LoadDriver
from local_serve import run_app, start_serve
from machine import plot_title, tiny_model
from ray import serve
from workloads import MsMarco, QueryPassages, corpus_text, msmarco_texts, passage, rerank_stream, token_counter

from radix_core.tiny_models import PRESETS, make_tiny_model, make_tiny_tokenizer
from radixserve.client import ScoringClient

PROMPTS, PROMPT_TOKENS, INPUTS, INPUT_TOKENS = 16, 1024, 4, (20, 60)
FEW_PROMPTS = 6  # the `few-shot, 6 prompts` stream: a classifier serving a handful of tasks
TEMPLATE, LABELS = "\nInput: {input}\nLabel:", ("positive", "negative")
REQUEST_TOKENS = 16384  # limits.max_request_tokens: a few-shot request (8 sequences, ~8,600 tokens) is one part
CACHE_AND_PREFIX = "cache + prefix routing"
DEFAULT_ROUTER = "default router, no cache"
PREFIX_NO_CACHE = "prefix routing, no cache"
NO_CACHE = {"engine": {"prefix_cache_bytes": 0}}
CONFIGS = {CACHE_AND_PREFIX: {}, DEFAULT_ROUTER: {"router": {"policy": "power_of_two"}, **NO_CACHE},
           PREFIX_NO_CACHE: NO_CACHE}
FEW_SHOT_ORDER = [CACHE_AND_PREFIX, DEFAULT_ROUTER, PREFIX_NO_CACHE, PREFIX_NO_CACHE, DEFAULT_ROUTER, CACHE_AND_PREFIX]
FEW_SHOT_6 = f"few-shot, {FEW_PROMPTS} prompts"
WORKLOADS = ["few-shot", FEW_SHOT_6, "paged rerank", "no reuse"]


@dataclass
class Answer:
    """One answered request: when, how long, its usage, and its prompt (few-shot) for the miss count."""

    done: float
    latency_s: float
    items: int
    input_tokens: int
    computed_tokens: int
    cached_tokens: int
    prompt: int | None


@dataclass
class Run:
    seconds: float
    answers: list[Answer]
    samples: list[tuple[float, str, dict]] = field(default_factory=list)  # (time, replica, cache and batcher)
    load: float = 0.0  # the machine's 1-minute load average when the run ended (other people's work included)
    replica_cpu_s: list[float] = field(default_factory=list)  # CPU seconds each engine replica used in the stream


def classify(prompt: str, inputs: list[str], which: int | None = None) -> tuple[str, dict, int | None]:
    return "classify", {"inputs": inputs, "labels": list(LABELS), "prefix": prompt, "template": TEMPLATE}, which


def few_shot(rng: np.random.Generator, count_tokens, requests: int, prompts: int = PROMPTS,
             unique: bool = False) -> list[tuple]:
    """`requests` classify requests of INPUTS inputs behind one of `prompts` prompts drawn at random (a new prompt
    each when `unique`). Texts are numbered (`numbered`), so none shares a start with another by chance."""
    _, sentences = corpus_text()
    prompt = lambda n: numbered("Prompt", n, passage(sentences, count_tokens, PROMPT_TOKENS, rng))  # noqa: E731
    drawn = [prompt(n) for n in range(0 if unique else prompts)]
    out = []
    for r in range(requests):
        inputs = [numbered("Item", INPUTS * r + i, passage(sentences, count_tokens,
                                                           int(rng.integers(INPUT_TOKENS[0], INPUT_TOKENS[1] + 1)),
                                                           rng)) for i in range(INPUTS)]
        if unique:
            out.append(classify(prompt(PROMPTS + r), inputs))
        else:
            which = int(rng.integers(prompts))
            out.append(classify(drawn[which], inputs, which))
    return out


def paged_rerank(rng: np.random.Generator, count_tokens, queries: int, docs: int) -> list[tuple]:
    groups = msmarco_texts(rng, count_tokens, MsMarco(queries=queries, passages_per_query=docs))
    groups = [QueryPassages(g.query, [numbered("Document", docs * q + i, text) for i, text in enumerate(g.passages)])
              for q, g in enumerate(groups)]
    return [("rerank", request, None) for request in rerank_stream(groups, 8, rng)]


def numbered(kind: str, number: int, text: str) -> str:
    """`text` after its own number: the corpus has 258 sentences, so texts drawn from it often start alike (most of
    a query's 256 passages share a first sentence with another), which would be shared rows no real stream has."""
    return f"{kind} {number}. {text}"


def warm_requests(rng: np.random.Generator, count_tokens, count: int) -> list[tuple]:
    _, sentences = corpus_text()
    return [classify(passage(sentences, count_tokens, 64, rng), [passage(sentences, count_tokens, 20, rng)])
            for _ in range(count)]


def serve_config(base: dict, model_dir: str, changes: dict) -> dict:
    """serve_config.yaml's args on 2 CPU engine replicas, one part per request (`REQUEST_TOKENS`), and `changes`."""
    args = {**base, "model": model_dir, "placement": {"accelerator": "cpu", "engine": {"num_replicas": 2}},
            "limits": {"max_request_tokens": REQUEST_TOKENS}}
    for section, values in changes.items():
        args[section] = {**args.get(section, {}), **values}
    return args


def run_config(args: dict, requests: list[tuple], warm: list[tuple], clients: int, port: int, sample_s: float,
               label: str) -> Run:
    """Deploy `args`, warm up, send `requests` once from `clients` closed-loop clients; every one must succeed."""
    run_app(args)
    engine = serve.get_deployment_handle("EngineReplica", app_name="radixserve")
    answers, lock, stop = [], threading.Lock(), threading.Event()
    with ScoringClient(f"127.0.0.1:{port}", timeout_s=600, retries=0) as client:
        def call(item: tuple, record: bool = True) -> int:
            task, request, prompt = item
            sent = time.perf_counter()
            usage = getattr(client, task)(**request).usage
            if record:
                with lock:
                    answers.append(Answer(time.perf_counter(), time.perf_counter() - sent,
                                          len(request.get("inputs") or request.get("documents")),
                                          usage.input_tokens, usage.computed_tokens, usage.cached_tokens, prompt))
            return usage.input_tokens

        check(LoadDriver(lambda item: call(item, False), iter(warm)).closed_loop(clients, label=f"warm-up {label}"),
              len(warm), label)
        samples: list[tuple[float, str, dict]] = []
        sampler = threading.Thread(target=sample, args=(engine, samples, stop, sample_s))
        cpu_before = replicas_cpu_s(engine)
        start = time.perf_counter()
        sampler.start()
        outcomes = LoadDriver(call, iter(requests)).closed_loop(clients, label=label, total=len(requests))
        seconds = time.perf_counter() - start
        stop.set()
        sampler.join()
        cpu_after = replicas_cpu_s(engine)
        cpu = [cpu_after[replica] - cpu_before[replica] for replica in sorted(cpu_before)]
    check(outcomes, len(requests), label)
    serve.delete("radixserve")
    for answer in answers:
        answer.done -= start
    return Run(seconds, sorted(answers, key=lambda a: a.done), [(t - start, r, s) for t, r, s in samples],
               os.getloadavg()[0], cpu)


def replicas_cpu_s(engine, replicas: int = 2, calls: int = 64) -> dict[str, float]:
    """CPU seconds each engine replica's process has used (`EngineReplica.info`, asked until every replica has
    answered: each call reaches one)."""
    seen: dict[str, float] = {}
    for _ in range(calls):
        info = engine.info.remote().result(timeout_s=60)
        seen[info["replica"]] = info["cpu_s"]
        if len(seen) == replicas:
            return seen
    raise RuntimeError(f"info reached {len(seen)} of {replicas} engine replicas in {calls} calls")


def check(outcomes, expected: int, label: str) -> None:
    failed = [o for o in outcomes if o.code != "OK"]
    if failed or len(outcomes) != expected:
        raise RuntimeError(f"{label}: {len(failed)} of {expected} requests failed ({len(outcomes)} answered), the "
                           f"first with {failed[0].error if failed else 'none'}")


def sample(engine, samples: list, stop: threading.Event, every_s: float) -> None:
    """The replicas' prefix cache stats every `every_s` until `stop` (each info call reaches one replica)."""
    while not stop.wait(every_s):
        info = engine.info.remote().result(timeout_s=60)
        samples.append((time.perf_counter(), info["replica"], {**(info["prefix_cache"] or {}),
                                                               "batcher": info["batcher"]}))


def summary(run: Run) -> dict:
    answers = run.answers
    latencies = np.array([a.latency_s for a in answers])
    inputs = sum(a.input_tokens for a in answers)
    row = {"requests": len(answers), "seconds": run.seconds, "requests/s": len(answers) / run.seconds,
           "requests/s, 2nd half": second_half_rate(answers),
           "items/s": sum(a.items for a in answers) / run.seconds, "input tokens/s": inputs / run.seconds,
           "p50 s": float(np.percentile(latencies, 50)), "p99 s": float(np.percentile(latencies, 99)),
           "N'/N": sum(a.computed_tokens for a in answers) / inputs,
           "cached share": sum(a.cached_tokens for a in answers) / inputs,
           "engine CPU s/request": sum(run.replica_cpu_s) / len(answers),
           "busier replica's CPU share": max(run.replica_cpu_s) / sum(run.replica_cpu_s), "load": run.load}
    if answers and answers[0].prompt is not None:
        row["misses after a hit"] = misses_after_a_hit(answers)
    last = {replica: stats for _, replica, stats in run.samples}  # each replica's latest sample
    if any("bytes" in s for s in last.values()):
        row["evictions"] = sum(s["evictions"] for s in last.values())
        row["MiB held (max)"] = max(s["bytes"] for _, _, s in run.samples) / 2**20
    if last:  # the batchers' means over their recent batches, warm-up included
        row["parts per batch"] = float(np.mean([s["batcher"]["mean_num_items"] for s in last.values()]))
        row["forward s per batch"] = float(np.mean([s["batcher"]["mean_forward_s"] for s in last.values()]))
    return row


def second_half_rate(answers: list[Answer]) -> float:
    """Requests/s over the second half of one run's answers (in the order they came back); NaN for answers of several
    runs, whose times count from different starts (`merged` takes each run's own)."""
    half = len(answers) // 2
    span = answers[-1].done - answers[half - 1].done
    return (len(answers) - half) / span if span > 0 else float("nan")


def read_prompt(answer: Answer) -> bool:
    """Whether a few-shot answer read its prompt from the cache: half of it or more in each of its sequences (every
    prompt starts with the same word, a few tokens every request reads from the cache)."""
    return answer.cached_tokens >= answer.items * len(LABELS) * PROMPT_TOKENS // 2


def misses_after_a_hit(answers: list[Answer]) -> int:
    """Requests that did not read their prompt from the cache although an answer that came back before they were
    sent had read it."""
    first_hit: dict[int, float] = {}
    for a in answers:
        if read_prompt(a) and a.prompt not in first_hit:
            first_hit[a.prompt] = a.done
    return sum(1 for a in answers if not read_prompt(a) and a.done - a.latency_s > first_hit.get(a.prompt, np.inf))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--few-shot-requests", type=int, default=192, help="per run (each configuration runs twice)")
    parser.add_argument("--paged-queries", type=int, default=12)
    parser.add_argument("--paged-docs", type=int, default=256, help="documents per query")
    parser.add_argument("--no-reuse-requests", type=int, default=64, help="per run (each configuration runs twice)")
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=WORKLOADS)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / "bench-qwen3", "qwen3", "causal_lm",
                                    **PRESETS["bench"]))
    rng, count_tokens = np.random.default_rng(args.seed), token_counter(make_tiny_tokenizer())
    plans = {
        "few-shot": (lambda: few_shot(rng, count_tokens, args.few_shot_requests), FEW_SHOT_ORDER),
        FEW_SHOT_6: (lambda: few_shot(rng, count_tokens, args.few_shot_requests, FEW_PROMPTS), FEW_SHOT_ORDER),
        "paged rerank": (lambda: paged_rerank(rng, count_tokens, args.paged_queries, args.paged_docs),
                         [CACHE_AND_PREFIX, PREFIX_NO_CACHE]),
        "no reuse": (lambda: few_shot(rng, count_tokens, args.no_reuse_requests, unique=True),
                     [CACHE_AND_PREFIX, PREFIX_NO_CACHE, PREFIX_NO_CACHE, CACHE_AND_PREFIX]),
    }
    load = {"before": os.getloadavg()}
    config, port = start_serve()
    base = config["applications"][0]["args"]
    warm = warm_requests(rng, count_tokens, args.clients)
    runs: dict[tuple[str, str], list[Run]] = {}
    for workload in args.workloads:
        make, labels = plans[workload]
        requests = make()
        print(f"{workload}: {len(requests)} requests per configuration")
        for label in labels:
            run = run_config(serve_config(base, model_dir, CONFIGS[label]), requests, warm, args.clients, port,
                             args.sample_s, f"{workload}: {label}")
            runs.setdefault((workload, label), []).append(run)
            print(f"{workload} | {label} | {summary(run)}")
    serve.shutdown()
    load["after"] = os.getloadavg()
    write_report(runs, args, load)


def merged(runs: list[Run]) -> dict:
    """One row for the runs of a configuration: counts and seconds added, rates over the total."""
    rows = [summary(run) for run in runs]
    if len(rows) == 1:
        return rows[0]
    answers = [a for run in runs for a in run.answers]
    row = summary(Run(sum(run.seconds for run in runs), answers, load=max(run.load for run in runs),
                      replica_cpu_s=[sum(sum(run.replica_cpu_s) for run in runs)]))
    for key, combine in (("misses after a hit", sum), ("evictions", sum), ("MiB held (max)", max),
                         ("busier replica's CPU share", np.mean),
                         ("requests/s, 2nd half", np.mean), ("parts per batch", np.mean),
                         ("forward s per batch", np.mean)):  # each run's own (times count from each run's start)
        if key in rows[0]:
            row[key] = combine([r[key] for r in rows])
    row["requests/s per run"] = [r["requests/s"] for r in rows]
    return row


def spill_cost(answers: list[Answer]) -> str:
    """What a request costs with its prompt cached on its replica and without (its first there, a spill, an
    eviction): median rows computed and latency of each kind."""
    kinds = {"read its prompt from the cache": [a for a in answers if read_prompt(a)],
             "computed its prompt": [a for a in answers if not read_prompt(a)]}
    rows = {kind: float(np.median([a.computed_tokens for a in found])) for kind, found in kinds.items() if found}
    parts = [f"{len(found)} {kind}: {rows[kind]:.0f} rows computed, {np.median([a.latency_s for a in found]):.2f} s "
             f"(medians)" for kind, found in kinds.items() if found]
    ratio = (f"; a request sent where its prompt is not cached computes "
             f"{rows['computed its prompt'] / rows['read its prompt from the cache']:.1f}x the rows"
             if len(rows) == 2 else "")
    return "; ".join(parts) + ratio


def write_report(runs: dict, args, load: dict) -> None:
    rows = {key: merged(value) for key, value in runs.items()}
    columns = ("requests", "requests/s", "requests/s, 2nd half", "items/s", "p50 s", "p99 s", "N'/N", "cached share",
               "misses after a hit", "evictions", "parts per batch", "forward s per batch", "engine CPU s/request",
               "busier replica's CPU share", "load")
    lines = ["| workload | configuration | " + " | ".join(columns) + " | vs default router | vs no cache |",
             "|" + "---|" * (len(columns) + 4)]
    for (workload, label), r in rows.items():
        cells = [_cell(r.get(column, "")) for column in columns]
        for reference in (DEFAULT_ROUTER, PREFIX_NO_CACHE):
            other = rows.get((workload, reference))
            cells.append(f"{r['requests/s'] / other['requests/s']:.2f}x" if other else "")
        lines.append(f"| {workload} | {label} | " + " | ".join(cells) + " |")
    workloads = "" if args.workloads == WORKLOADS else " --workloads " + " ".join(f'"{w}"' for w in args.workloads)
    command = (f"python bench/prefix_cache_bench.py --clients {args.clients} --few-shot-requests "
               f"{args.few_shot_requests} --paged-queries {args.paged_queries} --paged-docs {args.paged_docs} "
               f"--no-reuse-requests {args.no_reuse_requests}{workloads}")
    per_run = {key: r["requests/s per run"] for key, r in rows.items() if "requests/s per run" in r}
    few_shot_cost = "".join(f"\n{w}, {CACHE_AND_PREFIX}: {spill_cost([a for r in value for a in r.answers])}.\n"
                            for (w, c), value in runs.items() if w.startswith("few-shot") and c == CACHE_AND_PREFIX)
    text = (f"# The prefix cache, served\n\nCommand: `{command}` ({os.cpu_count()} CPUs, 2 CPU engine replicas, "
            f"{args.clients} closed-loop gRPC clients, `bench` preset Qwen3, float32; the script's docstring says "
            f"what each workload and configuration is; `load`: the machine's 1-minute load average as the run "
            f"ended, the most of a configuration's runs). Load average before the run {load['before'][0]:.2f}, "
            f"after it {load['after'][0]:.2f} (1 minute; the machine is shared).\n\n" + "\n".join(lines) + "\n\n"
            + "".join(f"Requests/s of each run, {w} / {c}: {', '.join(f'{x:.2f}' for x in v)}.\n"
                      for (w, c), v in per_run.items())
            + few_shot_cost
            + "\n![throughput, latency, hit ratio and cache memory over the run](prefix_cache_bench.png)\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefix_cache_bench.md").write_text(text)
    (args.out / "prefix_cache_bench.json").write_text(json.dumps(
        {f"{w} | {c}": {"summary": rows[w, c], "runs": [{"seconds": run.seconds, "samples": run.samples,
                                                          "answers": [vars(a) for a in run.answers]}
                                                         for run in value]}
         for (w, c), value in runs.items()}, indent=1))
    plot(runs, rows, args.out / "prefix_cache_bench.png")
    print(text)


def _cell(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) and value < 1 else (
        f"{value:.2f}" if isinstance(value, float) else str(value))


def plot(runs: dict, rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((speed, latency), (hits, memory)) = plt.subplots(2, 2, figsize=(13, 8))
    names = [f"{w}\n{c}" for w, c in rows]
    speed.barh(names, [r["requests/s"] for r in rows.values()])
    speed.set(xlabel="requests/s")
    speed.invert_yaxis()
    y = np.arange(len(rows))
    latency.barh(y - 0.2, [r["p50 s"] for r in rows.values()], 0.4, label="p50")
    latency.barh(y + 0.2, [r["p99 s"] for r in rows.values()], 0.4, label="p99")
    latency.set(yticks=y, yticklabels=names, xlabel="request latency (s)")
    latency.invert_yaxis()
    latency.legend(fontsize=8)
    budget = None
    for (workload, label), value in runs.items():
        if label != CACHE_AND_PREFIX:
            continue
        run = value[0]
        done = np.array([a.done for a in run.answers])
        edges = np.arange(0, run.seconds + 5, 5.0)
        cached = np.histogram(done, edges, weights=[a.cached_tokens for a in run.answers])[0]
        total = np.histogram(done, edges, weights=[a.input_tokens for a in run.answers])[0]
        seen = total > 0
        hits.plot(edges[1:][seen], cached[seen] / total[seen], marker=".", label=workload)
        for replica in sorted({r for _, r, _ in run.samples}):
            points = [(t, s["bytes"] / 2**20) for t, r, s in run.samples if r == replica]
            memory.plot(*zip(*points), marker=".", label=f"{workload}, replica {replica[-4:]}")
        budget = run.samples[0][2]["budget_bytes"] / 2**20
    if budget is not None:
        memory.axhline(budget, color="black", linestyle="--", label="budget (each replica)")
    hits.set(xlabel="seconds into the run", ylabel="input tokens read from the cache (5 s windows)", ylim=(0, 1))
    hits.legend(fontsize=8)
    memory.set(xlabel="seconds into the run", ylabel="MiB held by the prefix cache")
    memory.legend(fontsize=7)
    fig.suptitle(plot_title("the prefix cache served: 2 CPU engine replicas, cache + prefix routing against the "
                            "default router and no cache", tiny_model("bench")), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
