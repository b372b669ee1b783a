"""GPU check: every CUDA path against its reference, then timings on the paper's shapes (sized for < 8 min, one H200).

    python bench/gpu_check.py [--out bench/results/gpu/gpu_check.md] [--no-engine]

1. Kernels against their torch references: `gather_rows` (exact) and `compact_attention` (per-dtype
   tolerance) on shared-prefix batches with duplicates, GQA ratios 1/4/8 and head dims 64/128.
2. flash-attn varlen over gathered K/V (when `flash_attn` imports) against the same reference.
3. Timings (CUDA events, warmups, medians): `gather_rows` vs `torch.index_select` on rows 16000 and 100000,
   widths 1024 and 2048, bf16; attention on 32 x (2048 shared + 256 unique) tokens with Qwen3-8B heads
   (32 query heads, 8 kv heads, head dim 128), bf16: compact attention at several tile shapes, flash-attn
   varlen with the K/V gather included, flash-attn in RadixMLP's layout (scatter q/k/v to all N rows, attend,
   gather back), and the torch reference.
4. `--engine` (default on): each engine mode and attention backend on CUDA against a CPU float64 engine, on a
   tiny random-weight Qwen3 from `radix_core.tiny_models`.

Writes a markdown report (default `bench/results/gpu/gpu_check.md`), prints it, and exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import triton

from radix_core.index import RadixIndex, build_radix_index, flatten_sequences
from radix_core.kernels import (
    AttentionTiles,
    compact_attention,
    compact_attention_reference,
    default_tiles,
    gather_rows,
    gather_rows_reference,
)

try:
    import flash_attn
    from flash_attn import flash_attn_varlen_func
except ImportError:
    flash_attn = flash_attn_varlen_func = None

ATTENTION_TOLERANCE = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}  # max abs error
ENGINE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}  # max abs error / max abs value
TILE_CANDIDATES = [AttentionTiles(64, 64, 4, 3), AttentionTiles(128, 64, 8, 3), AttentionTiles(128, 128, 8, 3),
                   AttentionTiles(64, 32, 4, 4)]


@dataclass
class Check:
    name: str
    shape: str
    dtype: str
    error: float | None  # None: not run (see note)
    tolerance: float
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.error is not None and self.error <= self.tolerance


@dataclass
class Timing:
    name: str
    shape: str
    ms: float
    note: str = ""


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


def device_index(index: RadixIndex, device: str = "cuda") -> dict:
    """The index as compact attention takes it: int32 tensors on `device` and the longest block."""
    as_int32 = lambda a: torch.from_numpy(a.astype(np.int32)).to(device)  # noqa: E731
    return dict(scatter=as_int32(index.scatter), cu_seqlens_q=as_int32(index.cu_seqlens_q),
                cu_seqlens_k=as_int32(index.cu_seqlens_k), max_seqlen_q=index.max_seqlen_q)


def random_qkv(rows: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: str = "cuda"):
    q = torch.randn(rows, heads, head_dim, device=device).to(dtype)  # (N', Hq, D)
    k = torch.randn(rows, kv_heads, head_dim, device=device).to(dtype)  # (N', Hkv, D)
    v = torch.randn(rows, kv_heads, head_dim, device=device).to(dtype)  # (N', Hkv, D)
    return q, k, v


def flash_gathered(q, k, v, scatter, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """flash-attn varlen over each sequence's gathered K/V path (bottom-right causal when Lq < Lk)."""
    k_path, v_path = k.index_select(0, scatter), v.index_select(0, scatter)  # (N, Hkv, D)
    return flash_attn_varlen_func(q, k_path, v_path, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  causal=True)


def max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return (got.float() - expected.float()).abs().max().item()


def kernel_checks(device: str = "cuda") -> list[Check]:
    """Section 1 and 2: kernels and flash-attn against the torch references."""
    checks = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for rows, width, index_dtype in ((1, 1, torch.int32), (4097, 1000, torch.int64), (20000, 2048, torch.int32)):
            x = torch.randn(rows, width, device=device).to(dtype)  # (rows, width)
            index = torch.randint(0, rows, (rows + 3,), device=device, dtype=index_dtype)  # (n,)
            error = 0.0 if torch.equal(gather_rows(x, index), gather_rows_reference(x, index)) else float("inf")
            checks.append(Check("gather_rows", f"{rows}x{width}, {_name(index_dtype)} index", _name(dtype), error, 0.0))
    index = shared_prefix_index(num_seqs=12, shared=300, unique=(1, 200), seed=0, duplicates=2)
    meta = device_index(index, device)
    shape = f"12x(300+1..200)+2 dup, N'={index.num_compact}"
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for heads, kv_heads, head_dim in ((8, 8, 64), (32, 8, 128), (16, 2, 128)):
            q, k, v = random_qkv(index.num_compact, heads, kv_heads, head_dim, dtype, device)
            expected = compact_attention_reference(q, k, v, **meta)
            label = f"{shape}, {heads}/{kv_heads} heads, D={head_dim}"
            error = max_error(compact_attention(q, k, v, **meta), expected)
            checks.append(Check("compact_attention", label, _name(dtype), error, ATTENTION_TOLERANCE[dtype]))
            if dtype != torch.float32:
                checks.append(_flash_check(q, k, v, meta, index, expected, label))
    return checks


def _flash_check(q, k, v, meta, index, expected, label) -> Check:
    tolerance = ATTENTION_TOLERANCE[q.dtype]
    if flash_attn_varlen_func is None:
        return Check("flash-attn varlen (gathered K/V)", label, _name(q.dtype), None, tolerance, "flash_attn missing")
    try:
        out = flash_gathered(q, k, v, **meta, max_seqlen_k=index.max_seqlen_k)
    except RuntimeError as err:  # e.g. a shape flash-attn refuses; recorded, the other checks go on
        return Check("flash-attn varlen (gathered K/V)", label, _name(q.dtype), None, tolerance, str(err)[:80])
    return Check("flash-attn varlen (gathered K/V)", label, _name(q.dtype), max_error(out, expected), tolerance)


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
    """Section 3a: `gather_rows` vs `torch.index_select` in bf16 (bytes moved: rows read + rows written)."""
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


def attention_timings() -> tuple[list[Timing], list[Check]]:
    """Section 3b: the paper's 32 x (2048 + 256) batch with Qwen3-8B heads, bf16."""
    index = shared_prefix_index(num_seqs=32, shared=2048, unique=(256, 256), seed=1)  # N'/N = 10240/73728
    meta = device_index(index)
    q, k, v = random_qkv(index.num_compact, 32, 8, 128, torch.bfloat16)
    shape = f"32x(2048+256), N={index.num_tokens}, N'={index.num_compact}, 32/8 heads, D=128"
    flops = 4 * 128 * 32 * _visible_pairs(index)
    rate = lambda ms: f"{flops / ms / 1e9:.0f} TFLOP/s"  # noqa: E731
    expected = compact_attention_reference(q, k, v, **meta)
    checks = [Check("compact_attention (paper shape)", shape, "bf16",
                    max_error(compact_attention(q, k, v, **meta), expected), ATTENTION_TOLERANCE[torch.bfloat16])]
    timings = []
    for tiles in [default_tiles(128)] + [t for t in TILE_CANDIDATES if t != default_tiles(128)]:
        ms = cuda_ms(lambda: compact_attention(q, k, v, **meta, tiles=tiles))
        label = f"compact_attention {tiles.block_m}x{tiles.block_n} w{tiles.num_warps} s{tiles.num_stages}"
        timings.append(Timing(label + (" (default)" if tiles == default_tiles(128) else ""), shape, ms, rate(ms)))
    if flash_attn_varlen_func is not None:
        timings += _flash_timings(q, k, v, meta, index, shape, rate)
        out = flash_gathered(q, k, v, **meta, max_seqlen_k=index.max_seqlen_k)
        checks.append(Check("flash-attn varlen (paper shape)", shape, "bf16", max_error(out, expected),
                            ATTENTION_TOLERANCE[torch.bfloat16]))
    ms = cuda_ms(lambda: compact_attention_reference(q, k, v, **meta), warmup=1, repeats=3, burst=1)
    timings.append(Timing("torch reference (per-sequence loop, fp32)", shape, ms, rate(ms) + ", median of 3"))
    return timings, checks


def _flash_timings(q, k, v, meta, index, shape, rate) -> list[Timing]:
    max_k = index.max_seqlen_k
    gathered = cuda_ms(lambda: flash_gathered(q, k, v, **meta, max_seqlen_k=max_k))
    k_path, v_path = k.index_select(0, meta["scatter"]), v.index_select(0, meta["scatter"])  # (N, Hkv, D)
    args = (meta["cu_seqlens_q"], meta["cu_seqlens_k"], meta["max_seqlen_q"], max_k)
    attend_only = cuda_ms(lambda: flash_attn_varlen_func(q, k_path, v_path, *args, causal=True))
    fold = torch.from_numpy(index.fold_gather.astype(np.int64)).to(q.device)  # (N',)
    radix_mlp = cuda_ms(lambda: _flash_radix_mlp_layout(q, k, v, meta["scatter"], fold, meta["cu_seqlens_k"], max_k))
    return [Timing("flash-attn varlen + K/V gather", shape, gathered, rate(gathered)),
            Timing("flash-attn varlen, K/V already gathered", shape, attend_only, rate(attend_only)),
            Timing("flash-attn, RadixMLP layout (scatter q/k/v, N rows, gather)", shape, radix_mlp,
                   "attends every original token")]


def _flash_radix_mlp_layout(q, k, v, scatter, fold, cu_seqlens, max_seqlen):
    """RadixMLP's attention: q/k/v scattered to all `N` original rows, causal per sequence, gathered back."""
    q_n, k_n, v_n = (t.index_select(0, scatter) for t in (q, k, v))  # (N, H, D)
    out = flash_attn_varlen_func(q_n, k_n, v_n, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)
    return out.index_select(0, fold)  # (N', Hq, D)


def _visible_pairs(index: RadixIndex) -> int:
    """(query, key) pairs the bottom-right causal mask lets through, summed over sequences."""
    lq, lk = index.block_len.astype(np.int64), np.diff(index.cu_seqlens).astype(np.int64)
    return int(((lk - lq) * lq + lq * (lq + 1) // 2).sum())


def engine_checks() -> list[Check]:
    """Section 4: each engine mode and attention backend on CUDA against a CPU float64 engine."""
    try:
        from radix_core.attention import ATTENTION_CHOICES
        from radix_core.engine import Engine
        from radix_core.tiny_models import make_tiny_model
    except ImportError as err:
        return [Check("engine", "-", "-", None, 0.0, str(err))]
    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "qwen3", "qwen3", "causal_lm"))
        reference = Engine.from_pretrained(model_dir, device="cpu", dtype=torch.float64, radix="off",
                                           attention="torch")
        sequences = _engine_batch(reference.arch.vocab_size)
        expected = torch.cat(reference.hidden_states(sequences))  # (N, hidden)
        scale = expected.abs().max().item()
        for dtype in (torch.float32, torch.bfloat16):
            for attention in [a for a in ATTENTION_CHOICES if a != "auto"]:
                checks += _engine_modes(Engine, model_dir, dtype, attention, sequences, expected, scale)
    return checks


def _engine_modes(engine_cls, model_dir, dtype, attention, sequences, expected, scale) -> list[Check]:
    name = f"engine attention={attention}"
    try:
        engine = engine_cls.from_pretrained(model_dir, device="cuda", dtype=dtype, attention=attention)
    except (ValueError, ImportError) as err:
        return [Check(name, "-", _name(dtype), None, ENGINE_TOLERANCE[dtype], str(err)[:80])]
    checks = []
    for mode in ("off", "mlp", "full", "auto"):
        got = torch.cat(engine.hidden_states(sequences, mode)).cpu().double()  # (N, hidden)
        error = (got - expected).abs().max().item() / scale
        checks.append(Check(f"{name} mode={mode}", "9 seqs, shared prefixes + duplicate", _name(dtype), error,
                            ENGINE_TOLERANCE[dtype], "error relative to max abs hidden"))
    return checks


def _engine_batch(vocab_size: int) -> list[list[int]]:
    """Reranking-like batch: a shared template, two queries, passages, one exact duplicate."""
    rng = np.random.default_rng(2)
    draw = lambda n: rng.integers(0, vocab_size, n).tolist()  # noqa: E731
    template, queries = draw(40), [draw(12), draw(9)]
    sequences = [template + queries[i % 2] + draw(int(rng.integers(5, 60))) for i in range(8)]
    return sequences + [list(sequences[3])]


def report(checks: list[Check], timings: list[Timing], seconds: float) -> str:
    """The markdown report: environment, checks, timings."""
    flash = "absent" if flash_attn is None else flash_attn.__version__
    lines = [
        "# GPU check", "",
        f"Command: `python bench/gpu_check.py`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{seconds:.0f} s.", "",
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}, "
        f"flash-attn {flash}.", "",
        "## Checks", "",
        "| check | shape | dtype | max abs error | tolerance | result |", "|---|---|---|---|---|---|",
    ]
    for c in checks:
        error = "-" if c.error is None else f"{c.error:.2e}"
        result = ("PASS" if c.passed else "FAIL") if c.error is not None else "not run"
        note = f" ({c.note})" if c.note else ""
        lines.append(f"| {c.name} | {c.shape} | {c.dtype} | {error} | {c.tolerance:.0e} | {result}{note} |")
    lines += ["", "## Timings", "",
              "Per call: median of 20 CUDA-event spans of 10 back-to-back calls, after 5 warmups.", "",
              "| op | shape | ms | note |", "|---|---|---|---|"]
    lines += [f"| {t.name} | {t.shape} | {t.ms:.3f} | {t.note} |" for t in timings]
    return "\n".join(lines) + "\n"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("float", "fp").replace("bfp", "bf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "gpu_check.md")
    parser.add_argument("--engine", action=argparse.BooleanOptionalAction, default=True,
                        help="check each engine mode on CUDA against a CPU float64 engine (default: on)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine (the CPU tests cover the interpreter)")
        return 2
    started = time.perf_counter()
    torch.manual_seed(0)
    checks = kernel_checks()
    gather = gather_timings()
    attention, paper_checks = attention_timings()
    checks += paper_checks + (engine_checks() if args.engine else [])
    text = report(checks, gather + attention, time.perf_counter() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 1 if any(c.error is not None and not c.passed for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
