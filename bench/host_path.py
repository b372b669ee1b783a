"""The host path: everything around the forward, stage by stage, on Cohere-size and small rerank requests, over gRPC
and HTTP, against the forward it has to keep busy.

For each model preset (`tiny`: a small forward; `bench`) and request size (`--large` MS MARCO-shaped documents per
request, Cohere's 1,000 by default, and `--small`, 8), in one run, interleaved round by round (`bench/timing.py`);
the in-process candidates run in a child process without Ray (`bench/child_process.py` says why), with the host
allocator the engine replica sets (`radix_core.host_memory`):

* `in-process stages`: the served path's functions run in one process (`bench/host_stages.py`), each stage under
  its own clock, wall time per 1,000 documents: decode + check, tokenize + split, key + route, cache lookup,
  batcher, index build, plan, forward, cache commit, finish, merge, encode (each transport's decode and encode);
* `served gRPC` / `served HTTP`: the application as `serve run serve_config.yaml` builds it (one engine replica,
  `placement.topology` as `--topology` says, its defaults otherwise), one client sending the same requests one
  after another (`bench/wire.py`), each transport with an API key of its own, so that each fills a prefix cache
  tree of its own (`auth`: a tenant each): the two send the same documents, and in one tree the second would find
  them seen once already and admit them all (`radix_core.prefix_cache`, the second request), work a transport does
  not cost (without keys, HTTP, always second, took 714 ms per 1,000 `tiny` documents against gRPC's 610 in one
  run, and 12% fewer documents/s at full load; sent alone in alternating order, the two took the same). **Ray
  hops** = the served time less the sum of the in-process stages: the proxies, the handle calls (none from the
  ingress to the engine with `--topology combined`), the IndexBuilder's actor call, worker-thread hand-offs,
  pickling, and whatever else the server does that the stages do not;
* `in-process engine`: `Engine.rerank` on the same requests (the library: one batch per request);
* `plain transformers`: `AutoModelForCausalLM` on the same prompts in right-padded batches of `--padded-batch`
  (`bench/padded_baseline.py`).

Every round sends new requests (a prefix cache would otherwise answer the documents of the round before); every
candidate gets the same ones. Then **full load**: `--clients` clients send more new requests (at least `LOAD_DOCS`
documents) through each transport; the replica's own batch timings (`BatchStats`, read through `Ingress.info`) give
the share of the replica's wall time its forward (`Engine.run_jobs`) held, and every process of the Ray this script
starts its CPU per 1,000 documents (`bench/host_capacity.py`: the engine replica's forward threads apart from its
other threads).

Headline: **host documents/s per engine replica** = documents / (the stages' time less the forward), per transport;
the same from the served time (Ray hops included); the forward's share at full load; served against the in-process
stages (the same batches: the batcher splits a Cohere-size request by `max_batch_tokens`) and against the engine
in-process (one batch per request, as the library runs it). Per size, what the host side of a `--node-cores`-CPU
node whose forward runs on an accelerator sustains at the processes' CPU costs, and which process bounds it.

    python bench/host_path.py [--presets tiny bench] [--large 1000] [--small 8] [--repeats 3] [--clients 4]
                              [--topology split|combined] [--node-cores 8]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import numpy as np
import ray
from child_process import ChildProcess
from host_capacity import ENGINE, FEEDER_STAGES, INGRESS, Cost, LoadCpu, capacity
from host_stages import stages
from in_process_worker import CANDIDATES, host_path_candidates
from load_driver import LoadDriver
from local_serve import app_args, free_port, run_app, start_serve
from machine import machine, plot_title, tiny_model
from peer_vllm_processes import TAG_ENV
from ray import serve
from timing import interleaved_timings
from wire import TRANSPORTS
from workloads import MsMarco, msmarco_texts, rerank_stream, token_counter

from deployments.config import Topology
from radix_core.tiny_models import PRESETS, make_tiny_model, make_tiny_tokenizer

SERVER_STAGES = ("queue", "build", "wait", "forward")  # BatchStats `<stage>_s`, as the replica records them
TARGET_HOST_DOCS_S = 5000
LOAD_DOCS = 1000  # at least, at full load: each process's CPU per document read over seconds, not a few requests
IDLE_S = 3.0  # before each full load, each process's CPU idle (`host_capacity.LoadCpu`)
API_KEYS = {t.name: f"host-path-{t.name.lower()}-tenant" for t in TRANSPORTS}  # a prefix cache tree per transport


@dataclass
class Workload:
    """Requests of one size: `rounds[k]` is what every candidate sends on its k-th call (call 0 warms up), `load`
    what the clients send at full load."""

    docs: int
    rounds: list[list[dict]]
    load: list[dict]

    @property
    def round_docs(self) -> int:
        return sum(len(r["documents"]) for r in self.rounds[0])


def workload(rng: np.random.Generator, docs: int, requests: int, per_query: int, rounds: int,
             clients: int, load_docs: int = LOAD_DOCS) -> Workload:
    """`rounds` sets of `requests` rerank requests of `docs` MS MARCO-shaped documents, `per_query` requests per
    query, and a load set of at least two requests per client and `load_docs` documents; no request twice."""
    load_sets = max(math.ceil(2 * clients / requests), math.ceil(load_docs / (docs * requests)))
    total = (rounds + load_sets) * requests
    counter = token_counter(make_tiny_tokenizer())
    groups = msmarco_texts(rng, counter, MsMarco(queries=math.ceil(total / per_query),
                                                 passages_per_query=docs * per_query))
    stream = rerank_stream(groups, docs, rng)
    sets = [stream[i * requests:(i + 1) * requests] for i in range(rounds)]
    return Workload(docs, sets, stream[rounds * requests:total])


def each_round(call, work: Workload):
    """A runner whose k-th call sends round k's requests through `call`, one after another."""
    rounds = iter(work.rounds)

    def run() -> None:
        for request in next(rounds):
            call(request)
    return run


def batch_seconds(handle) -> dict[str, float]:
    """The engine replica's batches so far and their seconds per stage (`BatcherStats.summary` totals)."""
    summary = handle.info.remote().result()["batcher"]
    return {"batches": summary["num_batches"], **{stage: summary[f"total_{stage}_s"] for stage in SERVER_STAGES}}


def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after}


def measure(key: int, work: Workload, inproc: ChildProcess, calls: dict, handle, args) -> dict:
    """One preset and size (`key`: the workload's index): the interleaved rounds, then full load through each
    transport; seconds per 1,000 documents unless named otherwise."""
    per_k = 1000 / work.round_docs
    runners = {**{name: inproc.runner(name, key) for name in CANDIDATES},
               **{f"served {name}": each_round(call, work) for name, call in calls.items()}}
    inproc.call("clocks")  # rounds of the workloads before
    before = batch_seconds(handle)
    timings = interleaved_timings(runners, args.repeats)
    server = since(before, batch_seconds(handle))
    timed = inproc.call("clocks")[1:]  # the first call warmed up
    stage_s = {name: per_k * float(np.mean([c.get(name, 0.0) for c in timed]))
               for name in {s for t in TRANSPORTS for s in stages(t.name)}}
    result = {"docs": work.docs, "round_docs": work.round_docs,
              "runners": {name: {"median": t.median * per_k, "low": t.low * per_k, "high": t.high * per_k}
                          for name, t in timings.items()},
              "stages": stage_s,
              "server_1_client": {k: v * 1000 / (2 * work.round_docs * (args.repeats + 1)) if k != "batches" else v
                                  for k, v in server.items()},
              "load": {name: full_load(work, call, handle, args.clients, f"load {name} {work.docs}",
                                       LoadCpu(args.tag, IDLE_S, ENGINE if args.topology == "split" else INGRESS))
                       for name, call in calls.items()}}
    result["summary"] = summarize(result, args.node_cores)
    return result


def full_load(work: Workload, call, handle, clients: int, label: str, cpu: LoadCpu) -> dict:
    """Docs/s of `clients` closed-loop clients over the load requests, the replica's stage seconds per 1,000
    documents and shares of the wall time, and each process's CPU per 1,000 documents beyond its idle share of a
    core (`cpu`, constructed just before: its idle reading)."""
    before = batch_seconds(handle)
    start = time.perf_counter()
    outcomes = LoadDriver(call, iter(work.load)).closed_loop(clients, label=label, total=len(work.load))
    wall = time.perf_counter() - start
    failed = [o for o in outcomes if o.code != "OK"]
    if failed:
        raise RuntimeError(f"{label}: {len(failed)} of {len(outcomes)} requests failed, the first with "
                           f"{failed[0].error}")
    docs = sum(len(r["documents"]) for r in work.load)
    costs = cpu.per_1000(docs, handle.info.remote().result()["torch_threads"])
    server = since(before, batch_seconds(handle))
    return {"docs/s": docs / wall, "batches": server["batches"],
            "share": {stage: server[stage] / wall for stage in SERVER_STAGES},
            "per_1000": {stage: server[stage] * 1000 / docs for stage in SERVER_STAGES},
            "cpu": {name: vars(cost) for name, cost in costs.items()}}


def summarize(r: dict, node_cores: int) -> dict:
    """The headline figures of one preset and size, per transport; what the host side of a `node_cores`-CPU node
    whose forward runs on an accelerator sustains at the processes' CPU costs (`host_capacity.capacity`)."""
    runners, stage_s = r["runners"], r["stages"]
    engine_s = runners["in-process engine"]["median"]
    out = {"in-process engine docs/s": 1000 / engine_s,
           "plain transformers docs/s": 1000 / runners["plain transformers"]["median"],
           "engine / plain": runners["plain transformers"]["median"] / engine_s}
    for t in TRANSPORTS:
        total = sum(stage_s[s] for s in stages(t.name))
        served = runners[f"served {t.name}"]["median"]
        out[t.name] = {"stages s": total, "ray hops s": served - total,
                       "host docs/s": 1000 / (total - stage_s["forward"]),
                       "served host docs/s": 1000 / (served - stage_s["forward"]) if served > stage_s["forward"]
                       else None,  # the forward's spread between rounds larger than the host time
                       "served / in-process": engine_s / served,
                       "served / stages": total / served,
                       "load docs/s": r["load"][t.name]["docs/s"],
                       "load / in-process": r["load"][t.name]["docs/s"] * engine_s / 1000,
                       "forward share at load": r["load"][t.name]["share"]["forward"],
                       "feeder ms": 1000 * sum(stage_s[s] for s in FEEDER_STAGES)}
        costs = {name: Cost(**cost) for name, cost in r["load"][t.name]["cpu"].items()}
        out[t.name]["node"] = vars(capacity(costs, out[t.name]["feeder ms"], node_cores))
    return out


def deploy(model_dir: str, config: dict, keys_file: Path, topology: str) -> tuple[dict, object]:
    """The application of serve_config.yaml deployed on `model_dir` (one CPU or GPU engine replica, `topology`, the
    API keys of `keys_file`): its args and its handle."""
    args = app_args(config, model=model_dir, placement={"topology": topology, "engine": {"num_replicas": 1}},
                    auth={"api_keys_file": str(keys_file)})
    return args, run_app(args)


def run_preset(preset: str, works: list[Workload], config: dict, ports: tuple[int, int], args) -> dict:
    model_dir = str(make_tiny_model(Path(tempfile.mkdtemp()) / f"{preset}-qwen3", "qwen3", "causal_lm",
                                    **PRESETS[preset]))
    keys_file = Path(tempfile.mkdtemp()) / "api-keys"
    keys_file.write_text("".join(f"{key}\n" for key in API_KEYS.values()))
    app_args, handle = deploy(model_dir, config, keys_file, args.topology)
    inproc = ChildProcess(host_path_candidates, model_dir, app_args, args.padded_batch,
                          {i: w.rounds for i, w in enumerate(works)})
    try:
        with ExitStack() as stack:
            calls = {t.name: stack.enter_context(t.client(*ports, API_KEYS[t.name])) for t in TRANSPORTS}
            return {w.docs: measure(i, w, inproc, calls, handle, args) for i, w in enumerate(works)}
    finally:
        inproc.close()
        serve.delete("radixserve")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "bench"], choices=sorted(PRESETS))
    parser.add_argument("--large", type=int, default=1000, help="documents per Cohere-size request")
    parser.add_argument("--large-requests", type=int, default=1, help="Cohere-size requests per round")
    parser.add_argument("--small", type=int, default=8, help="documents per small request")
    parser.add_argument("--small-requests", type=int, default=32, help="small requests per round")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (after one warm-up round)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients at full load")
    parser.add_argument("--padded-batch", type=int, default=64, help="plain transformers' batch size")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--topology", choices=get_args(Topology), default="split",
                        help="placement.topology of the served application")
    parser.add_argument("--node-cores", type=int, default=8,
                        help="CPUs of the accelerator node whose host side the report sizes")
    args = parser.parse_args()
    args.tag = uuid.uuid4().hex  # in the environment of every process the Ray started below runs (LoadCpu)
    os.environ[TAG_ENV] = args.tag
    rng = np.random.default_rng(args.seed)
    rounds = args.repeats + 1
    works = [workload(rng, args.large, args.large_requests, 1, rounds, args.clients),
             workload(rng, args.small, args.small_requests, 4, rounds, args.clients)]
    http_port = free_port()
    config, grpc_port = start_serve(http_port)
    try:
        results = {p: run_preset(p, works, config, (grpc_port, http_port), args) for p in args.presets}
    finally:
        serve.shutdown()
        ray.shutdown()
    write_report(results, args)


def command(args) -> str:
    return (f"python bench/host_path.py --presets {' '.join(args.presets)} --large {args.large} --large-requests "
            f"{args.large_requests} --small {args.small} --small-requests {args.small_requests} --repeats "
            f"{args.repeats} --clients {args.clients} --padded-batch {args.padded_batch} --topology {args.topology} "
            f"--node-cores {args.node_cores}")


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


def figure(value: float | None, fmt: str) -> str:
    """`value` formatted, or n/a where the summary has none (`summarize`'s served host documents/s)."""
    return "n/a" if value is None else format(value, fmt)


def stage_table(r: dict) -> list[str]:
    """Milliseconds per 1,000 documents of each stage, the Ray hops and the served time, per transport."""
    names = [t.name for t in TRANSPORTS]
    rows = [f"| stage (ms per 1,000 documents) | {' | '.join(names)} |", "|---|" + "---|" * len(names)]
    for i, stage in enumerate(stages(names[0])):
        cells = [r["stages"][stages(n)[i]] for n in names]
        rows.append(f"| {stage.removesuffix(' ' + names[0])} | {' | '.join(ms(c) for c in cells)} |")
    summary = r["summary"]
    rows.append(f"| **sum of the stages** | {' | '.join(ms(summary[n]['stages s']) for n in names)} |")
    rows.append(f"| Ray hops (served less the stages) | {' | '.join(ms(summary[n]['ray hops s']) for n in names)} |")
    rows.append(f"| **served, one client** | "
                f"{' | '.join(ms(r['runners'][f'served {n}']['median']) for n in names)} |")
    server = r["server_1_client"]
    rows += [f"| replica's own `{stage}_s` (both transports, one client) | "
             f"{' | '.join(ms(server[stage]) for _ in names)} |" for stage in SERVER_STAGES]
    return rows


def cpu_table(r: dict, node_cores: int) -> list[str]:
    """Each process's CPU per 1,000 documents at full load beyond its idle share of a core (that share after it),
    per transport, and what the host side of a `node_cores`-CPU accelerator node sustains at those costs
    (`host_capacity`)."""
    names = [t.name for t in TRANSPORTS]
    cpu = [r["load"][n]["cpu"] for n in names]
    zero = {"ms": 0.0, "idle": 0.0}
    most = {p: max(c.get(p, zero)["ms"] + 1000 * c.get(p, zero)["idle"] for c in cpu) for c in cpu for p in c}
    processes = sorted((p for p, v in most.items() if v >= 0.05), key=lambda p: -most[p])  # the unused left out
    rows = [f"| process: CPU ms per 1,000 documents at full load beyond idle (idle, % of a core) | "
            f"{' | '.join(names)} |", "|---|" + "---|" * len(names)]
    for p in processes:
        cells = " | ".join(f"{c.get(p, zero)['ms']:.1f} ({100 * c.get(p, zero)['idle']:.1f}%)" for c in cpu)
        rows.append(f"| {p} | {cells} |")
    summary = [r["summary"][n] for n in names]
    feeder = " | ".join(f"{s['feeder ms']:.1f}" for s in summary)
    host = " | ".join(f"{s['node']['host_ms']:.1f} ({100 * s['node']['idle_cores']:.1f}%)" for s in summary)
    node = " | ".join(f"{s['node']['docs_s']:,.0f} ({s['node']['bound']})" for s in summary)
    return rows + [f"| feeder stages in-process ({', '.join(FEEDER_STAGES)}) | {feeder} |",
                   f"| **host, the forward's threads left out** | {host} |",
                   f"| **{node_cores}-CPU accelerator node's host side, documents/s** | {node} |"]


def headline_table(results: dict) -> list[str]:
    names = [t.name for t in TRANSPORTS]
    rows = ["| preset | docs/request | host docs/s per replica (stages) | host docs/s (served, Ray hops in) | "
            "forward share at full load | served docs/s at full load | served / in-process (one client) | "
            "served / in-process stages (one client) | in-process engine docs/s | plain transformers docs/s | "
            "engine / plain |", "|---|" + "---|" * 10]
    for preset, sizes in results.items():
        for docs, r in sizes.items():
            s = r["summary"]

            def both(key: str, fmt: str) -> str:
                return " / ".join(figure(s[n][key], fmt) for n in names)
            rows.append(f"| {preset} | {docs} | {both('host docs/s', ',.0f')} | {both('served host docs/s', ',.0f')} "
                        f"| {both('forward share at load', '.2f')} | {both('load docs/s', ',.1f')} | "
                        f"{both('served / in-process', '.2f')} | {both('served / stages', '.2f')} | "
                        f"{s['in-process engine docs/s']:,.1f} | "
                        f"{s['plain transformers docs/s']:,.1f} | {s['engine / plain']:.2f} |")
    return rows


def arithmetic(results: dict, args) -> str:
    """The target sentence: host documents/s per replica on `tiny` Cohere-size requests, written out."""
    if "tiny" not in results:
        return ""
    r = results["tiny"][args.large]
    s, grpc = r["summary"], TRANSPORTS[0].name
    host = s[grpc]["stages s"] - r["stages"]["forward"]
    return (f"Target arithmetic (`tiny`, {args.large}-document requests, {grpc}): the stages take "
            f"{ms(s[grpc]['stages s'])} ms per 1,000 documents, of which the forward {ms(r['stages']['forward'])} ms; "
            f"host = {ms(s[grpc]['stages s'])} - {ms(r['stages']['forward'])} = {ms(host)} ms, so 1,000 / "
            f"{host:.4f} s = **{1000 / host:,.0f} documents/s per replica** against the target of "
            f"{TARGET_HOST_DOCS_S:,} (a host budget of {ms(1000 / TARGET_HOST_DOCS_S)} ms per 1,000 documents, "
            f"what keeps an H200 busy with a 0.6B reranker whose forward takes 100-250 ms per 1,000 such documents). "
            f"With the Ray hops counted too: {figure(s[grpc]['served host docs/s'], ',.0f')} documents/s. "
            f"In-process engine / plain transformers: {s['engine / plain']:.2f}x (target 2x); served / in-process "
            f"at one client: {s[grpc]['served / in-process']:.2f}x over {grpc}, "
            f"{s[TRANSPORTS[1].name]['served / in-process']:.2f}x over {TRANSPORTS[1].name} (target 0.85x); "
            f"served / the in-process stages (the same batches): {s[grpc]['served / stages']:.2f}x over {grpc}, "
            f"{s[TRANSPORTS[1].name]['served / stages']:.2f}x over {TRANSPORTS[1].name}. At the CPU each process "
            f"spent at full load (the forward's threads left out, the feeder's stages in: "
            f"{s[grpc]['node']['host_ms']:.1f} ms per 1,000 documents over {grpc}), the host side of a node of "
            f"{args.node_cores} CPUs whose forward runs on an accelerator sustains "
            f"**{s[grpc]['node']['docs_s']:,.0f} documents/s** over {grpc} (bound: {s[grpc]['node']['bound']}) and "
            f"{s[TRANSPORTS[1].name]['node']['docs_s']:,.0f} over {TRANSPORTS[1].name} "
            f"(bound: {s[TRANSPORTS[1].name]['node']['bound']}).")


def write_report(results: dict, args) -> None:
    sections = [f"# The host path, stage by stage\n\nCommand: `{command(args)}` on {machine()}. Wall time per "
                "1,000 documents, the median of the interleaved rounds for the served and in-process candidates and "
                "the mean of the rounds for each stage (the script's docstring says what each is). Ray hops are the "
                "served time less the sum of the in-process stages. Host documents/s = documents / (the stages' "
                "time less the forward), from the served time likewise (n/a where the served time came under "
                "the stages' forward: the forward's spread between rounds larger than the host time); full load is "
                f"{args.clients} closed-loop clients, and the forward's share is the replica's own `forward_s` "
                "(`Engine.run_jobs`) over the wall time. Pairs a / b are gRPC / HTTP.\n", *headline_table(results), "",
                arithmetic(results, args)]
    for preset, sizes in results.items():
        for docs, r in sizes.items():
            sections += [f"\n## `{preset}`, {docs} documents per request\n", *stage_table(r), "",
                         *cpu_table(r, args.node_cores)]
    text = "\n".join(sections) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_path.md").write_text(text)
    (args.out / "host_path.json").write_text(json.dumps({"command": command(args), "machine": machine(),
                                                         "results": results}, indent=1))
    plot(results, args.out / "host_path.png")
    print(text)


def plot(results: dict, path: Path) -> None:
    """Per preset and size, each stage's milliseconds per 1,000 documents per transport, on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [(p, d, r) for p, sizes in results.items() for d, r in sizes.items()]
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 5.5), sharey=True, squeeze=False)
    labels = [s.removesuffix(" " + TRANSPORTS[0].name) for s in stages(TRANSPORTS[0].name)] + ["Ray hops", "served"]
    y = np.arange(len(labels))
    for ax, (preset, docs, r) in zip(axes[0], cases):
        for i, t in enumerate(TRANSPORTS):
            values = [r["stages"][s] for s in stages(t.name)] + [
                r["summary"][t.name]["ray hops s"], r["runners"][f"served {t.name}"]["median"]]
            ax.barh(y + 0.4 * i, [max(1000 * v, 1e-3) for v in values], 0.4, label=t.name)
        ax.set_xscale("log")
        ax.set_title(f"{preset}, {docs} docs/request", fontsize=9)
        ax.set_xlabel("ms per 1,000 documents")
    axes[0][0].set_yticks(y + 0.2, labels, fontsize=8)
    axes[0][0].invert_yaxis()
    axes[0][0].legend(fontsize=8)
    models = "; ".join(tiny_model(p) for p in results)
    fig.suptitle(plot_title("the served rerank path stage by stage (in-process stages; Ray hops = served - stages)",
                            models), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
