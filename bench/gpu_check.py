"""GPU check: every CUDA path against its reference, then timings on the paper's shapes (sized for < 10 min, one H200).

    python bench/gpu_check.py [--out bench/results/gpu/gpu_check.md] [--sections ...] [--attention ...]

Runs from the repository root with or without the project installed (the checkout's `radix_core` comes first on
the path), on a machine with torch, triton, numpy, transformers and tokenizers (no Ray); `bench/gpu_run.sh` is the
one command for a lent GPU machine. Sections (`--sections`, default all, in this order):

* `warmup`: `Engine.warm_up` on CUDA per backend (`gpu_engine_checks.py`): the seconds a replica spends compiling
  before it reports ready, and for flash-attn that the engine section's batches compile nothing more. First, so
  the figure is a cold start in this process (its note counts the files the persistent compile caches held).
* `kernels`: kernels against their torch references: `gather_rows` (exact) and `segment_attention` (output and
  log-sum-exp, per-dtype tolerance) in both calls of cascade attention, the causal self call over the radix
  tree's segments and the unmasked prefix call of the rows below each shared segment, on shared-prefix batches
  with duplicates, one-token batches and a batch of more than 256 blocks (flash-attn 4's other scheduler), GQA
  ratios 1/4/8 and head dims 64/128, fp32/bf16/fp16; the Triton launch on a second GPU when there is one; then
  the engine's cascade attention end to end (self call, prefix call, log-sum-exp merge, over the metadata
  `plan_compact` builds) through its `TritonAttention` and flash-attn 4 `FlashAttention` backends against a
  torch reference of each sequence's block over its whole path.
* `engine`, `tasks` (`gpu_engine_checks.py`): hidden states of each dtype x attention backend x mode (`off`,
  `mlp`, `full`) on a tiny Qwen3 with head_dim 128 and GQA against a CPU float64 engine, including `[[7], [7]]`
  and a batch of more than 256 blocks; then every task head (rerank by yes/no logits and by a score head,
  embed, classify, score) the same way.
* `invariance` (`gpu_engine_checks.py`): `batch_invariant` (issue 32): a sequence's final hidden states bitwise the
  same alone and inside other batches, in every mode, prefix cache cold and warm, fp32 and bf16 (Triton chunk tiles,
  fixed row tiles); the default engine's differences on the same batches noted beside.
* `hybrid` (`gpu_engine_checks.py`): a tiny Qwen3.5 (Gated DeltaNet + gated attention) in fp32 and bf16, each
  backend and mode, against a CPU float64 engine; the recurrence through flash-linear-attention's chunked kernel
  when it is installed (the `gpu` extra), else the torch reference rule (the section's title says which).
* `paper`: the paper's shape for correctness.
* `timings` (CUDA events, warmups, medians): `gather_rows` vs `torch.index_select` on rows 16000 and 100000,
  widths 1024 and 2048, bf16; attention on 32 x (2048 shared + 256 unique) tokens with Qwen3-8B heads (32 query
  heads, 8 kv heads, head dim 128), bf16: segment attention at several tile shapes (the self call over the
  2048-row prefix segment and 32 segments of 256, plus the prefix call of the 32 x 256 rows against the prefix;
  the log-sum-exp merge not included), the Triton and flash-attn backends' whole cascade (merge included),
  flash-attn over whole gathered paths (round one's `full` mode), flash-attn in RadixMLP's layout (scatter
  q/k/v to all N rows, attend, gather back), and the torch references. Each timing is guarded like a check.

`--attention` (default torch triton flash) picks whose rows run: `torch` the engine's torch backend and the torch
reference timings, `triton` the Triton kernels and backend, `flash` flash-attn 4 (so a machine without it runs
`--attention torch triton`, and a later pass `--attention flash`).

Writes each result to a markdown report (default `bench/results/gpu/gpu_check.md`) as it comes, and prints it.
A section that fails outside its guarded checks is recorded and the next one runs. Exits 1 if a check or timing
failed or did not run though this machine supports it (flash-attn 4 asked for but not loading on compute
capability >= 8 counts), 2 without CUDA.
"""

# ruff: noqa: E402  (the checkout goes on the path before its imports)
from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's radix_core, installed or not

import numpy as np
import torch
import torch.nn.functional as F
import triton
from gpu_engine_checks import engine_checks, hybrid_checks, invariance_checks, task_checks, warmup_timings
from gpu_report import CHECK_COLUMNS, TIMING_COLUMNS, Check, Report

from radix_core.attention import AttentionMetadata, FlashAttention, TritonAttention
from radix_core.batch import PreparedBatch
from radix_core.cascade import cascade_plan
from radix_core.engine import many_blocks_batch
from radix_core.forward import plan_compact
from radix_core.index import RadixIndex, build_radix_index, flatten_sequences
from radix_core.kernels import (
    AttentionTiles,
    default_tiles,
    gather_rows,
    gather_rows_reference,
    segment_attention,
    segment_attention_reference,
)

ATTENTION_TOLERANCE = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}  # max abs error
TILE_CANDIDATES = [AttentionTiles(64, 64, 4, 3), AttentionTiles(128, 64, 8, 3), AttentionTiles(128, 128, 8, 3),
                   AttentionTiles(64, 32, 4, 4)]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def shared_prefix_index(num_seqs: int, shared: int, unique: tuple[int, int], seed: int,
                        duplicates: int = 0) -> RadixIndex:
    """`num_seqs` sequences: one shared prefix, then `unique[0]..unique[1]` own tokens; plus exact duplicates
    of the first `duplicates` sequences (empty query blocks)."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 30000, shared).tolist()
    sequences = [prefix + rng.integers(0, 30000, rng.integers(unique[0], unique[1] + 1)).tolist()
                 for _ in range(num_seqs)]
    sequences += [list(sequences[i]) for i in range(duplicates)]
    return build_radix_index(*flatten_sequences(sequences))


def segment_calls(index: RadixIndex, device: str = "cuda") -> dict[str, dict]:
    """`segment_attention`'s keyword arguments by kind, from the engine's own `full`-mode metadata for `index`
    (as `TritonAttention` passes them): "self", each radix-tree segment causal over itself, and, when a segment
    has descendants, "prefix", one block per such segment whose queries are all the rows below it."""
    meta = full_metadata(index, device)
    cu = meta.causal.cu_seqlens  # (S+1,)
    calls = {"self": dict(cu_seqlens_q=cu, key_start=cu[:-1], key_end=cu[1:], max_seqlen_q=meta.causal.max_seqlen,
                          causal=True)}
    if meta.prefix is not None:
        prefix = meta.prefix
        calls["prefix"] = dict(q_rows=prefix.q_rows, cu_seqlens_q=prefix.cu_seqlens_q, key_start=prefix.key_start,
                               key_end=prefix.key_end, max_seqlen_q=prefix.max_seqlen_q, causal=False)
    return calls


def path_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: RadixIndex) -> torch.Tensor:
    """`full` mode's attention in plain torch (float32): each sequence's added block of compact rows over its whole
    path, causal aligned bottom-right; `(N', Hq, D)` in `q`'s dtype."""
    out = torch.zeros_like(q)  # (N', Hq, D)
    heads_first = lambda t: t.float().transpose(0, 1)  # noqa: E731  (L, H, D) -> (H, L, D)
    cu_q, cu_k = index.cu_seqlens_q.tolist(), index.cu_seqlens.tolist()
    for q_lo, q_hi, k_lo, k_hi in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]):
        if q_hi == q_lo:
            continue
        path = torch.from_numpy(index.scatter[k_lo:k_hi].astype(np.int64)).to(q.device)  # (Lk,)
        lq, lk = q_hi - q_lo, k_hi - k_lo
        visible = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)  # (Lq, Lk)
        block = F.scaled_dot_product_attention(heads_first(q[q_lo:q_hi]), heads_first(k[path]), heads_first(v[path]),
                                               attn_mask=visible, enable_gqa=True)  # (Hq, Lq, D)
        out[q_lo:q_hi] = block.transpose(0, 1).to(q.dtype)
    return out


def random_qkv(rows: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: str = "cuda"):
    q = torch.randn(rows, heads, head_dim, device=device).to(dtype)  # (N', Hq, D)
    k = torch.randn(rows, kv_heads, head_dim, device=device).to(dtype)  # (N', Hkv, D)
    v = torch.randn(rows, kv_heads, head_dim, device=device).to(dtype)  # (N', Hkv, D)
    return q, k, v


def full_metadata(index: RadixIndex, device: str = "cuda") -> AttentionMetadata:
    """The `full`-mode attention metadata the engine builds for `index` (causal segments, prefix blocks)."""
    input_ids = index.compact_input_ids[index.scatter].astype(np.int64)  # (N,) the batch's own ids
    prepared = PreparedBatch(input_ids, index.cu_seqlens.astype(np.int64), "full", index, cascade_plan(index))
    return plan_compact(prepared, torch.device(device)).attention


def max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return (got.float() - expected.float()).abs().max().item()


def segment_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: dict, **options) -> float:
    """Largest difference of `segment_attention`'s output and log-sum-exp from the torch reference's."""
    got = segment_attention(q, k, v, **call, **options)
    return max(map(max_error, got, segment_attention_reference(q, k, v, **call)))


@dataclass
class Run:
    """What this run checks: the attention backends asked for (`--attention`), and flash-attn 4's engine
    backend when it was asked for and loads (else None, `flash_note` says why)."""

    attentions: tuple[str, ...]
    flash: FlashAttention | None = None
    flash_note: str = ""

    @property
    def triton(self) -> bool:
        return "triton" in self.attentions

    def flash_check(self, report: Report, name: str, shape: str, dtype: torch.dtype,
                    measure: Callable[[FlashAttention], float]) -> None:
        """`measure(flash backend) -> error` as one check when flash-attn was asked for: not run (with why) when
        it does not load, which fails the run on compute capability >= 8."""
        if "flash" not in self.attentions:
            return
        if self.flash is None:
            report.check(Check(name, shape, _name(dtype), None, ATTENTION_TOLERANCE[dtype], self.flash_note,
                               torch.cuda.get_device_capability() >= (8, 0)))
            return
        report.guarded(name, shape, _name(dtype), ATTENTION_TOLERANCE[dtype], lambda: measure(self.flash))


def kernel_batches() -> dict[str, RadixIndex]:
    """Section `kernels`' batches: shared prefixes with duplicates (empty query blocks), one-token sequences
    (`max_seqlen_q` 1), and more than 256 blocks in both calls (`many_blocks_batch`: flash-attn 4's scheduler
    with its batch-lookup aid)."""
    many = many_blocks_batch()
    return {"12x(300+1..200)+2 dup": shared_prefix_index(num_seqs=12, shared=300, unique=(1, 200), seed=0,
                                                         duplicates=2),
            "6 one-token seqs, 3 dup (max_seqlen_q 1)": build_radix_index(*flatten_sequences([[7], [7], [8], [9],
                                                                                               [8], [9]])),
            f"{len(many)} seqs of 1-2 tokens (> 256 blocks)": build_radix_index(*flatten_sequences(many))}


def kernel_checks(report: Report, run: Run) -> None:
    """Section `kernels`: the kernels, and the engine's Triton and flash-attn cascades, against torch references."""
    report.section("Kernels and flash-attn against the torch reference", CHECK_COLUMNS)
    if run.triton:
        gather_checks(report)
        _second_device_check(report)
    for label, index in kernel_batches().items():
        calls, meta = segment_calls(index), full_metadata(index)
        for dtype in DTYPES:
            for heads, kv_heads, head_dim in ((8, 8, 64), (32, 8, 128), (16, 2, 128)):
                q, k, v = random_qkv(index.num_compact, heads, kv_heads, head_dim, dtype)
                shape = f"{label}, N'={index.num_compact}, {heads}/{kv_heads} heads, D={head_dim}"
                expected = path_attention_reference(q, k, v, index)
                if run.triton:
                    for kind, call in calls.items():
                        report.guarded(f"segment_attention {kind}", shape, _name(dtype), ATTENTION_TOLERANCE[dtype],
                                       lambda: segment_error(q, k, v, call))
                    report.guarded("Triton cascade, merged (engine backend)", shape, _name(dtype),
                                   ATTENTION_TOLERANCE[dtype], lambda: max_error(
                                       TritonAttention(q.device)(q, k, v, meta, head_dim**-0.5), expected))
                if dtype != torch.float32:
                    run.flash_check(report, "flash-attn 4 cascade, merged (engine backend)", shape, dtype,
                                    lambda flash: max_error(flash(q, k, v, meta, head_dim**-0.5), expected))


def gather_checks(report: Report) -> None:
    """`gather_rows` against `index_select`, bit for bit, per dtype and index dtype."""
    for dtype in DTYPES:
        for rows, width, index_dtype in ((1, 1, torch.int32), (4097, 1000, torch.int64), (20000, 2048, torch.int32)):
            x = torch.randn(rows, width, device="cuda").to(dtype)  # (rows, width)
            index = torch.randint(0, rows, (rows + 3,), device="cuda", dtype=index_dtype)  # (n,)
            report.guarded("gather_rows", f"{rows}x{width}, {_name(index_dtype)} index", _name(dtype), 0.0,
                           lambda: 0.0 if torch.equal(gather_rows(x, index), gather_rows_reference(x, index))
                           else float("inf"))


def _second_device_check(report: Report) -> None:
    """Triton launches on the tensors' device, not the thread's current one (item 8): a kernel on `cuda:1`."""
    name, shape = "gather_rows + segment_attention on cuda:1", "current device cuda:0"
    if torch.cuda.device_count() < 2:
        report.check(Check(name, shape, "bf16", None, 0.0, "one GPU", supported=False))
        return
    index = shared_prefix_index(num_seqs=4, shared=64, unique=(1, 40), seed=3, duplicates=1)
    calls = segment_calls(index, "cuda:1")
    q, k, v = random_qkv(index.num_compact, 8, 2, 128, torch.bfloat16, "cuda:1")
    x = torch.randn(300, 256, device="cuda:1", dtype=torch.bfloat16)  # (rows, width)
    rows = torch.randint(0, 300, (500,), device="cuda:1")  # (n,)

    def measure() -> float:
        torch.cuda.set_device(0)
        gather = 0.0 if torch.equal(gather_rows(x, rows), gather_rows_reference(x, rows)) else float("inf")
        return max(gather, *(segment_error(q, k, v, call) for call in calls.values()))

    report.guarded(name, shape, "bf16", ATTENTION_TOLERANCE[torch.bfloat16], measure)


def cuda_ms(fn, warmup: int = 5, repeats: int = 20, burst: int = 10) -> float:
    """Milliseconds per `fn()` call: median over `repeats` CUDA-event spans of `burst` back-to-back calls, after
    `warmup` calls. Bursts keep the GPU queue full, so a kernel shorter than its Python launch cost shows that
    cost (what the engine pays), and longer kernels show GPU time alone."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        start.record()
        for _ in range(burst):
            fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events) / burst


def timings(report: Report, run: Run) -> None:
    """Section `timings`: gathers, then attention on the paper's shape; each timing guarded."""
    report.section("Timings (per call: median of 20 CUDA-event spans of 10 back-to-back calls, after 5 warmups)",
                   TIMING_COLUMNS)
    if run.triton:
        gather_timings(report)
    attention_timings(report, run)


def gather_timings(report: Report) -> None:
    """`gather_rows` vs `torch.index_select` in bf16 (bytes moved: rows read + rows written)."""
    for rows in (16000, 100000):
        for width in (1024, 2048):
            x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)  # (rows, width)
            index = torch.randperm(rows, device="cuda")  # (rows,)
            gigabytes = 2 * x.numel() * x.element_size() / 1e9
            rate = lambda ms: f"{gigabytes / ms * 1e3:.0f} GB/s"  # noqa: E731
            shape = f"{rows}x{width}"
            base = cuda_ms(lambda: x.index_select(0, index))
            report.timed("torch.index_select", shape, lambda: (base, rate(base)))
            report.timed("gather_rows", shape, lambda: _rated(cuda_ms(lambda: gather_rows(x, index)),
                                                              lambda ms: f"{rate(ms)}, {base / ms:.2f}x index_select"))


def _rated(ms: float, rate: Callable[[float], str]) -> tuple[float, str]:
    return ms, rate(ms)


def paper_shape():
    """The paper's 32 x (2048 + 256) batch with Qwen3-8B heads, bf16: index, segment calls, q/k/v, label.
    Segments: the 2048-row prefix and 32 of 256; the prefix call is one block, 32 x 256 queries on 2048 keys."""
    index = shared_prefix_index(num_seqs=32, shared=2048, unique=(256, 256), seed=1)  # N'/N = 10240/73728
    q, k, v = random_qkv(index.num_compact, 32, 8, 128, torch.bfloat16)
    calls = segment_calls(index)
    shape = (f"32x(2048+256), N={index.num_tokens}, N'={index.num_compact}, "
             f"{calls['self']['key_start'].shape[0]} segments, 32/8 heads, D=128")
    return index, calls, q, k, v, shape


def paper_checks(report: Report, run: Run) -> None:
    """Section `paper`: the paper's shape against the torch reference."""
    report.section("Paper shape against the torch reference", CHECK_COLUMNS)
    index, calls, q, k, v, shape = paper_shape()
    tolerance = ATTENTION_TOLERANCE[torch.bfloat16]
    expected = path_attention_reference(q, k, v, index)
    meta = full_metadata(index)
    if run.triton:
        for kind, call in calls.items():
            report.guarded(f"segment_attention {kind}", shape, "bf16", tolerance, lambda: segment_error(q, k, v, call))
        report.guarded("Triton cascade, merged (engine backend)", shape, "bf16", tolerance,
                       lambda: max_error(TritonAttention(q.device)(q, k, v, meta, 128**-0.5), expected))
    run.flash_check(report, "flash-attn 4 cascade, merged (engine backend)", shape, torch.bfloat16,
                    lambda flash: max_error(flash(q, k, v, meta, 128**-0.5), expected))


def attention_timings(report: Report, run: Run) -> None:
    """Attention on the paper's shape: Triton tiles and cascade, flash-attn, the torch reference."""
    index, calls, q, k, v, shape = paper_shape()
    flops = 4 * 128 * 32 * _visible_pairs(index)  # the self and prefix calls see each (query, key) pair once
    rate = lambda ms: f"{flops / ms / 1e9:.0f} TFLOP/s"  # noqa: E731
    if run.triton:
        _triton_timings(report, q, k, v, index, calls, shape, rate)
    if run.flash is not None:
        _flash_timings(report, run.flash, q, k, v, index, shape, rate)
    if "torch" in run.attentions:
        report.timed("torch reference (self + prefix, per-block loop, fp32)", shape, lambda: _rated(
            sum(cuda_ms(lambda: segment_attention_reference(q, k, v, **call), warmup=1, repeats=3, burst=1)
                for call in calls.values()), lambda ms: rate(ms) + ", median of 3"))


def _triton_timings(report: Report, q, k, v, index, calls, shape, rate) -> None:
    default = default_tiles(128, torch.bfloat16)
    for tiles in [default] + [t for t in TILE_CANDIDATES if t != default]:
        label = (f"segment_attention self + prefix {tiles.block_m}x{tiles.block_n} w{tiles.num_warps} "
                 f"s{tiles.num_stages}" + (" (default)" if tiles == default else ""))
        report.timed(label, shape, lambda: _tile_timing(q, k, v, calls, tiles, rate))
    meta = full_metadata(index)
    triton_backend = TritonAttention(q.device)
    report.timed("Triton cascade: self + prefix + merge (engine backend)", shape,
                 lambda: _rated(cuda_ms(lambda: triton_backend(q, k, v, meta, 128**-0.5)), rate))


def _tile_timing(q, k, v, calls, tiles, rate) -> tuple[float, str]:
    parts = {kind: cuda_ms(lambda: segment_attention(q, k, v, **call, tiles=tiles)) for kind, call in calls.items()}
    ms = sum(parts.values())
    return ms, ", ".join([rate(ms), *(f"{kind} {part:.3f} ms" for kind, part in parts.items()), "merge not included"])


def _flash_timings(report: Report, flash: FlashAttention, q, k, v, index, shape, rate) -> None:
    from flash_attn.cute import flash_attn_varlen_func

    meta = full_metadata(index)
    report.timed("flash-attn 4 cascade: self + prefix + merge (engine backend)", shape,
                 lambda: _rated(cuda_ms(lambda: flash(q, k, v, meta, 128**-0.5)), rate))
    upload = lambda a, dtype: torch.from_numpy(a.astype(dtype)).to(q.device)  # noqa: E731
    added = np.diff(index.cu_seqlens_q.astype(np.int64)) > 0  # (B,) sequences with queries
    lengths = np.diff(index.cu_seqlens.astype(np.int64))  # (B,)
    cu_k = np.concatenate([[0], np.cumsum(lengths[added])])
    paths = upload(index.scatter[np.repeat(added, lengths)], np.int64)  # (sum of kept paths,) compact rows
    k_path, v_path = k.index_select(0, paths), v.index_select(0, paths)  # (N, Hkv, D)
    cu_q = np.append(index.cu_seqlens_q[:-1][added], index.cu_seqlens_q[-1])
    args = dict(cu_seqlens_q=upload(cu_q, np.int32), cu_seqlens_k=upload(cu_k, np.int32),
                max_seqlen_q=int(np.diff(cu_q).max()), max_seqlen_k=int(lengths.max()), causal=True)
    report.timed("flash-attn 4 varlen over whole paths, K/V already gathered (round one's full mode)", shape,
                 lambda: _rated(cuda_ms(lambda: flash_attn_varlen_func(q, k_path, v_path, **args)),
                                lambda ms: rate(ms) + ", bottom-right causal, gather not included"))
    fold = upload(index.fold_gather, np.int64)  # (N',)
    scatter = upload(index.scatter, np.int64)  # (N,)
    cu = upload(index.cu_seqlens, np.int32)  # (B+1,)
    report.timed("flash-attn 4, RadixMLP layout (scatter q/k/v, N rows, gather)", shape, lambda: _rated(
        cuda_ms(lambda: _flash_radix_mlp_layout(flash_attn_varlen_func, q, k, v, scatter, fold, cu,
                                                int(lengths.max()))), lambda ms: "attends every original token"))


def _flash_radix_mlp_layout(varlen, q, k, v, scatter, fold, cu_seqlens, max_seqlen):
    """RadixMLP's attention: q/k/v scattered to all `N` original rows, causal per sequence, gathered back."""
    q_n, k_n, v_n = (t.index_select(0, scatter) for t in (q, k, v))  # (N, H, D)
    out, _ = varlen(q_n, k_n, v_n, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                    max_seqlen_k=max_seqlen, causal=True)  # (N, Hq, D)
    return out.index_select(0, fold)  # (N', Hq, D)


def _visible_pairs(index: RadixIndex) -> int:
    """(query, key) pairs the bottom-right causal mask lets through, summed over sequences."""
    lq, lk = np.diff(index.cu_seqlens_q.astype(np.int64)), np.diff(index.cu_seqlens.astype(np.int64))
    return int(((lk - lq) * lq + lq * (lq + 1) // 2).sum())


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("float", "fp").replace("bfp", "bf")


def load_flash() -> tuple[FlashAttention | None, str]:
    """The engine's flash-attn 4 backend, or None and why: any failure to load counts (the CuTe DSL loader
    raises RuntimeError, e.g. "install is incomplete")."""
    try:
        return FlashAttention(), ""
    except Exception as err:
        return None, f"flash-attn 4 does not load: {type(err).__name__}: {str(err)[:80]}; pip install 'radixserve[gpu]'"


def flash_version() -> str:
    """The installed flash-attn 4's version, read from its distribution `flash-attn-4` (its module's own
    `__version__` reads a distribution named `fa4` and says 0.0.0)."""
    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


SECTIONS: dict[str, Callable[[Report, Run], None]] = {
    "warmup": lambda report, run: warmup_timings(report, run.attentions),
    "kernels": kernel_checks,
    "engine": lambda report, run: engine_checks(report, run.attentions),
    "tasks": lambda report, run: task_checks(report, run.attentions),
    "invariance": lambda report, run: invariance_checks(report, run.attentions),
    "hybrid": lambda report, run: hybrid_checks(report, run.attentions),
    "paper": paper_checks,
    "timings": timings,
}
ATTENTIONS = ("torch", "triton", "flash")
CACHE_ENV = ("TRITON_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "gpu_check.md")
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS),
                        help="sections to run, in the order given (default: all)")
    parser.add_argument("--attention", nargs="+", choices=ATTENTIONS, default=list(ATTENTIONS),
                        help="backends whose checks and timings run (default: all)")
    return parser.parse_args(argv)


def header(args: argparse.Namespace, run: Run) -> list[str]:
    flash = "not asked for" if "flash" not in run.attentions else f"{flash_version()} ({run.flash_note or 'loads'})"
    caches = ", ".join(f"{name}={os.environ.get(name, '(unset)')}" for name in CACHE_ENV)
    return ["# GPU check", "",
            f"Command: `python bench/gpu_check.py --sections {' '.join(args.sections)} "
            f"--attention {' '.join(args.attention)}`.", "",
            f"{torch.cuda.get_device_name()} (compute capability {torch.cuda.get_device_capability()}, "
            f"{torch.cuda.device_count()} device(s)); torch {torch.__version__} (CUDA {torch.version.cuda}), triton "
            f"{triton.__version__}, flash-attn 4 {flash}. Compile caches: {caches}."]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine (the CPU tests cover the interpreter)")
        return 2
    started = time.perf_counter()
    torch.manual_seed(0)
    run = Run(tuple(args.attention), *(load_flash() if "flash" in args.attention else (None, "")))
    report = Report(args.out, header(args, run))
    for name in args.sections:
        try:
            SECTIONS[name](report, run)
        except Exception as err:  # e.g. out of memory building a section's inputs: the next section still runs
            report.failed(f"section {name}", err)
    report.close(time.perf_counter() - started)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
