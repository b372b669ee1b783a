"""Compression N'/N of the MS MARCO-shaped rerank batch with the real Qwen3-Reranker prompt; and of long documents
reranked by chunks.

The shape is that of docs/ARCHITECTURE.md, section 7 "Benchmark shapes".

One 64-sequence batch: the texts of `workloads.MsMarco` (8 queries x 8 passages of 40-120 tokens, search queries
and sentences of `radix_core/data/tiny_corpus.txt`), each sequence the Qwen3-Reranker prompt (system prompt,
default instruction, query, passage, assistant suffix) tokenized by `radix_core.prompt_encoding` with the tiny
byte-level BPE tokenizer. `N` counts the batch's tokens and `N'` the compact tokens of its radix index; the same
figures come back as `usage` from `Engine.rerank` on a tiny Qwen3 model (checked here).

    python bench/task_compression.py [--seed 0] [--out bench/results/task_compression.md]

`--long-documents`: `workloads.LONG_DOCUMENTS`, 12 queries x 32 pages of 2,000-6,000 tokens, each query one rerank
request with `long_documents="chunk"` and chunks of 512 tokens (the default overlap and chunk bound), on engines in
radix modes `mlp` and `full`; side by side in the same run, the same chunks' texts sent as documents of their own (a
client chunking for itself: one request per query, every chunk a document) to an engine in mode `off`. N, N', the
time of each request (encode; forward and merge) and the FLOP bound of each mode are measured, and each pooled score
is checked against the best of its chunks' scores.

    python bench/task_compression.py --long-documents [--seed 0] [--out bench/results/long_documents.md]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm
from workloads import LONG_DOCUMENTS, QueryPassages, msmarco_texts, token_counter

from radix_core.engine import Engine
from radix_core.index import build_radix_index, flatten_sequences
from radix_core.mode_cost import ModelShape, mode_works
from radix_core.tasks import TASKS, RerankJob, RerankRequest, RerankResult
from radix_core.tasks.rerank import encode_rerank
from radix_core.templates import QWEN3_RERANKER
from radix_core.tiny_models import make_tiny_model


def measure(engine: Engine, requests: list[QueryPassages]) -> dict:
    """N and N' of the whole 64-sequence batch (from its radix index and from the engine's forward), of the 8
    requests reranked one by one, and the mean tokens of each prompt part."""
    context = engine.context
    encoded = [encode_rerank(context, QWEN3_RERANKER, r.query, r.passages, None, truncate=False,
                             truncation_direction="right", max_document_tokens=None) for r in requests]
    batch = [seq for e in encoded for seq in e.sequences]
    index = build_radix_index(*flatten_sequences(batch))
    forward = engine.forward(batch, mode="full")
    assert (forward.num_tokens, forward.num_computed) == (index.num_tokens, index.num_compact)
    per_request = [engine.rerank(r.query, r.passages).usage for r in tqdm(requests, desc="rerank calls", unit="call")]
    common = len(os.path.commonprefix(batch))  # tokens every sequence shares: system prompt and instruction
    suffix = len(engine.prompts.encode(QWEN3_RERANKER.suffix))
    return {
        "n": index.num_tokens,
        "n_compact": index.num_compact,
        "request_n": sum(u.input_tokens for u in per_request),
        "request_compact": sum(u.computed_tokens for u in per_request),
        "common": common,
        "query": float(np.mean([len(e.shared_ids) - common for e in encoded])),
        "passage": float(np.mean([len(s) - len(e.shared_ids) - suffix for e in encoded for s in e.sequences])),
        "suffix": suffix,
    }


def report(m: dict, seed: int) -> str:
    ratio, request_ratio = m["n_compact"] / m["n"], m["request_compact"] / m["request_n"]
    return "\n".join([
        "# Task compression: MS MARCO-shaped rerank batch",
        "",
        f"Command: `python bench/task_compression.py --seed {seed}`",
        "",
        "64 sequences (8 queries x 8 passages of 40-120 tokens) in the real Qwen3-Reranker prompt, tokenized by",
        "`radix_core.prompt_encoding` with the tiny byte-level BPE tokenizer; N'/N from the batch's radix index, equal",
        "to `num_computed / num_tokens` of `Engine.forward` in mode `full`.",
        "",
        "| batch | N | N' | N'/N | N/N' |",
        "|---|---|---|---|---|",
        f"| one batch of 64 sequences | {m['n']} | {m['n_compact']} | {ratio:.3f} | {1 / ratio:.2f}x |",
        f"| 8 rerank calls of 8 passages | {m['request_n']} | {m['request_compact']} | {request_ratio:.3f} | "
        f"{1 / request_ratio:.2f}x |",
        "",
        f"Mean tokens per sequence: {m['common']} shared by all 64 (system prompt, instruction, `<Query>:`), "
        f"{m['query']:.1f} shared by a query's 8 passages (the query, its newline), {m['passage']:.1f} per passage "
        f"(`<Document>: ` and the passage, tokenized together), {m['suffix']} suffix (identical ids, but after the "
        f"passage, so computed per sequence).",
        "",
    ])


QWEN3_06B = ModelShape(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072)
CHUNKED = ("mlp", "full")  # the radix modes the pages are reranked by chunks in


def measure_long(engines: dict[str, Engine], groups: list[QueryPassages]) -> dict:
    """Each query's pages reranked by chunks on the engines of radix modes `CHUNKED`, and their chunks' texts as
    documents on the engine of mode off, in turn per query: tokens, computed rows, seconds encoding (tokenizing,
    chunking) and running (forward, head) of each, the FLOPs of each mode's forward, and the largest gap between
    a pooled score and the best of its chunks' scores run alone."""
    runs = {mode: np.zeros(4) for mode in engines}  # input tokens, computed rows, encode s, forward s
    shapes = {"the tiny model": ModelShape.of(engines["off"].arch.config), "Qwen3-Reranker-0.6B": QWEN3_06B}
    flops = {name: dict.fromkeys(engines, 0.0) for name in shapes}
    chunks, gap = 0, 0.0
    for engine in engines.values():  # first calls pay one-time set-up; not timed
        engine.rerank("warm up", ["a first call"] * 4)
    for group in tqdm(groups, desc="queries", unit="request"):
        request = RerankRequest(group.query, group.passages, long_documents="chunk", chunk_tokens=512)
        chunked = {mode: timed(engines[mode], request) for mode in CHUNKED}
        plan = chunked[CHUNKED[0]].job
        texts = plan.chunks.texts(group.passages)
        alone = timed(engines["off"], RerankRequest(group.query, texts, long_documents="truncate"))
        for mode, run in {**chunked, "off": alone}.items():
            runs[mode] += run.figures
        prepared = engines["full"].prepare(plan.sequences, "full")
        works = mode_works(prepared.index, prepared.cascade)
        for name, shape in shapes.items():
            for mode in engines:
                flops[name][mode] += shape.flops(works[mode])
        scores = np.zeros(len(texts))
        scores[[h.index for h in alone.result.results]] = [h.score for h in alone.result.results]
        best = np.maximum.reduceat(scores, plan.chunks.firsts)  # (D,) the pooled score, from the chunks alone
        gap = max(gap, *(abs(h.score - best[h.index]) for run in chunked.values() for h in run.result.results))
        chunks += len(texts)
    return {"runs": runs, "chunks": chunks, "documents": sum(len(g.passages) for g in groups),
            "requests": len(groups), "gap": gap, "flops": flops}


@dataclass(frozen=True)
class Timed:
    job: RerankJob
    result: RerankResult
    figures: np.ndarray  # (4,) input tokens, computed rows, encode s, forward s


def timed(engine: Engine, request: RerankRequest) -> Timed:
    """One request through the library's halves (`Engine.answer` step by step), each timed."""
    task = TASKS["rerank"]
    started = time.perf_counter()
    job = task.encode(engine.context, request)
    encoded = time.perf_counter()
    result = task.merge(job, engine.run_jobs([job]))
    done = time.perf_counter()
    usage = result.usage
    return Timed(job, result, np.array([usage.input_tokens, usage.computed_tokens, encoded - started,
                                        done - encoded]))


def report_long(m: dict, seed: int, page_tokens: list[int]) -> str:
    runs, rows = m["runs"], []
    labels = {mode: f'`long_documents="chunk"`, radix `{mode}`' for mode in CHUNKED}
    for mode, label in {**labels, "off": "the chunks' texts as documents, radix `off`"}.items():
        n, computed, encode, forward = runs[mode]
        seconds = encode + forward
        bounds = " / ".join(f"{flops['off'] / flops[mode]:.2f}x" for flops in m["flops"].values())
        rows.append(f"| {label} | {n:.0f} | {computed:.0f} | {computed / n:.3f} | {encode:.1f} | {forward:.1f} | "
                    f"{runs['off'][3] / forward:.2f}x | {bounds} | {m['documents'] / seconds:.2f} | "
                    f"{m['chunks'] / seconds:.1f} | {n / seconds:,.0f} |")
    return "\n".join([
        "# Long documents by chunks: 12 queries x 32 pages of 2,000-6,000 tokens",
        "",
        f"Command: `python bench/task_compression.py --long-documents --seed {seed}`",
        "",
        f"{m['requests']} rerank requests (one per query) of 32 pages each, {m['documents']} pages of "
        f"{min(page_tokens)}-{max(page_tokens)} tokens (mean {np.mean(page_tokens):.0f}), cut into {m['chunks']} "
        "chunks of at most 512 tokens (overlap 64) in the real Qwen3-Reranker prompt, on the tiny Qwen3 model "
        "(hidden 64, 2 layers) on the CPU, without the prefix cache. Every row scores the same chunks, each query's "
        "request in turn on every engine: by the server's chunking (the template and query computed once for all "
        "chunks of all pages of a request) in radix modes `mlp` and `full`, or as documents a client cut itself "
        "(its cutting not timed) on an engine without sharing (`off`). Encode is tokenizing (and chunking), forward "
        "the batch and the head. The FLOP bound is off's forward FLOPs over the row's, from each batch's radix "
        "index and cascade plan (position-wise rows and attention pairs, `radix_core.mode_cost`), for the tiny "
        "model / for Qwen3-Reranker-0.6B's shape. A 2-core machine shared with other work (load average "
        f"{os.getloadavg()[0]:.1f} at the end), so the seconds are noisy.",
        "",
        "| run | N | N' | N'/N | encode s | forward s | forward speed-up | FLOP bound | pages/s | chunks/s | "
        "tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Largest difference between a page's pooled score (max) and the best of its chunks' scores run alone: "
        f"{m['gap']:.1e}.",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--long-documents", action="store_true", help="the long-documents run (module docstring)")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/task_compression.md, or "
                                                               "long_documents.md with --long-documents")
    args = parser.parse_args()
    results = Path(__file__).parent / "results"
    out = args.out or results / ("long_documents.md" if args.long_documents else "task_compression.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_tiny_model(Path(tmp) / "qwen3", "qwen3", "causal_lm"))
        if args.long_documents:  # no prefix cache: off shares nothing, the chunked rows only within a request
            engines = {mode: Engine.from_pretrained(model, device="cpu", radix=mode, prefix_cache_bytes=0)
                       for mode in (*CHUNKED, "off")}
            count_tokens = token_counter(engines["off"].prompts.tokenizer)
            groups = msmarco_texts(np.random.default_rng(args.seed), count_tokens, LONG_DOCUMENTS)
            text = report_long(measure_long(engines, groups), args.seed,
                               [count_tokens(p) for g in groups for p in g.passages])
            print(text)
            out.write_text(text, encoding="utf-8")
            return
        engine = Engine.from_pretrained(model, device="cpu", radix="full")
        count_tokens = token_counter(engine.prompts.tokenizer)
        measured = measure(engine, msmarco_texts(np.random.default_rng(args.seed), count_tokens))
        text = report(measured, args.seed)
    print(text)
    picture = out.with_suffix(".png")
    out.write_text(text + f"\n![N'/N of the batch and of the calls]({picture.name})\n", encoding="utf-8")
    plot(measured, picture)


def plot(m: dict, path: Path) -> None:
    """N'/N as bars: one batch of 64 sequences against 8 rerank calls of 8."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.barh(["one batch of 64 sequences", "8 rerank calls of 8 passages"],
            [m["n_compact"] / m["n"], m["request_compact"] / m["request_n"]])
    ax.set(xlabel="N'/N (rows computed over tokens)", xlim=(0, 1), title="MS MARCO-shaped rerank, Qwen3 prompt")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
