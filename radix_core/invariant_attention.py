"""Attention whose arithmetic depends only on the query's own sequence (batch-invariant mode, DESIGN.md 3d).

The default backends split a row's keys where the batch's trie splits them (segments, prefix blocks, the prefix
cache's segments) and merge the parts in the order the plan made them, so a row's bits depend on its companions
and on what the cache held. Here every computed row attends to the keys of its path split at **fixed absolute
positions**: chunk `c` is the path's positions `[64c, 64c + 64)` (`KEY_CHUNK`), the last chunk cut at the query's
own position. Each (row, chunk) pair is one **job**, computed as one query row of a dense call of fixed shape
(`QUERY_TILE` queries x `KEY_CHUNK` keys, keys past the job's visible ones masked with -inf), and a row's chunks
are merged in position order in float32. So the keys a job reads, the shape of the kernel call, the masked
positions and the order of the merge are all functions of the row's history: whichever radix mode runs (the rows
are tokens or compact rows, the key rows wherever they are), whatever the trie's segments, whether a key comes
from the prefix cache or was computed in this batch.

Jobs that read the same chunk of keys (the same history up to the chunk's end) share a tile: they are grouped so a
shared prompt's chunk is read once per `QUERY_TILE` queries below it, not once per query. The CPU kernel is the
one the torch backend calls (`_scaled_dot_product_flash_attention_for_cpu`): for a fixed (queries, keys) shape it
computes every (tile, head, query) the same way whatever the number of tiles or the query's place in its tile
(checked in `tests/test_batch_invariance.py`); on CUDA the Triton kernel `radix_core.kernels.chunk_attention`
does the same with one program per (tile, head), no split of the keys (flash-attn and the segment kernel are not
used in this mode: their splits of the keys follow the batch's blocks).

Cost: a row at position p scores 64 * (p // 64 + 1) keys, at most 63 more than its p + 1, and a tile with fewer
queries than `QUERY_TILE` is padded (bench/results/batch_invariance.md has the end-to-end figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from radix_core.attention import AttentionBackend
from radix_core.cascade import concat_ranges
from radix_core.index import sequence_positions

KEY_CHUNK = 64  # keys are split at absolute positions 0, 64, 128, ...
QUERY_TILE = 32  # queries per tile of a dense call


@dataclass
class KeyPaths:
    """One batch's attention jobs in tiles of `QUERY_TILE` queries over `KEY_CHUNK` keys, on the engine's device.
    Key rows number the computed rows `0..R` then the cached rows `R..R+C` (the plan's `token_rows`)."""

    q_rows: torch.Tensor  # (T * QUERY_TILE,) int64 computed row of each query slot (padding repeats a real one)
    k_rows: torch.Tensor  # (T * KEY_CHUNK,) int64 key row of each key slot (past a tile's end: its last key)
    seen: torch.Tensor  # (T, QUERY_TILE) int32 keys each query slot sees: the tile's first ones
    chunks: list[torch.Tensor]  # per chunk c: (R_c,) int64 slot of the job (order[i], c) for i < R_c
    order: torch.Tensor  # (R,) int64 rows by their number of chunks, most first: the rows with a chunk c lead
    back: torch.Tensor  # (R,) int64 place of each row in `order`

    @property
    def num_rows(self) -> int:
        return self.order.shape[0]

    @property
    def tiles(self) -> int:
        return self.seen.shape[0]

    @property
    def visible(self) -> torch.Tensor:
        """(T, 1, QUERY_TILE, KEY_CHUNK) bool, True on the keys each query slot sees."""
        return (torch.arange(KEY_CHUNK, device=self.seen.device) < self.seen[..., None])[:, None]

    @cached_property
    def _masks(self) -> dict[torch.dtype, torch.Tensor]:
        return {}

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(T, 1, QUERY_TILE, KEY_CHUNK): 0 on visible keys, -inf elsewhere, in `dtype`; built once per dtype."""
        if dtype not in self._masks:
            visible = self.visible
            self._masks[dtype] = torch.zeros(visible.shape, dtype=dtype, device=visible.device
                                             ).masked_fill_(~visible, float("-inf"))
        return self._masks[dtype]


def key_paths(token_rows: np.ndarray, cu_seqlens: np.ndarray, num_rows: int, device: torch.device) -> KeyPaths:
    """The jobs of the computed rows `0..num_rows` of a plan whose original token `i` is row `token_rows[i]` (N,)
    (computed rows first, then cached ones), sequences `cu_seqlens` (B+1,). Each computed row reads the path of the
    first sequence holding it: every sequence holding it has the same history up to it."""
    n = token_rows.shape[0]
    seq = np.repeat(np.arange(cu_seqlens.shape[0] - 1), np.diff(cu_seqlens))  # (N,)
    pos = sequence_positions(cu_seqlens).astype(np.int64)  # (N,)
    computed = np.flatnonzero(token_rows < num_rows)  # (Nc,) tokens that are computed rows
    rows, first = np.unique(token_rows[computed], return_index=True)  # every row 0..R once, its first token
    token = computed[first]  # (R,)
    p, start = pos[token], cu_seqlens[seq[token]].astype(np.int64)  # (R,) position; its sequence's first token
    last = cu_seqlens[seq[token] + 1].astype(np.int64) - 1  # (R,) its sequence's last token
    counts = p // KEY_CHUNK + 1  # (R,) chunks of each row
    job_row = np.repeat(rows, counts)  # (J,) row by row, chunks in order
    job_chunk = concat_ranges(np.zeros_like(counts), counts)  # (J,)
    job_first = start[job_row] + job_chunk * KEY_CHUNK  # (J,) token of the chunk's first key
    job_end = np.minimum(job_first + KEY_CHUNK - 1, last[job_row])  # (J,) token of its last key (along this path)
    tile_key = token_rows[job_end]  # (J,) the row at the chunk's end: equal rows, equal histories, equal keys
    visible = np.minimum(p[job_row] - job_chunk * KEY_CHUNK, KEY_CHUNK - 1) + 1  # (J,) keys the job sees

    order = np.argsort(tile_key, kind="stable")  # (J,) jobs tile by tile
    _, tile_first, tile_jobs = np.unique(tile_key[order], return_index=True, return_counts=True)  # (U,) each
    tile_count = -(-tile_jobs // QUERY_TILE)  # (U,) dense tiles of each shared chunk
    tile_of = np.repeat(np.arange(tile_first.shape[0]), tile_count)  # (T,) chunk of each dense tile
    offset = (np.arange(tile_of.shape[0]) - np.repeat(np.cumsum(tile_count) - tile_count, tile_count)) * QUERY_TILE
    slot = np.minimum(offset[:, None] + np.arange(QUERY_TILE), tile_jobs[tile_of][:, None] - 1)  # (T, QUERY_TILE)
    slot_job = order[tile_first[tile_of][:, None] + slot]  # (T, QUERY_TILE) job of each query slot
    padded = offset[:, None] + np.arange(QUERY_TILE) >= tile_jobs[tile_of][:, None]  # (T, QUERY_TILE)
    head = order[tile_first[tile_of]]  # (T,) a job of each dense tile: its keys are the tile's
    key_token = np.minimum(job_first[head][:, None] + np.arange(KEY_CHUNK), job_end[head][:, None])  # (T, CHUNK)

    flat_job = slot_job.reshape(-1)  # (T * QUERY_TILE,)
    real = np.flatnonzero(~padded.reshape(-1))  # (J,) slots holding a job, each job once
    slot_of_job = np.empty(job_row.shape[0], dtype=np.int64)
    slot_of_job[flat_job[real]] = real  # (J,)
    order = np.argsort(-counts, kind="stable")  # (R,) rows with most chunks first
    first_job = np.cumsum(counts) - counts  # (R,) a row's chunk 0
    chunks = [_upload(slot_of_job[first_job[order[:int((counts > c).sum())]] + c], device)
              for c in range(int(counts.max()))]
    back = np.empty_like(order)
    back[order] = np.arange(order.shape[0])
    return KeyPaths(_upload(job_row[flat_job], device), _upload(token_rows[key_token].reshape(-1), device),
                    torch.from_numpy(visible[slot_job].astype(np.int32)).to(device), chunks, _upload(order, device),
                    _upload(back, device))


def _upload(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)


def merge_chunks(out: torch.Tensor, lse: torch.Tensor, paths: KeyPaths) -> torch.Tensor:
    """(R, H, D) each row's softmax over its whole path from its jobs' `out` (slots, H, D) and `lse` (slots, H)
    float32: weighted by exp(lse - the row's largest lse) and summed chunk after chunk, in float32; out's dtype.
    Rows are in `paths.order` until the end, so the rows with a chunk c are a leading slice."""
    top = lse.index_select(0, paths.chunks[0])  # (R, H) chunk 0: every row has one
    for slots in paths.chunks[1:]:
        torch.maximum(top[:slots.shape[0]], lse.index_select(0, slots), out=top[:slots.shape[0]])
    total = torch.zeros(*top.shape, out.shape[2], device=out.device)  # (R, H, D) float32
    weight = torch.zeros_like(top)  # (R, H)
    for slots in paths.chunks:
        rows = slots.shape[0]
        w = (lse.index_select(0, slots) - top[:rows]).exp_()  # (R_c, H)
        total[:rows].add_(out.index_select(0, slots).float().mul_(w[..., None]))
        weight[:rows].add_(w)
    return total.div_(weight[..., None]).index_select(0, paths.back).to(out.dtype)


class InvariantAttention(AttentionBackend):
    """Batch-invariant attention (module docstring): reads only `meta.paths`, in every mode (in `mlp` the rows stay
    compact: a row's result does not depend on the layout)."""

    name = "invariant"

    def __init__(self, device: torch.device):
        self.triton = device.type == "cuda"  # the Triton tiles on CUDA, the CPU kernel elsewhere

    def prepare(self, plan) -> None:
        if plan.attention.paths is None:
            plan.attention.paths = key_paths(plan.token_rows, plan.cu_seqlens, plan.num_rows,
                                             plan.row_ids.device)

    def __call__(self, q, k, v, meta, scale, past=None):
        paths = meta.paths
        if past is not None:  # key rows R.. are the cached rows
            k, v = torch.cat([k, past[0]]), torch.cat([v, past[1]])  # (R + C, Hkv, D)
        out, lse = self.tiles(q, k, v, paths, scale)  # (T * QUERY_TILE, Hq, D), (T * QUERY_TILE, Hq)
        return merge_chunks(out, lse, paths)

    def tiles(self, q, k, v, paths: KeyPaths, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Every tile's dense call: (out (slots, Hq, D) in q's dtype, lse (slots, Hq) float32)."""
        t = paths.tiles
        qt = q.index_select(0, paths.q_rows).view(t, QUERY_TILE, *q.shape[1:]).transpose(1, 2)  # (T, Hq, TQ, D)
        kt, vt = (x.index_select(0, paths.k_rows).view(t, KEY_CHUNK, *x.shape[1:]).transpose(1, 2)
                  for x in (k, v))  # (T, Hkv, CHUNK, D)
        if self.triton:
            from radix_core.kernels.chunk_attention import chunk_attention

            out, lse = chunk_attention(qt, kt, vt, paths.seen, scale)
        else:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qt, kt, vt, 0.0, False, attn_mask=paths.additive_mask(q.dtype), scale=scale)[:2]
        # both kernels lay their output out query-major: these reshapes are views (lse's, on the CPU, a copy)
        return out.transpose(1, 2).reshape(-1, *q.shape[1:]), lse.transpose(1, 2).reshape(-1, q.shape[1]).float()
