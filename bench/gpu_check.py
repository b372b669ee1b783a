"""GPU check: every CUDA path against its reference, then timings on the paper's shapes (sized for < 10 min, one H200).

    python bench/gpu_check.py [--out bench/results/gpu/gpu_check.md] [--no-engine]

1. Kernels against their torch references: `gather_rows` (exact) and `segment_attention` (output and log-sum-exp,
   per-dtype tolerance) in both calls of cascade attention, the causal self call over the radix tree's segments
   and the unmasked prefix call of the rows below each shared segment, on shared-prefix batches with duplicates,
   GQA ratios 1/4/8 and head dims 64/128, fp32/bf16/fp16; the Triton launch on a second GPU when there is one.
2. The engine's cascade attention end to end (self call, prefix call, log-sum-exp merge, over the metadata
   `plan_compact` builds) through its `TritonAttention` and flash-attn 4 `FlashAttention` backends against a
   torch reference of each sequence's block over its whole path.
3. `--engine` (default on, `gpu_engine_checks.py`): hidden states of each dtype x attention backend x mode on a
   tiny Qwen3 with head_dim 128 and GQA against a CPU float64 engine, including `[[7], [7]]`; then every task
   head (rerank by yes/no logits and by a score head, embed, classify, score) the same way.
4. The paper's shape for correctness, then timings (CUDA events, warmups, medians): `gather_rows` vs
   `torch.index_select` on rows 16000 and 100000, widths 1024 and 2048, bf16; attention on 32 x (2048 shared +
   256 unique) tokens with Qwen3-8B heads (32 query heads, 8 kv heads, head dim 128), bf16: segment attention at
   several tile shapes (the self call over the 2048-row prefix segment and 32 segments of 256, plus the prefix
   call of the 32 x 256 rows against the prefix; the log-sum-exp merge not included), the Triton and flash-attn
   backends' whole cascade (merge included), flash-attn over whole gathered paths (round one's `full` mode),
   flash-attn in RadixMLP's layout (scatter q/k/v to all N rows, attend, gather back), and the torch references.

Writes each result to a markdown report (default `bench/results/gpu/gpu_check.md`) as it comes, and prints it.
Exits 1 if a check failed or did not run though this machine supports it (flash-attn 4 missing on compute
capability >= 8 counts), 2 without CUDA.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import triton
from gpu_report import CHECK_COLUMNS, TIMING_COLUMNS, Check, Report, Timing

from radix_core.attention import AttentionMetadata, FlashAttention, TritonAttention
from radix_core.batch import PreparedBatch
from radix_core.cascade import cascade_plan
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

try:
    import flash_attn.cute as flash_attn
    from flash_attn.cute import flash_attn_varlen_func
except ImportError:
    flash_attn = flash_attn_varlen_func = None

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


def kernel_checks(report: Report, flash: FlashAttention | None, flash_note: str) -> None:
    """Section 1 and 2: kernels and flash-attn against the torch references."""
    report.section("Kernels and flash-attn against the torch reference", CHECK_COLUMNS)
    for dtype in DTYPES:
        for rows, width, index_dtype in ((1, 1, torch.int32), (4097, 1000, torch.int64), (20000, 2048, torch.int32)):
            x = torch.randn(rows, width, device="cuda").to(dtype)  # (rows, width)
            index = torch.randint(0, rows, (rows + 3,), device="cuda", dtype=index_dtype)  # (n,)
            report.guarded("gather_rows", f"{rows}x{width}, {_name(index_dtype)} index", _name(dtype), 0.0,
                           lambda: 0.0 if torch.equal(gather_rows(x, index), gather_rows_reference(x, index))
                           else float("inf"))
    _second_device_check(report)
    batches = {"12x(300+1..200)+2 dup": shared_prefix_index(num_seqs=12, shared=300, unique=(1, 200), seed=0,
                                                            duplicates=2),
               "6 one-token seqs, 3 dup (max_seqlen_q 1)": build_radix_index(*flatten_sequences([[7], [7], [8], [9],
                                                                                                  [8], [9]]))}
    for label, index in batches.items():
        calls, meta = segment_calls(index), full_metadata(index)
        for dtype in DTYPES:
            for heads, kv_heads, head_dim in ((8, 8, 64), (32, 8, 128), (16, 2, 128)):
                q, k, v = random_qkv(index.num_compact, heads, kv_heads, head_dim, dtype)
                shape = f"{label}, N'={index.num_compact}, {heads}/{kv_heads} heads, D={head_dim}"
                for kind, call in calls.items():
                    report.guarded(f"segment_attention {kind}", shape, _name(dtype), ATTENTION_TOLERANCE[dtype],
                                   lambda: segment_error(q, k, v, call))
                expected = path_attention_reference(q, k, v, index)
                report.guarded("Triton cascade, merged (engine backend)", shape, _name(dtype),
                               ATTENTION_TOLERANCE[dtype],
                               lambda: max_error(TritonAttention(q.device)(q, k, v, meta, head_dim**-0.5), expected))
                if dtype == torch.float32:
                    continue
                if flash is None:
                    report.check(Check("flash-attn 4 cascade, merged (engine backend)", shape, _name(dtype), None,
                                       ATTENTION_TOLERANCE[dtype], flash_note, torch.cuda.get_device_capability()
                                       >= (8, 0)))
                    continue
                report.guarded("flash-attn 4 cascade, merged (engine backend)", shape, _name(dtype),
                               ATTENTION_TOLERANCE[dtype],
                               lambda: max_error(flash(q, k, v, meta, head_dim**-0.5), expected))


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


def gather_timings() -> list[Timing]:
    """Section 4a: `gather_rows` vs `torch.index_select` in bf16 (bytes moved: rows read + rows written)."""
    timings = []
    for rows in (16000, 100000):
        for width in (1024, 2048):
            x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)  # (rows, width)
            index = torch.randperm(rows, device="cuda")  # (rows,)
            gigabytes = 2 * x.numel() * x.element_size() / 1e9
            base = cuda_ms(lambda: x.index_select(0, index))
            ours = cuda_ms(lambda: gather_rows(x, index))
            shape = f"{rows}x{width}"
            timings.append(Timing("torch.index_select", shape, base, f"{gigabytes / base * 1e3:.0f} GB/s"))
            timings.append(Timing("gather_rows", shape, ours,
                                  f"{gigabytes / ours * 1e3:.0f} GB/s, {base / ours:.2f}x index_select"))
    return timings


def paper_shape():
    """The paper's 32 x (2048 + 256) batch with Qwen3-8B heads, bf16: index, segment calls, q/k/v, label.
    Segments: the 2048-row prefix and 32 of 256; the prefix call is one block, 32 x 256 queries on 2048 keys."""
    index = shared_prefix_index(num_seqs=32, shared=2048, unique=(256, 256), seed=1)  # N'/N = 10240/73728
    q, k, v = random_qkv(index.num_compact, 32, 8, 128, torch.bfloat16)
    calls = segment_calls(index)
    shape = (f"32x(2048+256), N={index.num_tokens}, N'={index.num_compact}, "
             f"{calls['self']['key_start'].shape[0]} segments, 32/8 heads, D=128")
    return index, calls, q, k, v, shape


def paper_checks(report: Report, flash: FlashAttention | None) -> None:
    report.section("Paper shape against the torch reference", CHECK_COLUMNS)
    index, calls, q, k, v, shape = paper_shape()
    tolerance = ATTENTION_TOLERANCE[torch.bfloat16]
    for kind, call in calls.items():
        report.guarded(f"segment_attention {kind}", shape, "bf16", tolerance, lambda: segment_error(q, k, v, call))
    expected = path_attention_reference(q, k, v, index)
    meta = full_metadata(index)
    report.guarded("Triton cascade, merged (engine backend)", shape, "bf16", tolerance,
                   lambda: max_error(TritonAttention(q.device)(q, k, v, meta, 128**-0.5), expected))
    if flash is not None:
        report.guarded("flash-attn 4 cascade, merged (engine backend)", shape, "bf16", tolerance,
                       lambda: max_error(flash(q, k, v, meta, 128**-0.5), expected))


def attention_timings(report: Report) -> None:
    """Section 4b: attention on the paper's shape."""
    index, calls, q, k, v, shape = paper_shape()
    flops = 4 * 128 * 32 * _visible_pairs(index)  # the self and prefix calls see each (query, key) pair once
    rate = lambda ms: f"{flops / ms / 1e9:.0f} TFLOP/s"  # noqa: E731
    default = default_tiles(128, torch.bfloat16)
    for tiles in [default] + [t for t in TILE_CANDIDATES if t != default]:
        parts = {kind: cuda_ms(lambda: segment_attention(q, k, v, **call, tiles=tiles)) for kind, call in calls.items()}
        ms = sum(parts.values())
        label = (f"segment_attention self + prefix {tiles.block_m}x{tiles.block_n} w{tiles.num_warps} "
                 f"s{tiles.num_stages}")
        note = ", ".join([rate(ms), *(f"{kind} {part:.3f} ms" for kind, part in parts.items()), "merge not included"])
        report.timing(Timing(label + (" (default)" if tiles == default else ""), shape, ms, note))
    meta = full_metadata(index)
    triton_backend = TritonAttention(q.device)
    ms = cuda_ms(lambda: triton_backend(q, k, v, meta, 128**-0.5))
    report.timing(Timing("Triton cascade: self + prefix + merge (engine backend)", shape, ms, rate(ms)))
    if flash_attn_varlen_func is not None:
        for timing in _flash_timings(q, k, v, index, shape, rate):
            report.timing(timing)
    ms = sum(cuda_ms(lambda: segment_attention_reference(q, k, v, **call), warmup=1, repeats=3, burst=1)
             for call in calls.values())
    report.timing(Timing("torch reference (self + prefix, per-block loop, fp32)", shape, ms,
                         rate(ms) + ", median of 3"))


def _flash_timings(q, k, v, index, shape, rate) -> list[Timing]:
    flash, meta = FlashAttention(), full_metadata(index)
    cascade = cuda_ms(lambda: flash(q, k, v, meta, 128**-0.5))
    upload = lambda a, dtype: torch.from_numpy(a.astype(dtype)).to(q.device)  # noqa: E731
    added = np.diff(index.cu_seqlens_q.astype(np.int64)) > 0  # (B,) sequences with queries
    lengths = np.diff(index.cu_seqlens.astype(np.int64))  # (B,)
    cu_k = np.concatenate([[0], np.cumsum(lengths[added])])
    paths = upload(index.scatter[np.repeat(added, lengths)], np.int64)  # (sum of kept paths,) compact rows
    k_path, v_path = k.index_select(0, paths), v.index_select(0, paths)  # (N, Hkv, D)
    cu_q = np.append(index.cu_seqlens_q[:-1][added], index.cu_seqlens_q[-1])
    args = dict(cu_seqlens_q=upload(cu_q, np.int32), cu_seqlens_k=upload(cu_k, np.int32),
                max_seqlen_q=int(np.diff(cu_q).max()), max_seqlen_k=int(lengths.max()), causal=True)
    paths_only = cuda_ms(lambda: flash_attn_varlen_func(q, k_path, v_path, **args))
    fold = upload(index.fold_gather, np.int64)  # (N',)
    scatter = upload(index.scatter, np.int64)  # (N,)
    cu = upload(index.cu_seqlens, np.int32)  # (B+1,)
    radix_mlp = cuda_ms(lambda: _flash_radix_mlp_layout(q, k, v, scatter, fold, cu, int(lengths.max())))
    return [Timing("flash-attn 4 cascade: self + prefix + merge (engine backend)", shape, cascade, rate(cascade)),
            Timing("flash-attn 4 varlen over whole paths, K/V already gathered (round one's full mode)", shape,
                   paths_only, rate(paths_only) + ", bottom-right causal, gather not included"),
            Timing("flash-attn 4, RadixMLP layout (scatter q/k/v, N rows, gather)", shape, radix_mlp,
                   "attends every original token")]


def _flash_radix_mlp_layout(q, k, v, scatter, fold, cu_seqlens, max_seqlen):
    """RadixMLP's attention: q/k/v scattered to all `N` original rows, causal per sequence, gathered back."""
    q_n, k_n, v_n = (t.index_select(0, scatter) for t in (q, k, v))  # (N, H, D)
    out, _ = flash_attn_varlen_func(q_n, k_n, v_n, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                                    max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen, causal=True)  # (N, Hq, D)
    return out.index_select(0, fold)  # (N', Hq, D)


def _visible_pairs(index: RadixIndex) -> int:
    """(query, key) pairs the bottom-right causal mask lets through, summed over sequences."""
    lq, lk = np.diff(index.cu_seqlens_q.astype(np.int64)), np.diff(index.cu_seqlens.astype(np.int64))
    return int(((lk - lq) * lq + lq * (lq + 1) // 2).sum())


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("float", "fp").replace("bfp", "bf")


def load_flash() -> tuple[FlashAttention | None, str]:
    """The engine's flash-attn 4 backend, or None and why."""
    try:
        return FlashAttention(), ""
    except (ImportError, OSError) as err:
        return None, f"flash-attn 4 does not import: {str(err)[:80]}; pip install 'radixserve[gpu]'"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "gpu_check.md")
    parser.add_argument("--engine", action=argparse.BooleanOptionalAction, default=True,
                        help="check the engine and every task head on CUDA against a CPU float64 engine (default: on)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine (the CPU tests cover the interpreter)")
        return 2
    started = time.perf_counter()
    torch.manual_seed(0)
    flash, flash_note = load_flash()
    version = "absent" if flash_attn is None else flash_attn.__version__
    report = Report(args.out, [
        "# GPU check", "",
        "Command: `python bench/gpu_check.py`.", "",
        f"{torch.cuda.get_device_name()} (compute capability {torch.cuda.get_device_capability()}, "
        f"{torch.cuda.device_count()} device(s)); torch {torch.__version__} (CUDA {torch.version.cuda}), triton "
        f"{triton.__version__}, flash-attn 4 {version}.",
    ])
    kernel_checks(report, flash, flash_note)
    if args.engine:
        from gpu_engine_checks import engine_checks, task_checks

        report.section("Engine against a CPU float64 engine (error relative to max abs value)", CHECK_COLUMNS)
        engine_checks(report)
        report.section("Task heads against a CPU float64 engine (error relative to max abs value)", CHECK_COLUMNS)
        task_checks(report)
    paper_checks(report, flash)
    report.section("Timings (per call: median of 20 CUDA-event spans of 10 back-to-back calls, after 5 warmups)",
                   TIMING_COLUMNS)
    for timing in gather_timings():
        report.timing(timing)
    attention_timings(report)
    report.close(time.perf_counter() - started)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
