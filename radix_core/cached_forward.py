"""A batch's forward with the prefix cache (`radix_core.prefix_cache`): rows whose history is cached are read, not
computed, and rows seen the second time enter the cache.

    plan, hidden = run_with_cache(arch, backend, cache, prepared, scopes, origins)  # hidden: (F + C, hidden)

**Where the match happens: here, right before the forward, in the engine's process**, not where the batch is
prepared. The serving layer's IndexBuilder prepares batch k+1 in another process while batch k runs, but the cache
lives in the engine's device memory and changes as batches run: matched there, batch k+1 would miss what batch k
inserts (most often its own prefix: prefix routing and the batcher send one key's requests to one replica in
consecutive batches) and could name segments that batch k evicts. The IndexBuilder keeps the expensive part (the
trie and the cascade plan of the whole batch); here the lookup walks each sequence down the tree from where the
previous sequence's path parts from it (a dict lookup and one C comparison per segment), and only a batch with hits
is re-planned, in numpy over its N tokens and N' compact rows, with no trie to build.

**Which rows are read.** Sequence s reads its first `k_s` tokens from the cache: its cached prefix, cut where a
compact row it shares with another sequence of the batch is not cached for that one (a sequence of another scope;
in a batch of one scope equal histories are cached alike, so no cut is looked for).
Each compact row is then cached for all of its sequences or computed, the cached ones are a prefix of every
path, and the computed rows are a forest below them. Positions of the computed rows continue from k_s.

**How each mode uses the cache.** The computed part of the batch is laid out in the batch's mode, and each of its
queries also attends to the cached rows of its path through **past blocks**: prefix blocks whose keys are cached
K/V (`AttentionMetadata.past`), merged by log-sum-exp with its causal (and prefix) blocks.

* `off`: the tokens after each sequence's cached prefix are the rows, causal per sequence;
* `mlp`: the compact rows not cached; attention in the original layout of the tokens computed (RadixMLP), the
  past blocks' queries there;
* `full`: the compact rows not cached; cascade attention over their forest (a row whose parent is cached is a
  root), the past blocks' queries the computed rows.

Queries are grouped by the cached range they read, so in every mode a cached segment is one past block for all
the queries below it (the cached prompt of 64 sequences is one block of their rows, not 64), read in place when
the batch reads one segment, else from one concatenation per layer. Every backend runs past blocks with its
prefix-block call (torch, flash-attn varlen, the Triton segment kernel: `k`/`v` are the cached rows' tensors).

**Exactness.** A cached row's K/V are the values an earlier batch computed for the same history. The cache also
keeps each row's final hidden state (1.8% more than the K/V of Qwen3-0.6B, 12.5% for the bench preset), so a
sequence that ends inside a cached prefix (a duplicate, an instruction embedded alone) and a task that reads
prefix rows (mean pooling, continuation scoring) read exactly what recomputing gives, and nothing is recomputed.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch

from radix_core.architectures import Architecture
from radix_core.attention import AttentionBackend, AttentionMetadata, PrefixBlocks
from radix_core.batch import PreparedBatch
from radix_core.cached_rows import CachedPrefix
from radix_core.cascade import compact_parents, concat_ranges, forest_plan
from radix_core.forward import (
    BatchPlan,
    cascade_attention,
    causal_blocks,
    plan_compact,
    plan_ragged,
    prefix_blocks,
    run_layers,
    select_final_rows,
    upload,
)
from radix_core.index import sequence_positions
from radix_core.prefix_cache import CacheLease, Origins, PrefixCache


def run_with_cache(arch: Architecture, backend: AttentionBackend, cache: PrefixCache, prepared: PreparedBatch,
                   scopes: Sequence[Hashable] | None = None, origins: Origins | None = None,
                   reads: np.ndarray | None = None) -> tuple[BatchPlan, torch.Tensor]:
    """The plan of `prepared` and its hidden states (F + C, hidden), reading `cache` and filling it; `scopes`: one
    per sequence (whose cache tree it reads), or None for the shared one; `origins`: each sequence's request and
    its shared prefix, for admission (`PrefixCache.lease`), or None; `reads`: the tokens whose final states the
    caller reads (`radix_core.forward.select_final_rows`), None for all."""
    with cache.lease(prepared.input_ids, prepared.cu_seqlens, scopes, origins) as lease:
        plan = plan_with_cache(prepared, lease, cache.shape.device, reads)
        hidden = run_layers(arch, plan, backend)
        lease.commit(plan.kept)
    return plan, hidden


def plan_with_cache(prepared: PreparedBatch, lease: CacheLease, device: torch.device,
                    reads: np.ndarray | None = None) -> BatchPlan:
    """`prepared` laid out for its mode without the rows `lease` has cached, reading them instead; the rows it
    admitted are kept for the cache; the final rows those and the tokens `reads` name."""
    cu = prepared.cu_seqlens
    seq = np.repeat(np.arange(prepared.num_sequences), np.diff(cu))  # (N,) sequence of each token
    pos = sequence_positions(cu).astype(np.int64)  # (N,)
    lengths = lease.matched if lease.one_tree else continuable_lengths(prepared, lease, seq, pos)
    past = lease.past(lengths)
    if past is None:
        plan = plan_ragged(prepared.input_ids, cu, device) if prepared.mode == "off" else plan_compact(prepared, device)
    elif prepared.mode == "off" or int(lengths.sum()) == prepared.num_tokens:  # all cached: nothing to lay out
        plan = _plan_ragged_past(prepared, pos >= lengths[seq], seq, pos, past, device)
    else:
        plan = _plan_compact_past(prepared, pos >= lengths[seq], seq, past, device)
    plan.cached_lengths, plan.past = lengths, past
    kept = None
    if lease.admitted or lease.refills:
        starts = np.array([cu[s] + start for s, start, _ in lease.admitted], dtype=np.int64)
        sizes = np.array([end - start for _, start, end in lease.admitted], dtype=np.int64)
        ends = np.array([cu[s] + last for s, last in lease.ends()], dtype=np.int64)  # (E,) tokens
        kept = plan.token_rows[concat_ranges(starts, sizes)]  # (A,) computed rows
        plan.kept = lease.keep(upload(kept, torch.int64, device), plan.token_rows[ends])
    select_final_rows(plan, reads, kept)
    return plan


def continuable_lengths(prepared: PreparedBatch, lease: CacheLease, seq: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """`cached_lengths` for a batch of several trees; for a hybrid model each cut further back to where a cached
    recurrent state is (`CacheLease.state_boundary`), until no compact row is cached for one sequence and computed
    for another (each pass only shortens, so it ends)."""
    lengths = cached_lengths(prepared, lease.matched, seq, pos)
    if lease.cache.shape.ends is None:
        return lengths
    while True:
        bounded = np.array([lease.state_boundary(s, n) for s, n in enumerate(lengths.tolist())], dtype=np.int64)
        if np.array_equal(bounded, lengths):
            return lengths
        lengths = cached_lengths(prepared, bounded, seq, pos)


def cached_lengths(prepared: PreparedBatch, matched: np.ndarray, seq: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """(B,) leading tokens of each sequence to read from the cache: its cached prefix (`matched`), cut at the first
    compact row that another sequence of the batch computes."""
    index = prepared.index
    if index is None or not matched.any():
        return matched
    scatter = index.scatter.astype(np.int64)  # (N,)
    computed = np.zeros(index.num_compact, dtype=bool)
    computed[scatter[pos >= matched[seq]]] = True  # (N',) rows some sequence does not find cached
    stop = np.where(computed[scatter], pos, np.diff(prepared.cu_seqlens)[seq])  # (N,)
    return np.minimum.reduceat(stop, prepared.cu_seqlens[:-1])


def _plan_ragged_past(prepared: PreparedBatch, computed: np.ndarray, seq: np.ndarray, pos: np.ndarray,
                      past: CachedPrefix, device: torch.device) -> BatchPlan:
    """`off` with cache hits: the `computed` tokens (N,) are the rows, causal per sequence after its cached
    prefix."""
    todo = np.flatnonzero(computed)  # (R,)
    token_rows = _token_rows(computed, np.arange(todo.shape[0]), todo.shape[0], past)  # (N,)
    bounds = _bounds(seq[todo], prepared.num_sequences)  # (B+1,)
    attention = AttentionMetadata(causal_blocks(np.unique(bounds), device),  # sequences all cached drop out
                                  past=past_blocks(seq[todo], past, device))
    return BatchPlan("off", upload(prepared.input_ids[todo], torch.int64, device),
                     upload(pos[todo], torch.int64, device), upload(token_rows, torch.int64, device), token_rows,
                     prepared.cu_seqlens, bounds, attention)


def _plan_compact_past(prepared: PreparedBatch, computed: np.ndarray, seq: np.ndarray, past: CachedPrefix,
                       device: torch.device) -> BatchPlan:
    """`mlp` or `full` with cache hits: the compact rows of the `computed` tokens (N,) are the rows."""
    index = prepared.index
    scatter, first = index.scatter.astype(np.int64), index.fold_gather.astype(np.int64)  # (N,), (N',)
    keep = computed[first]  # (N',) compact rows computed: a row's tokens are all computed or all cached
    row = np.cumsum(keep) - 1  # (N',) computed row of each kept compact row
    todo = np.flatnonzero(computed)  # (Nt,) tokens computed
    token_rows = _token_rows(computed, row[scatter[todo]], int(keep.sum()), past)  # (N,)
    if prepared.mode == "mlp":
        attention = AttentionMetadata(
            causal_blocks(np.unique(_bounds(seq[todo], prepared.num_sequences)), device),
            past=past_blocks(seq[todo], past, device),
            qkv_scatter=upload(row[scatter[todo]], torch.int64, device),  # (Nt,) computed row of each token
            out_gather=upload((np.cumsum(computed) - 1)[first[keep]], torch.int64, device))  # (R,) its first token
    else:
        parent = compact_parents(index)[keep]  # (R,) compact rows, -1 at sequence starts
        inside = parent >= 0
        inside[inside] = keep[parent[inside]]  # (R,) the parent is computed too
        attention = cascade_attention(forest_plan(np.where(inside, row[parent], -1)), device)
        attention.past = past_blocks(seq[first[keep]], past, device)  # a row reads its first sequence's cache path
    return BatchPlan(prepared.mode, upload(index.compact_input_ids[keep], torch.int64, device),
                     upload(index.compact_position_ids[keep], torch.int64, device),
                     upload(token_rows, torch.int64, device), token_rows, prepared.cu_seqlens,
                     _cumulative(keep)[index.cu_seqlens_q.astype(np.int64)], attention)


def past_blocks(owner: np.ndarray, past: CachedPrefix, device: torch.device) -> PrefixBlocks | None:
    """Past blocks for queries whose sequences are `owner` (Q,), sorted (every mode lays rows out sequence by
    sequence): query q reads each cached range of its sequence's path; one block per distinct range, its queries
    in order. The ranges are told apart over the (sequence, range) pairs, a few per sequence, not over the
    queries' (a hundred times as many on a rerank: 2.4 -> 0.27 ms for 1,000 MS MARCO sequences). None when no query
    reads the cache."""
    q_cu = np.searchsorted(owner, np.arange(past.pair_cu.shape[0]))  # (B+1,) each sequence's queries
    pair_counts = np.diff(past.pair_cu)  # (B,) ranges of each sequence
    readers = np.repeat(np.diff(q_cu), pair_counts)  # (T,) queries reading each (sequence, range) pair
    if not readers.any():
        return None
    width = past.num_rows + 1
    ranges, block = np.unique(past.pair_start * width + past.pair_end, return_inverse=True)  # (J,), (T,)
    order = np.argsort(block, kind="stable")  # (T,) pairs block after block, sequence by sequence in each
    sequence = np.repeat(np.arange(pair_counts.shape[0]), pair_counts)[order]  # (T,)
    queries = concat_ranges(q_cu[sequence], readers[order])  # (P,) each block's queries, in order
    counts = np.bincount(block, weights=readers, minlength=ranges.shape[0]).astype(np.int64)  # (J,)
    read = counts > 0
    return prefix_blocks(queries, _cumulative(counts[read]), ranges[read] // width, ranges[read] % width, device)


def _token_rows(computed: np.ndarray, computed_rows: np.ndarray, num_rows: int, past: CachedPrefix) -> np.ndarray:
    """(N,) int64 row of each token in the result's hidden states: `computed_rows` for the computed tokens, and
    `num_rows` + its cached row for each cached one (the cached ranges of each sequence, in path order)."""
    rows = np.empty(computed.shape[0], dtype=np.int64)
    rows[computed] = computed_rows
    rows[~computed] = num_rows + concat_ranges(past.pair_start, past.pair_end - past.pair_start)
    return rows


def _bounds(owner: np.ndarray, num_sequences: int) -> np.ndarray:
    """(B+1,) int64 boundaries of each sequence's rows, from the sequence of each row `owner` (sorted)."""
    return _cumulative(np.bincount(owner, minlength=num_sequences))


def _cumulative(counts: np.ndarray) -> np.ndarray:
    """(len + 1,) int64 boundaries from counts (or booleans)."""
    out = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out
