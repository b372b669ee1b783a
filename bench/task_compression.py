"""Compression N'/N of the MS MARCO-shaped rerank batch with the real Qwen3-Reranker prompt.

The shape is that of docs/ARCHITECTURE.md, section 7 "Benchmark shapes".

One 64-sequence batch: the texts of `workloads.MsMarco` (8 queries x 8 passages of 40-120 tokens, search queries
and sentences of `radix_core/data/tiny_corpus.txt`), each sequence the Qwen3-Reranker prompt (system prompt,
default instruction, query, passage, assistant suffix) tokenized by `radix_core.prompt_encoding` with the tiny
byte-level BPE tokenizer. `N` counts the batch's tokens and `N'` the compact tokens of its radix index; the same
figures come back as `usage` from `Engine.rerank` on a tiny Qwen3 model (checked here).

    python bench/task_compression.py [--seed 0] [--out bench/results/task_compression.md]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
from tqdm import tqdm
from workloads import QueryPassages, msmarco_texts, token_counter

from radix_core.engine import Engine
from radix_core.index import build_radix_index, flatten_sequences
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "task_compression.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine.from_pretrained(str(make_tiny_model(Path(tmp) / "qwen3", "qwen3", "causal_lm")),
                                        device="cpu", radix="full")
        texts = msmarco_texts(np.random.default_rng(args.seed), token_counter(engine.prompts.tokenizer))
        measured = measure(engine, texts)
        text = report(measured, args.seed)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    picture = args.out.with_suffix(".png")
    args.out.write_text(text + f"\n![N'/N of the batch and of the calls]({picture.name})\n", encoding="utf-8")
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
