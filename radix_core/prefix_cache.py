"""The prefix cache: K/V of every layer, and the final hidden state, of token-id prefixes an engine has computed,
kept across batches under a byte budget, so that a hot prefix is computed once per replica, not once per batch.

    cache = PrefixCache(RowShape.of(arch, dtype, device), budget_bytes=256 << 20)  # RowShape: cached_rows
    with cache.lease(input_ids, cu_seqlens, scopes, origins) as lease:  # one batch; the cache is locked meanwhile
        lease.matched                # (B,) leading tokens of each sequence whose rows are cached
        past = lease.past(lengths)   # those rows (lengths <= matched), for the forward to read
        kept = lease.keep(rows)      # buffers the forward copies the admitted rows' K/V and states into
        lease.commit(kept)           # the admitted rows become cached

`radix_core.cached_forward` drives a batch's forward through a lease; `radix_core.cached_rows` holds the rows as
the forward sees them. A sequence always starts at position 0, so its token ids are its history: equal ids, equal
K/V, whichever batch computed them.

**The tree.** A radix tree over token-id sequences, one tree per scope (`scopes`, one value per sequence: the
first edge of its path, e.g. the API key, so that tenants never read each other's rows; None for one shared
tree). Each node is a **segment**: a run of token ids and, once cached, its rows' K/V `(layers, 2, n, Hkv, D)`
and final-normed hidden states `(n, hidden)` in the engine's dtype on its device. A lookup walks a sequence down
the tree: the longest cached prefix, ending anywhere, inside a segment too. Where a sequence leaves a segment in
its middle, the segment is split there (its K/V copied into two tensors, so each half frees its own memory).

**States.** A segment is `resident` (K/V held, counted against the budget), `pending` (admitted by this lease,
filled at commit) or a `ghost` (ids only: a record that the prefix was seen). Along every path resident
segments come first, then pending, then ghosts. The part of a sequence below where it left the tree, seen once,
is a **ghost tail**: its ids (bytes) and its request, a tuple in its parent's children, recorded in its batch's
`_Tails`, until a walk reaches it again and makes it a ghost segment: a rerank's 1,000 one-off documents are 1,000
dict entries, not 1,000 objects to create, order, collect and free.

**Admission: the second sighting.** A row enters the cache the second time its history is seen: two sequences of
one batch share it (a few-shot prompt, a rerank query, an embedding instruction: admitted by the batch that
first computes it, hit by every later one), or a ghost left by an earlier batch is walked again (a conversation
scored again at its next turn). A history seen once stays a ghost, so the one-off documents of a rerank stream,
most of its tokens, never cost a K/V copy nor push a hot prefix out. Nor do short branches: a seen ghost of fewer
than `min_leaf_rows` rows (default 4) with nothing admitted below it stays a ghost. Under a rerank query, documents
that start with the same word share such a segment (about 180 of a 1,000-document batch of random 2,000-id text),
which no later batch is likely to read; admitted, each cost two copies at commit (its K/V and its states), 16 ms of
the bookkeeping of such a batch on the bench model, against 1 ms without them. A short segment on the path to a
longer admitted one is admitted with it. Ghosts cost their ids, and at most `ghost_tokens` of them are remembered
(default 4x the rows the budget holds), least recently seen forgotten first (a batch's ghost tails in the
order it left them, as one entry of the ghosts' recency order).

**An item's own rows: the second request.** Below its request's shared prefix a row is an item's own, and there
sightings count only from two requests (`Origins`, given by `Engine.run_jobs`: each sequence's request, an id drawn
when the request is encoded and kept by its parts, and the request's `shared_len`). Documents of one rerank that
open with the same sentence share rows in its batch, and again in its later batches (the served path runs a
1,000-document request as ~7 batches); admitted, those rows cost a K/V copy each, and the request's later batches
read them back as dozens of small past blocks a batch, slower than computing them: two 1,000-document MS
MARCO-shaped reranks (`tiny` preset) through the served path's 14 batches took 959 ms of forward admitting 11,028
such rows, 888 ms admitting only their 80 rows of prompt and query, and 861 ms without the cache (the least of 6
interleaved runs on 2 CPUs). The same rows sent again by another request (a repeated document or text, a user
scoring again) are admitted then; so are the inputs of a few-shot request once another request repeats them (each
input is shared by its labels' sequences, all of its own request). A segment that starts inside the shared prefix
is admitted whole (documents that all open alike extend it); one once evicted is admitted at its next sighting,
whoever sees it. Without origins (`Engine.forward`, the cache alone) each sequence is a request of its own.

**Eviction.** Least recently used first, one whole segment at a time, only segments without cached segments below
them (evicting one may expose its parent); never one this lease uses. Segments read back by a later batch (`read`)
are kept over those never read back while they hold at most a target number of rows, at first `PROTECTED_SHARE` of
the budget: a few-shot prompt read by every request of its own is not pushed out by rows admitted after it and never
read back (without origins, the inputs those requests admit), newer though they are. `bench/cache_eviction.py` feeds
the cache alone, without origins, one replica's share of the few-shot stream (a budget of 14,563 rows, prompts of
1,024): holding 10 prompts it missed one it held 0 times in 360 requests against 12 least recently used first,
holding 11 prompts 4 against 31, holding 12, 25 against 42. The target adapts as in ARC (Megiddo and Modha, "ARC: A
Self-Tuning, Low Overhead Replacement Cache", FAST 2003): an evicted segment seen again raises it by its rows if it
had been read back, and lowers it if not, so prompts that are no longer sent give way to new ones that were evicted
before their second request (8 prompts replaced by 8 new ones: 8 misses in 300 requests after the change, against 1
least recently used first; 24 with the target fixed, in a scratch run; a first target of 0.5 kept too few prompts,
18 misses holding 11, and 1.0 gave way slowest, 17). An evicted segment becomes a ghost, so the next sighting of its
prefix admits it again. The bytes held, pending rows included, never pass the budget (a segment split copies its K/V
once, briefly holding both); an admission that cannot be made room for is skipped. Recency is kept by ordered dicts
(the resident segments, those of them never read back, the ghosts) with every segment after its descendants (and
after the `_Tails` entries of the ghost tails below it), so the eviction scan finds the least recently used segment
without cached segments below it at or near the front of the resident or the never read back, and a ghost is
forgotten only once nothing hangs below it.

**Hybrid models** (Gated DeltaNet layers, `RowShape.ends`): a segment also holds, at its end, each recurrent
layer's state and convolution tail (`end`), counted against the budget with its rows. A sequence continues a cached
prefix only where such a state is: at the end of a segment that has one, or at its own end (nothing computed
after). Segments end wherever the batches' sequences part or end, at any token, with no block alignment. A segment
split by a walk keeps its state in its lower part; the upper part has none until a batch computes its rows again
(the walk that stops at its start asks for it: `refills`), and is read up to its start meanwhile.

**One lease at a time.** A lease holds the cache from lookup to commit: the engine runs one batch at a time on
its device, and the next batch must see the previous one's insertions. The tree itself changes only while a lease
looks up and admits, and when it commits or ends; `cached_length` reads it in between (while the batch's forward
runs), for whoever plans the next batches: what the cache holds or the running batch is adding, without waiting
(0 while the tree is changing). Counters (`stats()`) are read without a lock.

    cache.cached_length(ids, scope)  # leading tokens of `ids` cached in `scope`'s tree (resident or pending)
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from radix_core.cached_rows import CachedPrefix, KeptRows, RowShape
from radix_core.cascade import concat_ranges
from radix_core.engine_config import check_cache_budget

if TYPE_CHECKING:
    from radix_core.tasks import TaskJob

RESIDENT, PENDING, GHOST = "resident", "pending", "ghost"
DEFAULT_CPU_BYTES = 256 << 20  # on the CPU: 14,563 rows of the bench preset, 1,149 of Qwen3-0.6B in float32
GPU_FREE_SHARE = 0.3  # on CUDA: this share of the device memory free once the weights are loaded
GHOST_FACTOR = 4  # ghost tokens remembered, per row the budget holds
MIN_LEAF_ROWS = 4  # the fewest rows of a seen ghost admitted with no admission below it
PROTECTED_SHARE = 0.8  # of the budget: segments read back are evicted after those never read while they hold less
SEVERAL = -1  # a ghost's `request` once two requests have seen it; requests are ids >= 0, or below -1 for the
# sequences of a lease given no origins (each a request of its own)
_LEAF: dict = {}  # the children of every segment that has none


def cache_budget(setting: int | str, shape: RowShape) -> int:
    """The budget in bytes for `prefix_cache_bytes`: "auto" is `DEFAULT_CPU_BYTES` on the CPU and
    `GPU_FREE_SHARE` of the free device memory on CUDA; 0 turns the cache off."""
    check_cache_budget(setting)
    if setting != "auto":
        return setting
    if shape.device.type != "cuda":
        return DEFAULT_CPU_BYTES
    return int(torch.cuda.mem_get_info(shape.device)[0] * GPU_FREE_SHARE)


@dataclass
class PrefixCacheStats:
    """The cache's counters since it was made (or cleared), and what it holds now."""

    budget_bytes: int
    bytes: int = 0  # K/V and hidden states held, pending rows included
    segments: int = 0  # resident segments
    lookups: int = 0  # sequences looked up
    lookup_tokens: int = 0  # their tokens
    hit_tokens: int = 0  # tokens read from the cache instead of computed
    inserted_tokens: int = 0  # rows that entered the cache
    evictions: int = 0  # segments evicted
    evicted_tokens: int = 0  # their rows
    ghost_tokens: int = 0  # token ids remembered as seen once

    @property
    def hit_ratio(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


class _Segment:
    """A node of the tree: token ids `ids` at positions `depth ..`, and in the resident state their rows."""

    __slots__ = ("ids", "size", "depth", "parent", "children", "state", "kv", "states", "end", "tick", "scope",
                 "read", "evicted_read", "request")

    def __init__(self, ids: bytes, depth: int, parent: _Segment | None, state: str, scope: Hashable = None,
                 request: int = SEVERAL):
        self.ids = ids  # n int32 token ids as bytes: compared in C (`bytes.startswith`), 4 bytes a token
        self.size = len(ids) >> 2  # n
        self.depth = depth  # tokens above the segment: the position of its first row
        self.parent = parent  # None for a scope's root
        self.children: dict[bytes, _Segment | _Tail] = _LEAF  # by first token id's bytes; its own dict from the
        # first
        self.state = state
        self.kv: torch.Tensor | None = None  # (layers, 2, n, Hkv, D) when resident
        self.states: torch.Tensor | None = None  # (n, hidden) when resident
        self.end: tuple[torch.Tensor, torch.Tensor] | None = None  # hybrid: recurrent states, conv tails at its end
        self.tick = 0  # the last lease that walked it
        self.scope = scope  # a root's scope
        self.read = False  # resident and read by a batch since the one that admitted it
        self.evicted_read: bool | None = None  # a ghost once resident: whether it had been read when evicted
        self.request = request  # a ghost: the one request that has seen it, or SEVERAL


_Tail = tuple[bytes, int]  # a ghost tail: its ids, and the request that left it


class _Tails:
    """The ghost tails one lease left, as (parent, tail) in the order it left them; forgotten from the front. One
    that a later walk reached is a segment since, and is no longer its parent's child."""

    __slots__ = ("parents", "tails")

    def __init__(self):
        self.parents: deque[_Segment] = deque()
        self.tails: deque[_Tail] = deque()


@dataclass(frozen=True)
class Origins:
    """Where a batch's sequences come from, for admission (`PrefixCache.lease`): `requests[s]` the request of
    sequence s (an id >= 0 that the parts of one request share), `shared[s]` the length of that request's shared
    prefix (its rows below are the item's own)."""

    requests: np.ndarray  # (B,) int64
    shared: np.ndarray  # (B,) int64

    @classmethod
    def of(cls, jobs: Sequence[TaskJob]) -> Origins:
        """The origins of the concatenated sequences of `jobs` (each job's `origin` and `shared_len`)."""
        counts = [len(job.sequences) for job in jobs]
        return cls(np.repeat(np.array([job.origin for job in jobs], dtype=np.int64), counts),
                   np.repeat(np.array([job.shared_len for job in jobs], dtype=np.int64), counts))


_Step = tuple["_Segment", int, int, "_Segment | None", bytes]  # a walk's segment, its end, the cached prefix there,
# and the ids of its path


@dataclass
class CacheLease:
    """One batch's use of the cache, from lookup to commit (`PrefixCache.lease`)."""

    cache: PrefixCache
    sequences: list[bytes]  # (B,) each sequence's token ids, int32 bytes
    requests: list[int]  # (B,) each sequence's request (`Origins`)
    shared: list[int]  # (B,) the shared prefix of each sequence's request
    roots: list[_Segment]  # (B,) each sequence's scope's root
    matched: np.ndarray  # (B,) int64 leading tokens of each sequence whose rows are cached
    tips: list[_Segment | None]  # (B,) the segment where each cached prefix ends (None: nothing cached)
    admitted: list[tuple[int, int, int]] = field(default_factory=list)  # (sequence, start, end) rows to cache
    pending: list[_Segment] = field(default_factory=list)  # the segment of each admitted range
    refills: dict[_Segment, int] = field(default_factory=dict)  # hybrid: resident segments without an end state,
    # each with the first sequence that computes its rows
    tails: _Tails = field(default_factory=_Tails)  # the ghost tails its walks left
    hits: int = 0
    committed: bool = False

    @property
    def one_tree(self) -> bool:
        """Every sequence walks one scope's tree: equal histories have equal cached prefixes."""
        return all(root is self.roots[0] for root in self.roots)

    @property
    def admitted_rows(self) -> int:
        return sum(segment.size for segment in self.pending)

    def past(self, lengths: np.ndarray) -> CachedPrefix | None:
        """The cached rows of the first `lengths[s]` tokens of each sequence s (at most `matched[s]`; less where
        the forward computes a cached row anyway), or None when no sequence reads any. Each distinct (tip, length)
        is followed up the tree once: the 1,000 sequences of a rerank behind one cached prompt are one path. A
        path's segments that lie back to back in the cached rows are one range (a prompt cached as a template and a
        query below it is one past block for the forward, not two: each is a pass over all the batch's queries)."""
        self.hits = int(lengths.sum())
        if not self.hits:
            return None
        reads = np.flatnonzero(lengths)  # (S,) sequences that read the cache
        paths: dict[tuple[_Segment, int], int] = {}
        which = np.array([paths.setdefault((self.tips[s], end), len(paths))
                          for s, end in zip(reads.tolist(), lengths[reads].tolist())], dtype=np.int64)  # (S,)
        used: dict[_Segment, int] = {}
        ranges: list[tuple[_Segment, int]] = []  # (segment, rows) of each path, root to leaf, path after path
        counts = np.zeros(len(paths), dtype=np.int64)  # (P,) ranges of each path
        for i, (tip, end) in enumerate(paths):
            path = _cached_path(tip, end)
            for segment, rows in path:
                used[segment] = max(used.get(segment, 0), rows)
            ranges += path
            counts[i] = len(path)
        offsets = dict(zip(used, np.cumsum([0, *used.values()]).tolist()))
        starts = np.array([offsets[segment] for segment, _ in ranges], dtype=np.int64)  # (R,)
        ends = starts + np.array([rows for _, rows in ranges], dtype=np.int64)  # (R,)
        starts, ends, counts = _joined(starts, ends, counts)
        pairs = concat_ranges(np.cumsum(counts)[which] - counts[which], counts[which])  # (T,) sequence by sequence
        per_sequence = np.zeros(len(self.roots), dtype=np.int64)  # (B,)
        per_sequence[reads] = counts[which]
        pair_cu = np.concatenate([[0], np.cumsum(per_sequence)])  # (B+1,)
        past = CachedPrefix([(segment.kv, segment.states, rows) for segment, rows in used.items()],
                            pair_cu, starts[pairs], ends[pairs])
        if self.cache.shape.ends is not None:
            self._end_states(past, reads, lengths)
        return past

    def _end_states(self, past: CachedPrefix, reads: np.ndarray, lengths: np.ndarray) -> None:
        """The recurrent state where each sequence of `reads` that computes rows after its cached prefix continues:
        the end of a segment (the walk and `state_boundary` stop only at ends that have one)."""
        ends: dict[_Segment, int] = {}
        past.end_of_sequence = np.full(len(self.roots), -1, dtype=np.int64)
        for s in reads.tolist():
            end = int(lengths[s])
            if end == len(self.sequences[s]) >> 2:
                continue
            segment = _segment_ending(self.tips[s], end)
            past.end_of_sequence[s] = ends.setdefault(segment, len(ends))
        if ends:
            past.end_states = torch.stack([segment.end[0] for segment in ends], dim=1)  # (layers, P, Hv, Dk, Dv)
            past.end_tails = torch.stack([segment.end[1] for segment in ends], dim=1)  # (layers, P, kernel - 1, C)

    def state_boundary(self, s: int, length: int) -> int:
        """The longest prefix of sequence `s`, at most `length` tokens of its cached prefix, that a hybrid model can
        continue: its whole cached prefix, or the end of a segment on its path with an end state (0: none)."""
        if length == self.matched[s] or self.cache.shape.ends is None:
            return length
        best, segment = 0, self.tips[s]
        while segment is not None and segment.parent is not None:
            end = segment.depth + segment.size
            if end <= length and segment.end is not None:
                best = max(best, end)
            segment = segment.parent
        return best

    def ends(self) -> list[tuple[int, int]]:
        """Hybrid models: (sequence, position of the last token) of each segment end whose recurrent state the
        batch keeps: the admitted segments', then the refilled ones'."""
        admitted = [(s, end - 1) for s, _, end in self.admitted]
        return admitted + [(s, segment.depth + segment.size - 1) for segment, s in self.refills.items()]

    def keep(self, rows: torch.Tensor, end_rows: np.ndarray | None = None) -> KeptRows:
        """Buffers for the admitted rows, which are the computed rows `rows` (A,) in admission order, and (hybrid
        models) for the states after `end_rows` (E,), as `ends` lists them."""
        shape = self.cache.shape
        kept = KeptRows(rows, shape.kv(rows.shape[0]), shape.states(rows.shape[0]))
        if shape.ends is not None:
            kept.end_rows = end_rows
            kept.end_states, kept.end_tails = shape.ends.states(len(end_rows)), shape.ends.tails(len(end_rows))
        return kept

    def commit(self, kept: KeptRows | None) -> None:
        """The admitted rows, their K/V and states filled by the forward, become cached (`kept` None: none)."""
        with self.cache._tree_lock:
            self.cache._fill(self, kept)
            self.committed = True


class PrefixCache:
    """The tree, its budget and its counters (module docstring); `lease` is the one way in."""

    def __init__(self, shape: RowShape, budget_bytes: int, ghost_tokens: int | None = None,
                 min_leaf_rows: int = MIN_LEAF_ROWS):
        if budget_bytes < shape.bytes:
            raise ValueError(f"a prefix cache of {budget_bytes} bytes holds no row ({shape.bytes} bytes each): "
                             f"give at least one row, or no cache at all (prefix_cache_bytes 0)")
        self.shape, self.min_leaf_rows = shape, min_leaf_rows
        self.ghost_limit = GHOST_FACTOR * (budget_bytes // shape.bytes) if ghost_tokens is None else ghost_tokens
        self._lease_lock = threading.Lock()  # one lease at a time, from lookup to commit
        self._tree_lock = threading.Lock()  # held while the tree changes, and while `cached_length` reads it
        self._stats = PrefixCacheStats(budget_bytes)
        self._roots: dict[Hashable, _Segment] = {}
        self._resident: OrderedDict[_Segment, None] = OrderedDict()  # least recent first, after descendants
        self._ghosts: OrderedDict[_Segment | _Tails, None] = OrderedDict()  # the same order among ghosts
        self._tick = 0
        self._touched: set[_Segment] = set()
        self._unread: OrderedDict[_Segment, None] = OrderedDict()  # the resident segments not read back, in the
        # same order
        self._read_rows = 0  # rows of the resident segments read back
        self._protected_rows = PROTECTED_SHARE * self.budget_rows  # rows read back kept before others
        self._anonymous = SEVERAL - 1  # the next request id of a sequence given no origin (counting down)

    @property
    def budget_bytes(self) -> int:
        return self._stats.budget_bytes

    @property
    def budget_rows(self) -> int:
        """The rows the budget holds."""
        return self.budget_bytes // self.shape.bytes

    def stats(self) -> PrefixCacheStats:
        return replace(self._stats, segments=len(self._resident))

    def clear(self) -> None:
        """Forget every segment and reset the counters: a cold cache."""
        with self._lease_lock, self._tree_lock:
            self._stats = PrefixCacheStats(self.budget_bytes)
            self._roots.clear()
            self._resident.clear()
            self._unread.clear()
            self._ghosts.clear()
            self._read_rows = 0
            self._protected_rows = PROTECTED_SHARE * self.budget_rows

    @contextmanager
    def lease(self, input_ids: np.ndarray, cu_seqlens: np.ndarray, scopes: Sequence[Hashable] | None = None,
              origins: Origins | None = None) -> Iterator[CacheLease]:
        """Look the batch's sequences up (`input_ids` (N,), `cu_seqlens` (B+1,), `scopes` one per sequence or
        None), then admit what is seen the second time (all walks first, so that no admission evicts rows a later
        sequence of the batch reads), and hold the cache until the lease ends; admitted rows not committed by
        then go back to ghosts. `origins`: each sequence's request and its shared prefix, below which a row is
        admitted only once two requests have seen it (module docstring); None: each sequence a request of its own
        (every second sighting admits)."""
        num_sequences = int(cu_seqlens.shape[0]) - 1
        if scopes is not None and len(scopes) != num_sequences:
            raise ValueError(f"scopes has {len(scopes)} entries for {num_sequences} sequences: give one per "
                             f"sequence, or None")
        if origins is not None and not (len(origins.requests) == len(origins.shared) == num_sequences
                                        and (origins.requests >= 0).all()):
            raise ValueError(f"origins name {len(origins.requests)} requests (ids >= 0) and {len(origins.shared)} "
                             f"shared lengths for {num_sequences} sequences: give one of each per sequence")
        with self._lease_lock:
            if origins is None:
                requests = list(range(self._anonymous, self._anonymous - num_sequences, -1))
                shared = [0] * num_sequences
                self._anonymous -= num_sequences
            else:
                requests, shared = origins.requests.tolist(), origins.shared.tolist()
            with self._tree_lock:
                self._tick += 1
                roots = ([self._root(None)] * num_sequences if scopes is None
                         else [self._root(scope) for scope in scopes])
            tokens, bounds = input_ids.astype(np.int32).tobytes(), (4 * cu_seqlens).tolist()
            sequences = [tokens[start:end] for start, end in zip(bounds, bounds[1:])]
            lease = CacheLease(self, sequences, requests, shared, roots, np.zeros(num_sequences, dtype=np.int64),
                               [None] * num_sequences)
            try:
                with self._tree_lock:
                    self._ghosts[lease.tails] = None  # before every segment the lease walks: parents after tails
                    seen: dict[_Segment, int] = {}  # ghosts walked, each with the first sequence that walked it
                    trail: list[_Step] = []
                    matched = []
                    for s in range(num_sequences):  # all walked before any eviction
                        if not s or roots[s] is not roots[s - 1]:
                            trail = [(roots[s], 0, 0, None, b"")]
                        length, lease.tips[s] = self._walk(lease, s, seen, trail)
                        matched.append(length)
                    lease.matched[:] = matched
                    self._admit(lease, seen)
                    self._stats.lookups += num_sequences
                    self._stats.lookup_tokens += int(cu_seqlens[-1] - cu_seqlens[0])
                yield lease
            finally:
                with self._tree_lock:
                    self._close(lease)

    def cached_length(self, ids: np.ndarray, scope: Hashable = None) -> int:
        """Leading tokens of the token ids `ids` whose rows `scope`'s tree holds or the running lease is adding;
        0 when the tree is changing at this moment. An estimate for planning (the next batch's lease may find less:
        its own admissions, or the running one's, can evict what was there); it neither waits nor counts as a use."""
        if not self._tree_lock.acquire(blocking=False):
            return 0
        try:
            seq = ids.astype(np.int32).tobytes()
            node, p, length = self._roots.get(scope), 0, len(seq) >> 2
            while node is not None and p < length:
                child = node.children.get(seq[4 * p:4 * p + 4])
                if child is None or child.__class__ is tuple or child.state == GHOST:
                    break
                common = _common_length(child.ids, seq, p)
                p += common
                node = child if common == child.size else None
            return p
        finally:
            self._tree_lock.release()

    def _root(self, scope: Hashable) -> _Segment:
        if scope not in self._roots:
            self._roots[scope] = _Segment(b"", 0, None, RESIDENT, scope)
        return self._roots[scope]

    def _walk(self, lease: CacheLease, s: int, seen: dict[_Segment, int],
              trail: list[_Step]) -> tuple[int, _Segment | None]:
        """Walk sequence `s` down its tree, splitting where it leaves a segment, and remember its unseen tail as a
        ghost; adds the ghosts on its path to `seen`, each marked seen by its request, and returns its cached
        prefix (length, tip).

        `trail` holds the previous sequence's walk: this one starts from the deepest segment of it whose path it
        shares (one C comparison a step back), so the prompt and query of a rerank's 1,000 documents are walked
        once, not 1,000 times (the ghosts it steps over marked seen by this sequence's request, where that
        differs)."""
        seq, request = lease.sequences[s], lease.requests[s]
        length = len(seq) >> 2
        while not seq.startswith(trail[-1][4]):
            trail.pop()
        if s and request != lease.requests[s - 1]:
            for segment, *_ in trail:
                if segment.state == GHOST and segment.request != request:
                    segment.request = SEVERAL
        node, p, matched, tip, _ = trail[-1]
        while p < length:
            first = seq[4 * p:4 * p + 4]
            child = node.children.get(first)
            if child is None:
                break
            if child.__class__ is tuple:  # a ghost tail, reached again
                child = self._promote(node, first, child, p)
            common = _common_length(child.ids, seq, p)
            if common < child.size and (p + common < length or child.state != RESIDENT):
                child = self._split(child, common)  # the lower part is not on this path: its recency stays
            else:
                self._touch(child)
            if child.state != RESIDENT:
                seen.setdefault(child, s)
                if child.request != request:
                    child.request = SEVERAL
            elif matched == p and self._continues(child, common, p + common == length):
                matched, tip = p + common, child
                self._mark_read(child)
            elif matched == p and common == child.size:  # hybrid: no state at its end; this batch computes it
                lease.refills.setdefault(child, s)
            p += common
            node = child
            if common < child.size:  # the sequence ends inside a resident segment
                break
            trail.append((node, p, matched, tip, seq[:4 * p]))
        if p < length:  # the walk left the tree at `first`: the rest is a ghost tail
            tail = (seq[4 * p:], request)
            if node.children is _LEAF:
                node.children = {}
            node.children[first] = tail
            lease.tails.parents.append(node)
            lease.tails.tails.append(tail)
            self._stats.ghost_tokens += length - p
        return matched, tip

    def _promote(self, parent: _Segment, first: bytes, tail: _Tail, depth: int) -> _Segment:
        """The ghost tail `tail` (first id `first`, at `depth`) of `parent` becomes a ghost segment, the most
        recent (its `_Tails` entry is skipped when forgotten)."""
        segment = _Segment(tail[0], depth, parent, GHOST, request=tail[1])
        parent.children[first] = segment
        self._ghosts[segment] = None
        return segment

    def _continues(self, segment: _Segment, common: int, ends_here: bool) -> bool:
        """Whether a sequence whose cached prefix reached `segment` and covers `common` of its rows (ending there:
        `ends_here`) reads them: always, but for a hybrid model only where it can continue (the module docstring)."""
        return self.shape.ends is None or ends_here or (common == segment.size and segment.end is not None)

    def _admit(self, lease: CacheLease, seen: dict[_Segment, int]) -> None:
        """Admit the ghosts the batch's walks passed through (seen before: by an earlier batch or an earlier
        sequence of this one; whole segments, as the walks split them) while the budget can make room, parents
        first, a segment only below cached or admitted rows. One range per segment, of the first sequence that
        walked it: no path is walked again."""
        for segment in [s for s in lease.refills if not self._reserve_bytes(self._end_bytes)]:
            del lease.refills[segment]
        for segment in self._worth_a_copy(lease, seen):
            if segment.evicted_read is not None:
                self._adapt(segment)
            if segment.parent.state == GHOST or not self._reserve(segment.size):
                continue
            del self._ghosts[segment]
            self._stats.ghost_tokens -= segment.size
            segment.state = PENDING
            lease.admitted.append((seen[segment], segment.depth, segment.depth + segment.size))
            lease.pending.append(segment)

    def _worth_a_copy(self, lease: CacheLease, seen: dict[_Segment, int]) -> list[_Segment]:
        """The seen ghosts of at least `min_leaf_rows` rows that start inside the shared prefix of the first
        sequence that walked them or that two requests have seen, and those on the path to one (module docstring),
        parents first."""
        parents_first = sorted(seen, key=_depth)
        wanted: set[_Segment] = set()
        for segment in reversed(parents_first):
            if segment in wanted or (segment.size >= self.min_leaf_rows and (
                    segment.request == SEVERAL or segment.depth < lease.shared[seen[segment]])):
                wanted.update((segment, segment.parent))
        return [segment for segment in parents_first if segment in wanted]

    @property
    def _end_bytes(self) -> int:
        """Bytes of a segment's end state: 0 but for hybrid models."""
        return 0 if self.shape.ends is None else self.shape.ends.bytes

    def _reserve(self, rows: int) -> bool:
        """Count `rows` more rows (and their segment's end state) against the budget, evicting what this lease does
        not use; False if it can't."""
        return self._reserve_bytes(rows * self.shape.bytes + self._end_bytes)

    def _reserve_bytes(self, need: int) -> bool:
        """Count `need` more bytes against the budget, evicting what this lease does not use; False if it can't."""
        if need > self.budget_bytes:
            return False
        while self._stats.bytes + need > self.budget_bytes:
            victim = self._victim()
            if victim is None:
                return False
            self._evict(victim)
        self._stats.bytes += need
        return True

    def _victim(self) -> _Segment | None:
        """The least recently used segment this lease does not use and without cached segments below it: one never
        read back first while those read back hold at most the target's rows (module docstring)."""
        if self._read_rows <= self._protected_rows:
            return self._first_evictable(self._unread) or self._first_evictable(self._resident)
        return self._first_evictable(self._resident)

    def _first_evictable(self, order: OrderedDict[_Segment, None]) -> _Segment | None:
        """The first segment of `order` this lease does not use and without cached segments below it."""
        return next((seg for seg in order if seg.tick != self._tick and not _holds_rows_below(seg)), None)

    def _adapt(self, segment: _Segment) -> None:
        """A segment evicted earlier is seen again: had it been read, keep more rows read back; if not, fewer."""
        step = segment.size if segment.evicted_read else -segment.size
        self._protected_rows = min(max(self._protected_rows + step, 0), self.budget_rows)
        segment.evicted_read = None

    def _mark_read(self, segment: _Segment) -> None:
        if not segment.read:
            segment.read = True
            self._read_rows += segment.size
            del self._unread[segment]

    def _evict(self, segment: _Segment) -> None:
        """A resident segment without cached segments below it becomes a ghost."""
        del self._resident[segment]
        self._unread.pop(segment, None)
        segment.evicted_read = segment.read
        segment.request = SEVERAL  # admitted once: its next sighting admits it again
        if segment.read:
            segment.read = False
            self._read_rows -= segment.size
        self._stats.bytes -= segment.size * self.shape.bytes + (self._end_bytes if segment.end is not None else 0)
        segment.kv = segment.states = segment.end = None
        segment.state = GHOST
        self._ghosts[segment] = None
        self._stats.ghost_tokens += segment.size
        self._stats.evictions += 1
        self._stats.evicted_tokens += segment.size

    def _split(self, segment: _Segment, at: int) -> _Segment:
        """Cut `segment` after its first `at` rows; returns the upper part (a new segment), the lower keeps its
        children. A resident segment's K/V and states are copied into two tensors, so each part owns its memory."""
        upper = _Segment(segment.ids[:4 * at], segment.depth, segment.parent, segment.state, request=segment.request)
        upper.parent.children[upper.ids[:4]] = upper
        upper.children = {segment.ids[4 * at:4 * at + 4]: segment}
        upper.tick, upper.read, upper.evicted_read = segment.tick, segment.read, segment.evicted_read
        if segment.kv is not None:
            upper.kv, lower_kv = (part.clone(memory_format=torch.contiguous_format)
                                  for part in (segment.kv[:, :, :at], segment.kv[:, :, at:]))
            upper.states, lower_states = segment.states[:at].clone(), segment.states[at:].clone()
            segment.kv, segment.states = lower_kv, lower_states
        segment.ids, segment.size, segment.depth, segment.parent = segment.ids[4 * at:], segment.size - at, \
            segment.depth + at, upper
        if segment.state != PENDING:  # after the lower part, its descendant
            (self._resident if segment.state == RESIDENT else self._ghosts)[upper] = None
            if segment.state == RESIDENT and not segment.read:
                self._unread[upper] = None
        self._touch(upper)
        return upper

    def _touch(self, segment: _Segment) -> None:
        segment.tick = self._tick
        self._touched.add(segment)

    def _fill(self, lease: CacheLease, kept: KeptRows | None) -> None:
        """Pending segments take their rows of `kept` (copies, unless one segment takes them all). The copies are
        made first, so that a copy that fails (out of memory) leaves every admission pending, to be undone."""
        filled, at = [], 0
        for segment in lease.pending:
            kv, states = kept.kv[:, :, at:at + segment.size], kept.states[at:at + segment.size]
            whole = segment.size == kept.rows.shape[0]
            filled.append((segment, kv if whole else kv.clone(memory_format=torch.contiguous_format),
                           states if whole else states.clone()))
            at += segment.size
        ends = self._ends(lease, kept)
        for segment, kv, states in filled:
            segment.kv, segment.states, segment.state = kv, states, RESIDENT
            self._resident[segment] = None
            self._unread[segment] = None
            self._stats.inserted_tokens += segment.size
        for segment, end in ends.items():
            segment.end = end
        self._stats.hit_tokens += lease.hits

    def _ends(self, lease: CacheLease, kept: KeptRows | None) -> dict[_Segment, tuple[torch.Tensor, torch.Tensor]]:
        """Hybrid models: each admitted and refilled segment's end state, copied out of `kept` (in `lease.ends`
        order), so that each segment owns its memory."""
        if self.shape.ends is None or kept is None:
            return {}
        segments = lease.pending + list(lease.refills)
        return {segment: (kept.end_states[:, e].clone(), kept.end_tails[:, e].clone())
                for e, segment in enumerate(segments)}

    def _close(self, lease: CacheLease) -> None:
        """End a lease: admissions not committed go back to ghosts; what it walked becomes the most recently used
        (deepest first, so each segment stays after its descendants); the ghosts are trimmed to their limit."""
        if not lease.committed:
            for segment in lease.pending:
                segment.state = GHOST
                self._ghosts[segment] = None
                self._stats.bytes -= segment.size * self.shape.bytes + self._end_bytes
                self._stats.ghost_tokens += segment.size
            self._stats.bytes -= len(lease.refills) * self._end_bytes
        for segment in sorted(self._touched, key=lambda seg: seg.depth, reverse=True):
            recency = self._resident if segment.state == RESIDENT else self._ghosts
            recency.move_to_end(segment)
            if segment in self._unread:
                self._unread.move_to_end(segment)
        self._touched.clear()
        if not lease.tails.tails:
            del self._ghosts[lease.tails]
        while self._stats.ghost_tokens > self.ghost_limit:
            oldest = next(iter(self._ghosts))
            if oldest.__class__ is _Tails:
                self._forget_tails(oldest)
                continue
            del self._ghosts[oldest]
            self._stats.ghost_tokens -= oldest.size
            self._unlink(oldest.parent, oldest.ids[:4])

    def _forget_tails(self, tails: _Tails) -> None:
        """Forget the ghost tails of `tails` from the front, while there are more ghost tokens than the limit."""
        parents, ids, stats = tails.parents, tails.tails, self._stats
        while ids and stats.ghost_tokens > self.ghost_limit:
            parent, tail = parents.popleft(), ids.popleft()
            first = tail[0][:4]
            if parent.children.get(first) is tail:  # else reached again: a segment since
                stats.ghost_tokens -= len(tail[0]) >> 2
                self._unlink(parent, first)
        if not ids:
            del self._ghosts[tails]

    def _unlink(self, parent: _Segment, first: bytes) -> None:
        """Remove the ghost child of `parent` whose first id is `first`, which has no children, from the tree (and
        its scope's root when that empties)."""
        del parent.children[first]
        if parent.parent is None and not parent.children:
            del self._roots[parent.scope]


def _common_length(ids: bytes, seq: bytes, p: int) -> int:
    """Leading tokens `ids` (a segment, whose first id matched) shares with `seq` from token `p`: one C call
    when they agree (the common case); where they part, a search of C calls from the start, doubling then halving
    (one call for two documents that share only their first word, the most common parting under a rerank's query;
    a few microseconds for a 100-token segment, a third of numpy's)."""
    size = min(len(ids), len(seq) - 4 * p)
    if seq.startswith(ids if size == len(ids) else ids[:size], 4 * p):
        return size >> 2
    agree, differ = 1, size >> 2  # tokens known to agree, and a count known not to
    while 2 * agree < differ:
        if not seq.startswith(ids[:8 * agree], 4 * p):
            differ = 2 * agree
            break
        agree *= 2
    while differ - agree > 1:
        middle = (agree + differ) >> 1
        if seq.startswith(ids[:4 * middle], 4 * p):
            agree = middle
        else:
            differ = middle
    return agree


def _cached_path(tip: _Segment, end: int) -> list[tuple[_Segment, int]]:
    """(segment, its rows on the path) of the first `end` tokens of the path down to `tip`, root to leaf."""
    path = []
    while tip.parent is not None:
        if tip.depth < end:
            path.append((tip, min(tip.size, end - tip.depth)))
        tip = tip.parent
    return path[::-1]


def _joined(starts: np.ndarray, ends: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Ranges `starts`/`ends` (R,), `counts[p]` of them per path, with each run of ranges of one path that lie back
    to back (a range starting where the one before it ends) joined into one: (starts, ends, counts) again."""
    first = np.cumsum(counts) - counts  # (P,) each path's first range
    opens = np.ones(starts.shape[0], dtype=bool)  # (R,) a range that starts a run
    opens[1:] = starts[1:] != ends[:-1]
    opens[first] = True
    heads = np.flatnonzero(opens)  # (R',)
    tails = np.append(heads[1:], starts.shape[0]) - 1  # (R',) the last range of each run
    return starts[heads], ends[tails], np.add.reduceat(opens, first).astype(np.int64)


def _segment_ending(tip: _Segment, end: int) -> _Segment:
    """The segment on the path down to `tip` that ends after `end` tokens and holds an end state."""
    segment = tip
    while segment.depth + segment.size != end or segment.end is None:
        segment = segment.parent
    return segment


def _depth(segment: _Segment) -> int:
    return segment.depth


def _holds_rows_below(segment: _Segment) -> bool:
    return any(child.__class__ is not tuple and child.state != GHOST for child in segment.children.values())
