"""The report of the peer benchmark (`bench/peer_vllm.py`): items/s per server and workload against the targets of
issue 30 (part 3) and against radixserve's engine in-process (what the serving costs), per-document cost against
request size, score agreement, each launch's processes and start-up, and notes on what each server's CPU path does;
as Markdown, JSON and a plot in `--out`.

`workloads` are `peer_vllm.Workload`s, `runs` maps (side, workload name) to that side's `peer_vllm.Run` per round,
`launches` are `peer_vllm.Launch`es: this module reads their fields and imports nothing of the benchmark's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from machine import machine, plot_title, tiny_model

SIDES = ("radixserve", "vLLM")
IN_PROCESS = "radixserve in-process"  # the engine alone, no server (`peer_vllm.in_process_round`)
TARGETS = {"rerank 8 docs": 1.3, "rerank 256 docs": 1.5, "embed, instruction": 1.3,
           "embed, no instruction": 1.0}  # ours / vLLM, issue 30 part 3


def summarize(workloads: list, runs: dict) -> dict[str, dict]:
    """Per workload and side (the in-process engine too): items/s of the median round, ms per item, p50 latency, the
    share of input tokens computed (radixserve's N'/N; None for vLLM, which does not say); ours / vLLM of the medians
    and of each round; served / in-process of the medians."""
    out = {}
    for w in workloads:
        sides = {}
        for side in (*SIDES, IN_PROCESS):
            rounds = runs[(side, w.name)]
            rates = [w.items / r.seconds for r in rounds]
            last = rounds[-1]
            sides[side] = {"items/s": float(np.median(rates)), "ms/item": 1000 / float(np.median(rates)),
                           "tokens/s": last.tokens / last.seconds, "rounds items/s": rates,
                           "p50 s": float(np.median([x for r in rounds for x in r.latencies])),
                           "computed share": None if last.computed is None else last.computed / last.tokens}
        ours, theirs = sides["radixserve"]["rounds items/s"], sides["vLLM"]["rounds items/s"]
        out[w.name] = {**sides, "ratio": sides["radixserve"]["items/s"] / sides["vLLM"]["items/s"],
                       "round ratios": [a / b for a, b in zip(ours, theirs)],
                       "served share": sides["radixserve"]["items/s"] / sides[IN_PROCESS]["items/s"]}
    return out


def command_line(args) -> str:
    return (f"python bench/peer_vllm.py --vllm-python {args.vllm_python} --vllm-cores {args.vllm_cores} "
            f"--vllm-kv-gib {args.vllm_kv_gib} --rounds {args.rounds} --requests-8 {args.requests_8} --requests-256 "
            f"{args.requests_256} --embed-requests {args.embed_requests} --topology {args.topology}"
            + (" --busy" if args.busy else ""))


def results_table(workloads: list, summary: dict, agreed: dict) -> list[str]:
    rows = ["| workload | clients | requests x items | radixserve items/s | vLLM items/s | **ours / vLLM** | each "
            "round's ratio | target | radixserve N'/N | max \\|score diff\\| | input tokens, ours / vLLM | radixserve "
            "in-process items/s | served / in-process |",
            "|---|" + "---|" * 12]
    for w in workloads:
        s, a = summary[w.name], agreed[w.name]
        met = "met" if s["ratio"] >= TARGETS[w.name] else "**not met**"
        rows.append(f"| {w.name} | {w.clients} | {len(w.requests)} x {w.per_request} | "
                    f"{s['radixserve']['items/s']:.1f} | {s['vLLM']['items/s']:.1f} | **{s['ratio']:.2f}** | "
                    f"{', '.join(f'{r:.2f}' for r in s['round ratios'])} | >= {TARGETS[w.name]} ({met}) | "
                    f"{s['radixserve']['computed share']:.2f} | {a['max_abs_diff']:.2g} | "
                    f"{a['tokens']['radixserve']:,} / {a['tokens']['vLLM']:,} | {s[IN_PROCESS]['items/s']:.1f} | "
                    f"{s['served share']:.2f} |")
    return rows


def cost_table(summary: dict) -> list[str]:
    """Milliseconds per document of each side at 8 and 256 documents per request (falling is the goal)."""
    small, large = summary["rerank 8 docs"], summary["rerank 256 docs"]
    rows = ["| server | ms/doc, 8 docs/request (8 clients) | ms/doc, 256 docs/request (2 clients) | 256 / 8 |",
            "|---|---|---|---|"]
    rows += [f"| {side} | {small[side]['ms/item']:.1f} | {large[side]['ms/item']:.1f} | "
             f"{large[side]['ms/item'] / small[side]['ms/item']:.2f} |" for side in (*SIDES, IN_PROCESS)]
    return rows


def process_table(launches: list) -> list[str]:
    """The first round's launches: each process kind's nice levels, threads, allowed CPUs and CPU seconds; then
    the variables that place or rank threads in the environments of the busiest ones."""
    rows = ["| server | process | count | nice | threads | threads per allowed CPU list | CPU s during the "
            "workloads |", "|---|---|---|---|---|---|---|"]
    settings = []
    for launch in (x for x in launches if x.round == 0):
        busy = {name: p for name, p in launch.processes.items() if p["cpu_s"] >= 0.1}
        rows += [f"| {launch.server} | `{name}` | {p['processes']} | {', '.join(map(str, p['nice']))} | "
                 f"{p['threads']} | {', '.join(f'{cpus}: {n}' for cpus, n in p['affinity'].items())} | "
                 f"{p['cpu_s']:.1f} |" for name, p in busy.items()]
        settings += [f"* {launch.server}, `{name}`: " + (", ".join(f"`{k}={v}`" for k, v in sorted(p["env"].items()))
                                                        or "none")
                     for name, p in list(busy.items())[:2]]
    return rows + ["\nThread placement and priority settings in the environment of each server's two busiest "
                   "processes:\n", *settings]


NOTES = """\
* **Priorities.** Ray starts its worker processes at nice 15 (`worker_niceness`). radixserve's `placement.niceness`
  (0 by default) puts the ingress, the engine replica and its IndexBuilder back at 0, and `radixserve serve` sets
  `RAY_worker_niceness` for the Ray it starts, so Serve's controller and proxies run at 0 too; the process table
  shows each level as it ran. Every vLLM process runs at 0. The load generator (this script's client threads)
  runs beside both alike, at the priority it was started with.
* **What vLLM's CPU path does that ours does not** (vLLM 0.32: `v1/worker/cpu_worker.py`,
  `utils/ompmultiprocessing.py`, `platforms/cpu.py`, `model_executor/layers/utils.py`,
  `v1/attention/backends/cpu_attn.py`). Three processes: the API server (HTTP, chat template, tokenizing), the
  engine core (scheduler; its torch threads cut to 1) and the worker (the model), over ZMQ and shared memory. The
  API server puts torch's libgomp in `LD_PRELOAD`, and the worker's OpenMP threads are bound one per core of
  `VLLM_CPU_OMP_THREADS_BIND` (`GOMP_CPU_AFFINITY` with libgomp preloaded, else `OMP_PLACES` + `OMP_PROC_BIND`;
  `KMP_AFFINITY` with Intel OpenMP): the process table shows the worker's master thread and every thread it
  starts later on the first core and its second OpenMP thread on the other. Its `auto` default keeps one core for
  the other processes (reserve_cpu_num = 1), so on 2 cores the model gets one: with it, vLLM tied us. Every
  linear layer runs a oneDNN matmul primitive built once at load with its weight prepacked (`create_onednn_mm`;
  float32 here, the AMX kernels are for bf16/int8). Attention is its own C++ kernel over a paged KV cache, one call
  per layer for the whole scheduled batch of variable-length sequences. The model is compiled at start-up
  (torch.compile traced once, Inductor's C++ backend: norms, rotary, SiLU-and-mul and residual adds fused), the
  first time for each model path and runner, then read from `~/.cache/vllm`. Prefill is chunked under a token
  budget per step (2,048 tokens for the API server on CPU). Automatic prefix caching reuses only whole KV blocks,
  128 tokens on CPU, and the shared prefixes here (about 75 tokens of prompt and query for a rerank, about 30 of
  instruction) are shorter than one block: vLLM computes every token (its log's hit rate, in the start-up table).
* **Ours on the CPU**: the decoder layers' linears as oneDNN gemms on weights prepacked at load, as vLLM's
  (`radix_core/packed_linear.py`), the rest torch's eager aten kernels (no compiled fusion; the norms, SiLU MLP and
  rotary in upstream's operations with fewer passes, `radix_core/lean_layers.py`), the engine replica's
  torch threads (its CPU reservation rounded up) left to the OS scheduler, attention one kernel call per bucket of
  padded blocks (`radix_core/padded_blocks.py`), and each request crosses Ray's HTTP proxy, the ingress replica
  and the engine replica (and the IndexBuilder actor): the process table says which process spent the machine.
* **Same prompts on both**: the reranker's chat template is rendered from radixserve's Qwen3-Reranker template
  (`rerank_chat_template`), the instruction is written into the embedded texts, and vLLM gets, as text, the end
  token that radixserve's embedding template appends; equal input tokens and scores within the tolerance check
  it on every request of the last round. The difference left is float32 rounding: radixserve computes a shared
  prefix once and merges attention over blocks, so its sums run in another order.
* Each server starts afresh for each round (caches empty) and is warmed up by one request per workload kind that
  no measured request repeats; the start-up times include Ray's start and the engine replica's warm-up, and
  vLLM's compile where its cache did not hold it yet.
"""


def write_report(args, workloads: list, runs: dict, launches: list, agreed: dict, meta: dict) -> None:
    summary = summarize(workloads, runs)
    v = meta["versions"]
    banner = ("> **Busy machine: these figures are not the measurement.** Other work shared the 2 cores during this "
              "short run (see the load averages); it checks that both servers start, answer, agree and stop. Rerun "
              "the command without `--busy` and with the default counts on a quiet machine for the figures.\n\n"
              ) if args.busy else ""
    starts = ["| round | server | seconds to answer /health | from its log | left after its shutdown, killed |",
              "|---|---|---|---|---|"]
    starts += [f"| {x.round} | {x.server} | {x.start_s:.0f} | "
               f"{', '.join(f'{k}: {val}' for k, val in x.log_facts.items()) or '-'} | "
               f"{', '.join(x.left) or 'nothing'} |" for x in launches]
    served_vs_alone = ", ".join(f"{name} {a['in_process_diff']:.2g}" for name, a in agreed.items())
    text = "\n".join([
        f"# radixserve against vLLM's CPU build, side by side\n\n{banner}Command: `{command_line(args)}` on "
        f"{machine()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {len({x.round for x in launches})} "
        f"round(s) in {meta['seconds'] / 60:.1f} minutes, 1-minute load average {meta['load'][0]:.1f} before and "
        f"{meta['load'][1]:.1f} after. Model: {tiny_model('bench')}, a Qwen3-Reranker-style causal LM with the "
        f"repository's tiny tokenizer, float32 on both. vLLM {v['vllm']} (torch {v['vllm torch']}), radixserve at "
        f"{v['radixserve commit']}. Items/s is documents (rerank) or texts (embed) per second of the median round; "
        "N'/N is the share of input tokens radixserve computed; `bench/peer_vllm.py`'s docstring says how each "
        "server is started and called.\n", *results_table(workloads, summary, agreed),
        "\nPer-document cost against request size (reranks; below 1 in the last column: larger requests cost less "
        "per document):\n", *cost_table(summary),
        f"\nScore agreement: the largest |difference| between the servers' answers to the same requests, over every "
        f"score (rerank) or embedding component (normalised vectors), tolerance {args.tolerance:g}; radixserve served "
        f"against in-process (other batches, the same engine): {served_vs_alone}. Embedding "
        f"instruction ({len(meta['instruction'].split())} words): \"{meta['instruction']}\".\n",
        "Processes of each server in the first round, during its measured workloads:\n", *process_table(launches),
        "\nStart-ups:\n", *starts, "\n## Notes\n", NOTES])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peer_vllm.md").write_text(text)
    (args.out / "peer_vllm.json").write_text(json.dumps(
        {"command": command_line(args), "machine": machine(), "busy": args.busy, **meta, "summary": summary,
         "agreement": agreed, "launches": [vars(x) for x in launches],
         "workloads": {w.name: {"clients": w.clients, "requests": len(w.requests), "per_request": w.per_request}
                       for w in workloads}}, indent=1))
    plot(summary, args.out / "peer_vllm.png", args.busy)
    print(text)


def plot(summary: dict, path: Path, busy: bool) -> None:
    """Items/s per workload and side; ms per document against documents per request."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, (bars, cost) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, side in enumerate((*SIDES, IN_PROCESS)):
        bars.bar(np.arange(len(names)) + 0.27 * i, [summary[n][side]["items/s"] for n in names], 0.27, label=side)
        cost.plot([8, 256], [summary[n][side]["ms/item"] for n in ("rerank 8 docs", "rerank 256 docs")], "o-",
                  label=side)
    bars.set_xticks(np.arange(len(names)) + 0.27, [f"{n}\nours / vLLM {summary[n]['ratio']:.2f}" for n in names],
                    fontsize=8)
    bars.set_ylabel("documents or texts / s")
    cost.set_xscale("log", base=2)
    cost.set_xlabel("documents per rerank request")
    cost.set_ylabel("ms per document")
    for ax in (bars, cost):
        ax.legend(fontsize=8)
    what = "radixserve and vLLM's CPU build, same model and requests, one server at a time"
    fig.suptitle(plot_title(what + (" (BUSY MACHINE: not the measurement)" if busy else ""), tiny_model("bench")),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
