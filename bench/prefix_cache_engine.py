"""The prefix cache at the engine level (issue 23): streams of batches through one engine with the cache and one
without, on the CPU, the two runs of each batch in alternating order.

Model: the `bench` preset of `radix_core.tiny_models` (Qwen3 architecture, hidden 512, 8 layers, 8 heads, 4 KV
heads, head dim 64, random weights, float32; 18,432 bytes per cached row, so the default 256 MiB holds 14,563
rows). Both engines warm up first (radix "auto" calibrates its cost model); batches are prepared outside the
timing (the IndexBuilder's work in the server), so the times are `Engine.run`: with the cache, lookup, planning,
the layers and the commit.

* few-shot: 16 prompts of 1,024 tokens; each batch 4 inputs of 20-60 tokens behind one prompt drawn at random
  (the batcher groups one prefix key into a batch). 16 x 1,024 rows are more than the default budget holds, so
  the least recently drawn prompts are evicted.
* paged rerank: 12 queries x 256 passages of the MS MARCO shape (50-token template, 8-19-token query, 40-120-token
  passages, 10-token suffix), batches of 8 passages of one query, the queries' pages interleaved at random.
* no reuse: batches of 8 sequences of 128-384 random tokens, none seen twice: what lookups and ghosts cost.
* new prompt per batch: the few-shot shape with a new 1,024-token prompt in every batch, so nothing is read back:
  each prompt is shared by the batch's 4 sequences, so it enters the cache (its K/V copied) and is evicted unread
  once the budget is full: what admission and eviction cost where nothing is reused.
* served few-shot: the batches the engine replica runs on the served few-shot stream of 6 prompts
  (`prefix_cache_bench.py`): 2 classify requests a batch, each 4 inputs of 20-60 tokens x 2 labels behind one of 6
  prompts of 1,024 tokens, with the requests' origins (the prompt is a request's shared prefix: admitted; an input,
  shared by its two labels, is its request's own: not), so the cache admits what it admits served.

Per stream: seconds over all batches with and without the cache, the speed-up, rows computed over tokens (N'/N,
in-batch sharing alone and with the cache), the speed-up over the ratio of rows computed (how much of the cache's
saving in rows reaches the time: a row that reads a cached prompt still attends to all of its keys, which no row
count shows), the hit ratio, bytes held at the end against the budget, evictions.

Then what the cache's bookkeeping costs a batch on the host, without the model: a lease (lookup of every
sequence, ghosts, admissions), its cached ranges and its commit (K/V copies into segments, and the lease's end:
recency, ghost trimming), in CPU time, for batches of 16, 100 and 1,000 rerank sequences (a 60-token template, a
new 12-token query per batch, 40-120-token passages, a 10-token suffix: the template read from the cache, the
query admitted, the passages left as ghosts), mean over 20 batches. On a GPU this is time the device waits, next
to a forward of the same batch; the target is <= 5 ms per 1,000 sequences (issue 30).

    PYTHONPATH=.:bench python bench/prefix_cache_engine.py [--batches 48] [--threads 1] [--out bench/results]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from workloads import MsMarco, tokens

from radix_core.cached_rows import RowShape
from radix_core.engine import Engine
from radix_core.prefix_cache import DEFAULT_CPU_BYTES, Origins, PrefixCache
from radix_core.tiny_models import PRESETS, make_tiny_model


def few_shot(rng: np.random.Generator, batches: int) -> list[list[list[int]]]:
    prompts = [tokens(rng, 1024) for _ in range(16)]
    return [[prompts[which] + tokens(rng, int(rng.integers(20, 61))) for _ in range(4)]
            for which in rng.integers(0, 16, batches)]


def paged_rerank(rng: np.random.Generator, batches: int) -> list[list[list[int]]]:
    shape = MsMarco(queries=12, passages_per_query=256)
    template, suffix = tokens(rng, shape.template_tokens), tokens(rng, shape.suffix_tokens)
    pages = []
    for _ in range(shape.queries):
        query = tokens(rng, int(rng.integers(shape.query_tokens[0], shape.query_tokens[1] + 1)))
        passages = [tokens(rng, int(rng.integers(shape.passage_tokens[0], shape.passage_tokens[1] + 1)))
                    for _ in range(shape.passages_per_query)]
        pages += [[template + query + p + suffix for p in passages[i:i + 8]] for i in range(0, len(passages), 8)]
    order = rng.permutation(len(pages))[:batches]
    return [pages[i] for i in order]


def no_reuse(rng: np.random.Generator, batches: int) -> list[list[list[int]]]:
    return [[tokens(rng, int(rng.integers(128, 385))) for _ in range(8)] for _ in range(batches)]


def new_prompts(rng: np.random.Generator, batches: int) -> list[list[list[int]]]:
    return [[prompt + tokens(rng, int(rng.integers(20, 61))) for _ in range(4)]
            for prompt in (tokens(rng, 1024) for _ in range(batches))]


def served_few_shot(rng: np.random.Generator, batches: int) -> list[tuple[list[list[int]], Origins]]:
    """The served few-shot stream's batches (`prefix_cache_bench.py`, `few-shot, 6 prompts`): 2 classify requests a
    batch, each 4 inputs x 2 labels behind one of 6 prompts, with their origins (the prompt is each request's shared
    prefix; an input, shared by its labels, is the request's own), as the engine replica runs them."""
    prompts, labels = [tokens(rng, 1024) for _ in range(6)], [tokens(rng, 2) for _ in range(2)]
    stream = []
    for b in range(batches):
        requests = [(prompts[which], [tokens(rng, int(rng.integers(20, 61))) for _ in range(4)])
                    for which in rng.integers(0, len(prompts), 2)]
        batch = [prompt + text + label for prompt, inputs in requests for text in inputs for label in labels]
        per_request = len(batch) // len(requests)
        ids = np.arange(len(requests) * b, len(requests) * (b + 1))  # no request id twice in the stream
        shared = np.array([len(prompt) for prompt, _ in requests])  # each request's shared prefix: its prompt
        stream.append((batch, Origins(np.repeat(ids, per_request), np.repeat(shared, per_request))))
    return stream


STREAMS: dict[str, Callable[[np.random.Generator, int], list]] = {
    "few-shot 16x1024 + 4x(20..60)": few_shot, "paged rerank 12x256 by 8": paged_rerank,
    "no reuse 8x(128..384)": no_reuse, "new prompt per batch 1024 + 4x(20..60)": new_prompts,
    "served few-shot 6x1024, 2 requests of 4x(20..60) x 2 labels": served_few_shot}


def run_stream(cached: Engine, plain: Engine, stream: list) -> dict[str, float]:
    """Seconds of each engine over the stream (the two runs of a batch alternate which goes first), and the
    rows each computed. A batch is its sequences, or (sequences, their `Origins`) for the cache's admission;
    without origins each sequence is a request of its own."""
    cached.prefix_cache.clear()
    seconds, rows, tokens_total = {"cache": 0.0, "no cache": 0.0}, {"cache": 0, "no cache": 0}, 0
    for i, batch in enumerate(stream):
        batch, origins = batch if isinstance(batch, tuple) else (batch, None)
        runs = {"cache": (cached, cached.prepare(batch)), "no cache": (plain, plain.prepare(batch))}
        for name in list(runs)[i % 2:] + list(runs)[:i % 2]:
            engine, prepared = runs[name]
            started = time.perf_counter()
            result = engine.run(prepared, origins=origins)
            seconds[name] += time.perf_counter() - started
            rows[name] += result.num_computed
        tokens_total += result.num_tokens
    stats = cached.prefix_cache.stats()
    speed_up, row_ratio = seconds["no cache"] / seconds["cache"], rows["no cache"] / rows["cache"]
    return {"seconds cache": seconds["cache"], "seconds no cache": seconds["no cache"],
            "speed-up": speed_up, "N'/N no cache": rows["no cache"] / tokens_total,
            "N'/N cache": rows["cache"] / tokens_total, "speed-up / row ratio": speed_up / row_ratio,
            "hit ratio": stats.hit_ratio,
            "MiB held": stats.bytes / 2**20, "MiB budget": stats.budget_bytes / 2**20,
            "evictions": stats.evictions}


def lease_costs(shape: RowShape, sizes: tuple[int, ...] = (16, 100, 1000), batches: int = 20) -> dict[int, dict]:
    """Mean CPU milliseconds (`time.process_time`) of a lease's lookup, ranges and commit (with the lease's end)
    per batch of `sizes` sequences, and their sum: the host bookkeeping the cache adds to a batch."""
    rng = np.random.default_rng(0)
    template, suffix = tokens(rng, 60), tokens(rng, 10)
    costs = {}
    for size in sizes:
        cache, spent = PrefixCache(shape, DEFAULT_CPU_BYTES), {"lookup ms": 0.0, "ranges ms": 0.0, "commit ms": 0.0}
        for _ in range(batches):
            query = tokens(rng, 12)  # a new rerank request's query: the template is read, the query admitted
            seqs = [template + query + tokens(rng, int(rng.integers(40, 121))) + suffix for _ in range(size)]
            ids, cu = np.concatenate(seqs), np.cumsum([0] + [len(s) for s in seqs])
            started = time.process_time()
            with cache.lease(ids, cu) as lease:
                looked_up = time.process_time()
                lease.past(lease.matched)
                ranged = time.process_time()
                lease.commit(lease.keep(torch.arange(lease.admitted_rows)))
            for name, seconds in zip(spent, (looked_up - started, ranged - looked_up, time.process_time() - ranged)):
                spent[name] += seconds * 1e3 / batches
        costs[size] = {**spent, "total ms": sum(spent.values()), "segments": cache.stats().segments}
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=48, help="batches per stream")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(make_tiny_model(Path(tmp) / "bench", "qwen3", "base", **PRESETS["bench"]))
        cached = Engine.from_pretrained(path, device="cpu")
        plain = Engine.from_pretrained(path, device="cpu", prefix_cache_bytes=0)
        for engine in (cached, plain):
            engine.warm_up()
        results = {name: run_stream(cached, plain, make(np.random.default_rng(0), args.batches))
                   for name, make in STREAMS.items()}
        costs = lease_costs(cached.prefix_cache.shape)
    columns = list(next(iter(results.values())))
    lines = [f"# Prefix cache, engine level ({args.batches} batches per stream, bench preset, CPU, "
             f"{torch.get_num_threads()} threads)", "", "Command: `PYTHONPATH=.:bench python "
             f"bench/prefix_cache_engine.py --batches {args.batches}"
             f"{f' --threads {args.threads}' if args.threads else ''}`", "",
             "| stream | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name, row in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c])
                                                  for c in columns) + " |")
    names = list(next(iter(costs.values())))
    lines += ["", "Bookkeeping per batch (no model, CPU ms):", "", "| sequences | " + " | ".join(names) + " |",
              "|---|" + "---|" * len(names)]
    lines += [f"| {size} | " + " | ".join(f"{row[n]:.2f}" if isinstance(row[n], float) else str(row[n])
                                         for n in names) + " |" for size, row in costs.items()]
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefix_cache_engine.md").write_text(table)


if __name__ == "__main__":
    main()
