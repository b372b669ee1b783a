"""Attention whose arithmetic depends only on the query's own sequence (batch-invariant mode, DESIGN.md 3d).

The default backends split a row's keys where the batch's trie splits them (segments, prefix blocks, the prefix
cache's segments) and merge the parts in the order the plan made them, so a row's bits depend on its companions
and on what the cache held. Here every computed row attends to the keys of its path split at **fixed absolute
positions**: chunk `c` is the path's positions `[CK c, CK c + CK)` (`KEY_CHUNK` = CK = 128), the last chunk cut
at the query's own position. Each (row, chunk) pair is one **job**, computed as one query row of a dense kernel
call of one fixed shape, and a row's chunks are merged in position order in float32. So the keys a job reads, the
shape of the call, the masked positions and the order of the merge are all functions of the row's history:
whichever radix mode runs (the rows are tokens or compact rows, the key rows wherever they are), whatever the
trie's segments, whether a key comes from the prefix cache or was computed in this batch. Two kinds of tile:

* **whole chunks** (a row's chunks before its last): `QUERY_TILE` queries over the CK keys of one chunk, all
  visible, no mask. Jobs that read the same chunk (the same history up to the chunk's end) share a tile, so a
  shared prompt's chunk is read once per `QUERY_TILE` queries below it.
* **diagonal chunks** (a row's last chunk, up to itself): the square causal block of one sequence's path over the
  chunk, CK queries over the same CK rows, query `i` seeing keys `0..i`: the rows of that chunk of the sequence
  that first holds them, at their positions. A slot whose row belongs to another sequence's tile, or is cached, is
  computed and dropped.

The CPU kernel is the one the torch backend calls (`_scaled_dot_product_flash_attention_for_cpu`): at one fixed
shape it computes every (tile, head, query) the same way whatever the number of tiles, the query's place in its
tile or the keys it does not see, and a query of a causal tile gets the bits it gets in a masked tile that shows it
the same keys (which kind a row's last chunk takes depends on its company; all checked in
`tests/test_batch_invariance.py`). On CUDA the Triton kernel
`radix_core.kernels.chunk_attention` does the same with one program per (tile, head), no split of the keys, and
every last chunk in masked tiles, so all its calls have one shape (flash-attn and the segment kernel are not used
in this mode: their splits of the keys follow the batch's blocks).

Cost: a row at position p scores CK (p // CK) keys in whole chunks plus at most CK in its last one, and tiles with
fewer queries than their size are padded. On the bench shapes (one layer, one thread) this attention takes
1.5-1.6x the default backend's time in float32 and 1.1-2.1x in bfloat16 (the default reads a long shared prefix as
one large block, fixed chunks as many small tiles); chunks of 64 keys in tiles of 32 queries took 1.2-1.8x more
than these. End-to-end figures: bench/results/batch_invariance_cost.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from radix_core.attention import AttentionBackend
from radix_core.index import sequence_positions

KEY_CHUNK = 128  # keys are split at absolute positions 0, 128, 256, ...
QUERY_TILE = 64  # queries per whole-chunk tile
DIAGONAL_ROWS = QUERY_TILE + 1  # a sequence's last-chunk rows that make a diagonal tile; fewer: a masked tile


@dataclass
class Tiles:
    """Dense tiles of one shape: tile `t`'s queries are rows `q_rows[t * Q:(t + 1) * Q]` of q, its keys rows
    `k_rows[t * KEY_CHUNK:(t + 1) * KEY_CHUNK]` of k and v; causal (square, query `i` sees keys `0..i`) or not
    (every key visible)."""

    q_rows: torch.Tensor  # (T * Q,) int64 (padding repeats a real row)
    k_rows: torch.Tensor  # (T * KEY_CHUNK,) int64 (past a path's end: its last row)
    causal: bool
    visible: torch.Tensor | None = None  # (T, Q) int32 keys each query sees (the first ones); None: all, or causal
    _masks: dict = field(default_factory=dict, repr=False)  # additive masks by dtype

    @property
    def count(self) -> int:
        return self.k_rows.shape[0] // KEY_CHUNK

    @property
    def queries(self) -> int:
        return self.q_rows.shape[0] // max(self.count, 1)

    def seen(self) -> torch.Tensor:
        """(T, Q) int32 keys each query slot sees: the first ones."""
        if self.visible is not None:
            return self.visible
        seen = torch.arange(1, self.queries + 1, dtype=torch.int32) if self.causal else \
            torch.full((self.queries,), KEY_CHUNK, dtype=torch.int32)
        return seen.to(self.q_rows.device).expand(self.count, -1).contiguous()

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """(T, 1, Q, KEY_CHUNK) 0 on the keys each query sees, -inf on the others, in `dtype`; None without
        `visible`."""
        if self.visible is None:
            return None
        if dtype not in self._masks:
            hidden = torch.arange(KEY_CHUNK, device=self.visible.device) >= self.visible[:, None, :, None]
            self._masks[dtype] = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill_(
                hidden, float("-inf"))
        return self._masks[dtype]


@dataclass
class KeyPaths:
    """One batch's attention jobs in whole-chunk and diagonal tiles, on the engine's device (module docstring). Key
    rows number the computed rows `0..R` then the cached rows `R..R+C` (the plan's `token_rows`). Rows are taken in
    `order` (most chunks first), so in chunk c the rows with a later chunk lead (their whole chunk c) and the rows
    whose last chunk is c follow (their diagonal tile)."""

    whole: Tiles
    diagonal: Tiles
    masked: Tiles  # last chunks of fewer than QUERY_TILE rows of a sequence: packed queries, masked keys
    chunks: list[tuple[torch.Tensor, torch.Tensor]]  # per chunk c: whole-tile slots (W_c,), last-chunk slots (L_c,)
    # into the diagonal tiles' results, then the masked tiles'

    order: torch.Tensor  # (R,) int64 rows by their number of chunks, most first
    back: torch.Tensor  # (R,) int64 place of each row in `order`

    @property
    def num_rows(self) -> int:
        return self.order.shape[0]


def key_paths(token_rows: np.ndarray, cu_seqlens: np.ndarray, num_rows: int, device: torch.device,
              diagonal: bool = True) -> KeyPaths:
    """The jobs of the computed rows `0..num_rows` of a plan whose original token `i` is row `token_rows[i]` (N,)
    (computed rows first, then cached ones), sequences `cu_seqlens` (B+1,). Each computed row reads the path of the
    first sequence holding it: every sequence holding it has the same history up to it. `diagonal` False: every
    last chunk in masked tiles (the Triton path: one tile shape for all, so no two compiled variants need agree)."""
    seq = np.repeat(np.arange(cu_seqlens.shape[0] - 1), np.diff(cu_seqlens))  # (N,)
    pos = sequence_positions(cu_seqlens).astype(np.int64)  # (N,)
    computed = np.flatnonzero(token_rows < num_rows)  # (Nc,) tokens that are computed rows
    _, first = np.unique(token_rows[computed], return_index=True)  # every row 0..R once: its first token
    token = computed[first]  # (R,)
    p, owner = pos[token], seq[token]  # (R,) position, the sequence whose path it reads
    start = cu_seqlens[owner].astype(np.int64)  # (R,) that sequence's first token
    counts = p // KEY_CHUNK + 1  # (R,) chunks of each row; the last is its diagonal one
    order = np.argsort(-counts, kind="stable")  # (R,)
    ahead = [int((counts > c + 1).sum()) for c in range(int(counts.max()))]  # rows with a whole chunk c
    having = _rows_with(counts)  # rows with a chunk c: the `ahead`, then those whose diagonal chunk it is

    # whole chunks, chunk by chunk, rows in `order`: grouped by the row at the chunk's end
    whole_row = np.concatenate([order[:n] for n in ahead])  # (W,)
    whole_chunk = np.repeat(np.arange(len(ahead)), ahead)  # (W,)
    chunk_start = start[whole_row] + whole_chunk * KEY_CHUNK  # (W,) token of the chunk's first key
    whole_tiles, whole_slot = _group(token_rows[chunk_start + KEY_CHUNK - 1], QUERY_TILE)
    q_whole = np.full(whole_tiles.shape[0] * QUERY_TILE, -1, dtype=np.int64)
    q_whole[whole_slot] = whole_row
    q_whole = _fill_padding(q_whole.reshape(-1, QUERY_TILE))  # (Tw * QUERY_TILE,)
    k_whole = chunk_start[whole_tiles][:, None] + np.arange(KEY_CHUNK)  # (Tw, CK) tokens

    # last chunks: grouped by (sequence, chunk); a group of more than QUERY_TILE rows is one diagonal tile (slot =
    # position in the chunk), a smaller one a masked tile (slot = rank in the group)
    last_row = np.concatenate([order[n:m] for n, m in zip(ahead, having)])  # (R,) chunk by chunk
    last_chunk = counts[last_row] - 1  # (R,)
    width = int(counts.max()) + 1
    groups, group_of, group_size = np.unique(owner[last_row] * width + last_chunk, return_inverse=True,
                                             return_counts=True)  # (G,), (R,), (G,)
    big = (group_size >= DIAGONAL_ROWS) & diagonal  # (G,)
    group_start = cu_seqlens[groups // width].astype(np.int64) + groups % width * KEY_CHUNK  # (G,) slot 0's token
    group_last = cu_seqlens[groups // width + 1].astype(np.int64) - 1  # (G,)
    keys = np.minimum(group_start[:, None] + np.arange(KEY_CHUNK), group_last[:, None])  # (G, CK) tokens
    masked_tiles = np.where(big, 0, -(-group_size // QUERY_TILE))  # (G,) masked tiles of each group
    tile_of = np.cumsum(big) - big, np.cumsum(masked_tiles) - masked_tiles  # (G,) each: first diagonal, masked tile
    offset = p[last_row] - last_chunk * KEY_CHUNK  # (R,) position in the chunk
    rank = np.zeros(last_row.shape[0], dtype=np.int64)
    by_group = np.argsort(group_of, kind="stable")
    rank[by_group] = np.arange(by_group.shape[0]) - np.repeat(np.cumsum(group_size) - group_size, group_size)
    diag_jobs = big[group_of]  # (R,)
    last_slot = np.where(diag_jobs, tile_of[0][group_of] * KEY_CHUNK + offset,
                         int(big.sum()) * KEY_CHUNK + tile_of[1][group_of] * QUERY_TILE + rank)  # (R,)
    masked_group = np.repeat(np.arange(groups.shape[0]), masked_tiles)  # (Tm,) group of each masked tile
    q_diag = token_rows[keys[big]]  # (Td, CK) the path's rows; cached ones are no query: any computed row of the tile
    q_diag = np.where(q_diag < num_rows, q_diag, q_diag.min(axis=1, keepdims=True)).reshape(-1)
    q_masked = np.full(masked_group.shape[0] * QUERY_TILE, -1, dtype=np.int64)
    seen = np.ones(q_masked.shape[0], dtype=np.int32)
    small = ~diag_jobs
    q_masked[tile_of[1][group_of[small]] * QUERY_TILE + rank[small]] = last_row[small]
    seen[tile_of[1][group_of[small]] * QUERY_TILE + rank[small]] = offset[small] + 1
    q_masked, seen = q_masked.reshape(-1, QUERY_TILE), seen.reshape(-1, QUERY_TILE)

    chunks, w, d = [], 0, 0
    for n, m in zip(ahead, having):
        chunks.append((_upload(whole_slot[w:w + n], device), _upload(last_slot[d:d + m - n], device)))
        w, d = w + n, d + m - n
    back = np.empty_like(order)
    back[order] = np.arange(order.shape[0])
    return KeyPaths(Tiles(_upload(q_whole, device), _upload(token_rows[k_whole].reshape(-1), device), False),
                    Tiles(_upload(q_diag, device), _upload(token_rows[keys[big]].reshape(-1), device), True),
                    Tiles(_upload(_fill_padding(q_masked), device),
                          _upload(token_rows[keys[masked_group]].reshape(-1), device), False,
                          torch.from_numpy(seen).to(device)),
                    chunks, _upload(order, device), _upload(back, device))


def _rows_with(counts: np.ndarray) -> list[int]:
    """Per chunk c: how many rows have a chunk c."""
    return [int((counts > c).sum()) for c in range(int(counts.max()))]


def _group(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Jobs grouped by `keys` (J,) into dense tiles of `size`: (first job of each tile (T,), slot of each job (J,))."""
    if keys.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.argsort(keys, kind="stable")  # (J,)
    _, first, count = np.unique(keys[order], return_index=True, return_counts=True)  # (U,) each
    tiles = -(-count // size)  # (U,) tiles of each key
    tile_base = np.cumsum(tiles) - tiles  # (U,) first tile of each key
    rank = np.arange(order.shape[0]) - np.repeat(first, count)  # (J,) place among its key's jobs (sorted order)
    slot = np.empty(order.shape[0], dtype=np.int64)
    slot[order] = np.repeat(tile_base, count) * size + rank
    heads = order[np.repeat(first, tiles) + (np.arange(tiles.sum()) - np.repeat(tile_base, tiles)) * size]  # (T,)
    return heads, slot


def _fill_padding(rows: np.ndarray) -> np.ndarray:
    """(T, Q) rows with -1 on padded slots -> flat, each padded slot repeating its tile's first row."""
    return np.where(rows >= 0, rows, rows[:, :1]).reshape(-1)


def _upload(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)


def merge_chunks(whole: tuple[torch.Tensor, torch.Tensor], diagonal: tuple[torch.Tensor, torch.Tensor],
                 paths: KeyPaths) -> torch.Tensor:  # `diagonal`: the last chunks' results, diagonal then masked
    """(R, H, D) each row's softmax over its whole path from its jobs' (out (slots, H, D), lse (slots, H) float32)
    of both kinds of tile: weighted by exp(lse - the row's largest lse) and summed chunk after chunk, in float32;
    out's dtype. In chunk c the rows with a whole chunk c lead, those whose diagonal chunk it is follow."""
    dtype = diagonal[0].dtype
    parts = [[(whole, w_slots), (diagonal, d_slots)] for w_slots, d_slots in paths.chunks]
    top = torch.full((paths.num_rows, diagonal[0].shape[1]), float("-inf"), device=diagonal[0].device)  # (R, H)
    for chunk in parts:
        lo = 0
        for (_, lse), slots in chunk:
            hi = lo + slots.shape[0]
            torch.maximum(top[lo:hi], lse.index_select(0, slots), out=top[lo:hi])
            lo = hi
    total = torch.zeros(*top.shape, diagonal[0].shape[2], device=top.device)  # (R, H, D) float32
    weight = torch.zeros_like(top)  # (R, H)
    for chunk in parts:
        lo = 0
        for (out, lse), slots in chunk:
            hi = lo + slots.shape[0]
            w = (lse.index_select(0, slots) - top[lo:hi]).exp_()  # (n, H)
            total[lo:hi].add_(out.index_select(0, slots).float().mul_(w[..., None]))
            weight[lo:hi].add_(w)
            lo = hi
    return total.div_(weight[..., None]).index_select(0, paths.back).to(dtype)


class InvariantAttention(AttentionBackend):
    """Batch-invariant attention (module docstring): reads only `meta.paths`, in every mode (in `mlp` the rows stay
    compact: a row's result does not depend on the layout)."""

    name = "invariant"

    def __init__(self, device: torch.device):
        self.triton = device.type == "cuda"  # the Triton tiles on CUDA, the CPU kernel elsewhere

    def prepare(self, plan) -> None:
        if plan.attention.paths is None:
            plan.attention.paths = key_paths(plan.token_rows, plan.cu_seqlens, plan.num_rows,
                                             plan.row_ids.device, diagonal=not self.triton)

    def __call__(self, q, k, v, meta, scale, past=None):
        paths = meta.paths
        if past is not None:  # key rows R.. are the cached rows
            k, v = torch.cat([k, past[0]]), torch.cat([v, past[1]])  # (R + C, Hkv, D)
        diagonal, masked = self.tiles(q, k, v, paths.diagonal, scale), self.tiles(q, k, v, paths.masked, scale)
        last = tuple(torch.cat(pair) for pair in zip(diagonal, masked))  # (L, Hq, D), (L, Hq)
        return merge_chunks(self.tiles(q, k, v, paths.whole, scale), last, paths)

    def tiles(self, q, k, v, tiles: Tiles, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One dense call over `tiles`: (out (slots, Hq, D) in q's dtype, lse (slots, Hq) float32)."""
        t, queries = tiles.count, tiles.queries
        qt = q.index_select(0, tiles.q_rows).view(t, queries, *q.shape[1:]).transpose(1, 2)  # (T, Hq, Q, D)
        kt, vt = (x.index_select(0, tiles.k_rows).view(t, KEY_CHUNK, *x.shape[1:]).transpose(1, 2)
                  for x in (k, v))  # (T, Hkv, CK, D)
        if t == 0:
            out, lse = qt.new_empty(qt.shape), qt.new_empty(qt.shape[:3], dtype=torch.float32)
        elif self.triton:
            from radix_core.kernels.chunk_attention import chunk_attention

            out, lse = chunk_attention(qt, kt, vt, tiles.seen(), scale)
        else:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qt, kt, vt, 0.0, tiles.causal, attn_mask=tiles.additive_mask(q.dtype), scale=scale)[:2]
        # both kernels lay their output out query-major: these reshapes are views (lse's, on the CPU, a copy)
        return out.transpose(1, 2).reshape(-1, *q.shape[1:]), lse.transpose(1, 2).reshape(-1, q.shape[1]).float()
