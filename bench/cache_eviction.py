"""The prefix cache's eviction on its own (no model): the policy `radix_core.prefix_cache` ships against least
recently used first, on one replica's share of the few-shot stream of `bench/prefix_cache_bench.py`.

Each request is 4 inputs of 20-60 random tokens behind one of the replica's `k` prompts of 1,024 tokens (drawn
at random), each input under 2 one-token labels: 8 sequences whose prompt, and each input, two sequences of the
batch share, so both are admitted; the inputs are never read again. The budget is the bench preset's default
on the CPU (256 MiB: 14,563 rows). A **miss** is a request whose prompt the cache does not hold although an
earlier request of this replica sent it (it computes 1,024 rows instead of ~200). `k` prompts, `12 k` requests,
three seeds each; then **shift**: 8 prompts for 100 requests, then 8 new ones for 100 (misses in the second half
only): how fast prompts no longer sent give way.

`least recently used` is the shipped cache with its victim chosen least recently used first, segments read back
or not (what the cache did before it kept those read back).

    python bench/cache_eviction.py [--seeds 3] [--out bench/results]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from machine import machine

from radix_core.cached_rows import RowShape
from radix_core.prefix_cache import DEFAULT_CPU_BYTES, PROTECTED_SHARE, PrefixCache

BENCH_ROW = RowShape(layers=8, kv_heads=4, head_dim=64, hidden=512, dtype=torch.float32, device=torch.device("cpu"))
ROW = RowShape(layers=1, kv_heads=1, head_dim=1, hidden=1, dtype=torch.float32, device=torch.device("cpu"))
BUDGET_ROWS = DEFAULT_CPU_BYTES // BENCH_ROW.bytes  # 14,563: the bench preset's rows in the default budget
PROMPT_TOKENS, INPUTS, INPUT_TOKENS, LABELS = 1024, 4, (20, 60), (3, 4)
KEYS = (8, 10, 11, 12, 14, 16)


class LeastRecentlyUsed(PrefixCache):
    """The shipped cache, its victim the least recently used segment whether read back or not."""

    def _victim(self):
        return self._first_evictable(self._resident)


def request(rng: np.random.Generator, prompt: np.ndarray) -> list[np.ndarray]:
    sequences = []
    for _ in range(INPUTS):
        text = rng.integers(10, 30000, int(rng.integers(INPUT_TOKENS[0], INPUT_TOKENS[1] + 1)))
        sequences += [np.concatenate([prompt, [5, 6], text, [7, 8], [label]]) for label in LABELS]
    return sequences


def misses(cache_class: type[PrefixCache], keys: int, requests: int, seed: int, shift: bool = False) -> int:
    """Requests that did not find their replica's prompt cached though it had been sent before (with `shift`, in
    the second half only, where a new set of `keys` prompts is sent)."""
    rng = np.random.default_rng(seed)
    cache = cache_class(ROW, BUDGET_ROWS * ROW.bytes)
    prompts = [np.concatenate([[1, 2], rng.integers(10, 30000, PROMPT_TOKENS - 2)]) for _ in range(2 * keys)]
    sent, missed = set(), 0
    for r in range(requests):
        which = int(rng.integers(keys)) + (keys if shift and r >= requests // 2 else 0)
        sequences = request(rng, prompts[which])
        cu = np.cumsum([0] + [len(s) for s in sequences])
        with cache.lease(np.concatenate(sequences), cu) as lease:
            matched = lease.matched.min()
            rows = lease.admitted_rows
            lease.commit(lease.keep(torch.arange(rows)) if rows else None)
        missed += int(which in sent and matched < PROMPT_TOKENS and (not shift or r >= requests // 2))
        sent.add(which)
    return missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    policies = {"shipped (read back kept first)": PrefixCache, "least recently used": LeastRecentlyUsed}
    rows = []
    for keys in KEYS:
        counts = {name: sum(misses(c, keys, 12 * keys, seed) for seed in range(args.seeds))
                  for name, c in policies.items()}
        rows.append((f"{keys} prompts, {12 * keys} requests", counts))
        print(rows[-1], flush=True)
    counts = {name: sum(misses(c, 8, 200, seed, shift=True) for seed in range(args.seeds))
              for name, c in policies.items()}
    rows.append(("shift: 8 prompts, then 8 new ones, 100 requests each", counts))
    print(rows[-1])
    names = list(policies)
    lines = [
        "# Prefix cache eviction, the cache alone",
        "",
        f"Command: `python bench/cache_eviction.py --seeds {args.seeds}` on {machine()} (no model: the tree, its "
        f"budget and its policy). Budget {BUDGET_ROWS:,} rows (the `bench` preset's in the default "
        f"{DEFAULT_CPU_BYTES >> 20} MiB); `PROTECTED_SHARE` {PROTECTED_SHARE}. Misses summed over {args.seeds} "
        "seeds; the script's docstring says what a request and a miss are.",
        "",
        "| one replica's stream | " + " | ".join(f"misses, {n}" for n in names) + " |",
        "|---|" + "---|" * len(names),
        *(f"| {label} | " + " | ".join(str(c[n]) for n in names) + " |" for label, c in rows),
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cache_eviction.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
