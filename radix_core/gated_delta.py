"""Gated DeltaNet (Qwen3.5, Qwen3-Next linear attention) along the trie: each chain of rows runs once, from the
state its parent chain ended with.

A Gated DeltaNet layer is a recurrence along a sequence: a short causal convolution over the projected q/k/v
(`kernel` rows: the row and the `kernel - 1` before it), then the gated delta rule, whose state
(heads, Dk, Dv) carries everything before a row. Over a batch laid out as a forest of rows (each row's parent is
the row of the previous token of its sequences: the trie's in `mlp` and `full`, each sequence a chain of its own
in `off`) the recurrence of every root-to-leaf path is a recurrence along the forest:

* **Convolution**: row r reads the rows of its `kernel - 1` ancestors (a zero row where the path is shorter),
  gathered once per batch (`RecurrencePlan.window`), so a child reads its parent path's tail wherever it lies.
* **Chains**: maximal runs of rows in which each row's parent is the row before it, split after every branching
  row (the segments of `radix_core.cascade`). A chain's first row's parent is the last row of its parent chain,
  so a chain starts from its parent chain's final state. Chains of one depth (ancestor chains above them) are
  independent: one call of the chunked rule per depth and per number of the rule's 64-row chunks a chain needs
  (the rule pads each chain to whole chunks anyway, so a 1-token chain next to a 300-token one costs one chunk,
  not five), the chains of a call padded to its longest with steps that leave the state as it is (k = v = 0,
  beta = 0, g = 0: decay 1, no update), `initial_state` per chain. Final states are kept only for chains with
  children (and at cuts).

This is the function transformers computes per sequence, up to float reassociation (its chunks of 64 start at
position 0, ours at each chain's first row). The rule itself is the family's own `torch_chunk_gated_delta_rule`
(of its modeling module): the torch reference, fp32 inside, or, where flash-linear-attention imports (the `gpu`
extra, CUDA), its chunked Triton kernel, to which transformers dispatches the same call (batched chains,
`initial_state`, `output_final_state`).

With the prefix cache (`radix_core.cached_rows.EndShape`) a root row may continue a cached path: its chain starts
from the cached state (`past` sources) and its window reaches into the cached convolution tail (rows after the
zero row). Chains also end after the rows whose state enters the cache (`cuts`), and the plan hands those states
and tails back.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

CHUNK = 64  # the rows of the rule's chunks (`torch_chunk_gated_delta_rule`'s default `chunk_size`)


@dataclass
class ChainLevel:
    """One call of the rule: chains of one depth and one number of chunks, padded to the longest; on the engine's
    device. Parent chains' final states are in a store of slots, one per chain with children."""

    rows: torch.Tensor  # (S, L) int64 rows of each chain, padded with R (the zero row)
    valid: torch.Tensor  # (S, L) bool the real steps
    parent_slots: torch.Tensor | None  # (S,) int64 each chain's parent chain's slot; None at depth 0
    sources: torch.Tensor | None = None  # depth 0 with cached paths: (S,) int64 cached state of each, -1 none
    stored: torch.Tensor | None = None  # (c,) int64 chains of this call with children
    slots: torch.Tensor | None = None  # (c,) int64 their slots
    cut_chains: torch.Tensor | None = None  # (c,) int64 chains of this call that end at a cut row
    cut_order: torch.Tensor | None = None  # (c,) int64 their cut rows' places in `cuts`


@dataclass
class RecurrencePlan:
    """What every recurrent layer of one batch reads: the convolution windows and the chains by depth."""

    num_rows: int
    window: torch.Tensor  # (R, kernel) int64 rows of each row's window, oldest first: R is the zero row, R + 1 +
    # p (kernel - 1) + i the cached tail p's row i
    levels: list[ChainLevel]  # the calls, shallowest depth first
    num_slots: int = 0  # chains with children
    cuts: torch.Tensor | None = None  # (E,) int64 rows whose state and tail enter the cache


def row_parents(token_rows: np.ndarray, cu_seqlens: np.ndarray, num_rows: int,
                past_end: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(parent, source), (R,) int64 each, of the computed rows `0..R`, from the row of each token (N,) (a row >= R
    is cached): the row of each row's previous token, -1 at a sequence start or where that token is cached; and
    there the cached state it continues (`past_end` of its sequence (B,)), else -1. Equal histories share one row,
    so duplicates agree."""
    parent = np.full(num_rows, -1, dtype=np.int64)
    source = np.full(num_rows, -1, dtype=np.int64)
    inner = np.ones(token_rows.shape[0], dtype=bool)
    inner[cu_seqlens[:-1]] = False  # (N,) tokens with a previous token
    where = np.flatnonzero(inner & (token_rows < num_rows))  # computed tokens with a previous token
    previous = token_rows[where - 1]
    cached = previous >= num_rows
    parent[token_rows[where[~cached]]] = previous[~cached]
    if past_end is not None and cached.any():
        sequence = np.searchsorted(cu_seqlens, where[cached], side="right") - 1
        source[token_rows[where[cached]]] = past_end[sequence]
    return parent, source


def recurrence_plan(parent: np.ndarray, kernel: int, device: torch.device, source: np.ndarray | None = None,
                    cuts: np.ndarray | None = None) -> RecurrencePlan:
    """The plan over the forest of rows whose parents are `parent` (R,), each parent before its children; roots
    continue the cached state `source` (R,) (-1: none); chains end after the rows `cuts` (E,)."""
    num_rows = parent.shape[0]
    source = np.full(num_rows, -1, dtype=np.int64) if source is None else source
    window = np.empty((num_rows, kernel), dtype=np.int64)  # (R, kernel)
    ancestor = np.arange(num_rows)  # the window's row at step j, -1 past a root
    tail = np.full(num_rows, -1, dtype=np.int64)  # the cached tail read past a root, -1 none
    back = np.zeros(num_rows, dtype=np.int64)  # steps back into that tail
    for j in range(kernel - 1, -1, -1):  # the row itself last, its parent before it, ...
        in_tail = (ancestor < 0) & (tail >= 0) & (back >= 1)
        window[:, j] = np.where(ancestor >= 0, ancestor,
                                np.where(in_tail, num_rows + 1 + tail * (kernel - 1) + kernel - 1 - back, num_rows))
        back = np.where(in_tail, back + 1, back)
        at_root = ancestor >= 0
        up = np.where(at_root, parent[np.maximum(ancestor, 0)], -1)
        enters = at_root & (up < 0)
        tail = np.where(enters, source[np.maximum(ancestor, 0)], tail)
        back = np.where(enters, 1, back)
        ancestor = up
    cuts = np.zeros(0, dtype=np.int64) if cuts is None else cuts
    levels, num_slots = _chain_levels(parent, source, cuts, device)
    return RecurrencePlan(num_rows, torch.from_numpy(window).to(device), levels, num_slots,
                          torch.from_numpy(cuts).to(device) if cuts.size else None)


def _chain_levels(parent: np.ndarray, source: np.ndarray, cuts: np.ndarray,
                  device: torch.device) -> tuple[list[ChainLevel], int]:
    """The calls over the chains of the forest (module docstring), by depth, shallowest first, and the number of
    state slots (chains with children)."""
    num_rows = parent.shape[0]
    if num_rows == 0:
        return [], 0
    children = np.bincount(parent[parent >= 0], minlength=num_rows)  # (R,)
    rows = np.arange(num_rows)
    cut = np.zeros(num_rows, dtype=bool)
    cut[cuts] = True
    starts = parent != rows - 1  # roots and rows not right after their parent
    starts[0] = True
    starts[1:] |= (children[:-1] > 1) | cut[:-1]  # the first row after a branching row or a cut
    chain_start = np.flatnonzero(starts)  # (S,)
    lengths = np.diff(np.append(chain_start, num_rows))  # (S,)
    chain_of_row = np.cumsum(starts) - 1  # (R,)
    first_parent = parent[chain_start]  # (S,) the last row of the parent chain, or -1
    chain_parent = np.where(first_parent >= 0, chain_of_row[np.maximum(first_parent, 0)], -1)  # (S,)
    depth = np.zeros(chain_start.shape[0], dtype=np.int64)  # (S,)
    up = chain_parent
    while (up >= 0).any():
        depth += up >= 0
        up = np.where(up >= 0, chain_parent[np.maximum(up, 0)], -1)
    has_children = np.zeros(chain_start.shape[0], dtype=bool)
    has_children[chain_parent[chain_parent >= 0]] = True
    slot = np.where(has_children, np.cumsum(has_children) - 1, -1)  # (S,)
    chain_end = chain_start + lengths - 1  # (S,) last rows
    cut_order = np.full(num_rows, -1, dtype=np.int64)
    cut_order[cuts] = np.arange(cuts.shape[0])
    chunks = -(-lengths // CHUNK)  # (S,)
    order = np.lexsort((chunks, depth))  # (S,) by depth, then by chunks
    groups = np.flatnonzero(np.diff(depth[order]) | np.diff(chunks[order])) + 1
    levels = [_call(chains, d, chain_start, lengths, chain_parent, slot, source, cut, chain_end, cut_order, num_rows,
                    device) for chains in np.split(order, groups) for d in [int(depth[chains[0]])]]
    return levels, int(has_children.sum())


def _call(chains: np.ndarray, depth: int, chain_start: np.ndarray, lengths: np.ndarray, chain_parent: np.ndarray,
          slot: np.ndarray, source: np.ndarray, cut: np.ndarray, chain_end: np.ndarray, cut_order: np.ndarray,
          num_rows: int, device: torch.device) -> ChainLevel:
    """The call over `chains` (S_c,), all of depth `depth`."""
    upload = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    width = int(lengths[chains].max())
    steps = np.arange(width)  # (L,)
    valid = steps[None, :] < lengths[chains, None]  # (S_c, L)
    padded = np.where(valid, chain_start[chains, None] + steps[None, :], num_rows)  # (S_c, L)
    call = ChainLevel(upload(padded), upload(valid), None if depth == 0 else upload(slot[chain_parent[chains]]))
    cached = source[chain_start[chains]]  # (S_c,) roots' cached states, -1 none (always -1 below depth 0)
    if (cached >= 0).any():
        call.sources = upload(cached)
    stored = np.flatnonzero(slot[chains] >= 0)  # (c,) places in the call
    if stored.size:
        call.stored, call.slots = upload(stored), upload(slot[chains[stored]])
    ending = np.flatnonzero(cut[chain_end[chains]])  # (c,) places in the call
    if ending.size:
        call.cut_chains, call.cut_order = upload(ending), upload(cut_order[chain_end[chains[ending]]])
    return call


@dataclass
class PastEnds:
    """One recurrent layer's cached segment ends that a batch continues (`radix_core.cached_rows.EndShape`)."""

    states: torch.Tensor  # (P, Hv, Dk, Dv) float32
    tails: torch.Tensor  # (P, kernel - 1, C) the convolution's last inputs, oldest first


def causal_conv_along_paths(x: torch.Tensor, conv: nn.Conv1d, activation: str, plan: RecurrencePlan,
                            past: PastEnds | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The depthwise causal convolution of `x` (R, C) along each row's path (into `past`'s tails above a root that
    continues one), then `activation`: (R, C) in x's dtype, as transformers' `causal_conv1d_fn` computes it (the
    weights' dtype inside), one gathered window column at a time; and the convolution tails at the plan's cuts
    (E, kernel - 1, C), None without cuts."""
    weight = conv.weight[:, 0]  # (C, kernel)
    parts = [x, x.new_zeros(1, x.shape[1])] + ([] if past is None else [past.tails.reshape(-1, x.shape[1])])
    rows = torch.cat(parts)  # (R + 1 + P (kernel - 1), C): rows, the zero row, the cached tails
    padded = rows.to(weight.dtype)
    out = padded.index_select(0, plan.window[:, 0]) * weight[:, 0]  # (R, C)
    for j in range(1, weight.shape[1]):
        out += padded.index_select(0, plan.window[:, j]) * weight[:, j]
    if conv.bias is not None:
        out += conv.bias
    tails = None if plan.cuts is None else rows[plan.window[plan.cuts, 1:]]  # (E, kernel - 1, C)
    return ACT2FN[activation](out).to(x.dtype), tails


def gated_delta_along_chains(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, plan: RecurrencePlan,
                             past: PastEnds | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule (q/k L2-normed inside, as the layer asks) over the plan's chains, one call per depth,
    roots continuing `past`'s states where the plan says: q, k (R, Hk, Dk), v (R, Hv, Dv), g, beta (R, Hv) ->
    (R, Hv, Dv) in v's dtype, and the states after the plan's cuts (E, Hv, Dk, Dv) float32 (None without cuts)."""
    rule = sys.modules[type(module).__module__].torch_chunk_gated_delta_rule
    padded = [torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in (q, k, v, g, beta)]  # (R + 1, ...) each
    out = v.new_empty(plan.num_rows + 1, *v.shape[1:])  # (R + 1, Hv, Dv); the last row takes the padding
    state = (v.shape[1], q.shape[2], v.shape[2])  # (Hv, Dk, Dv)
    store = q.new_empty(plan.num_slots, *state, dtype=torch.float32)  # parent chains' final states
    cut_states = None if plan.cuts is None else q.new_empty(plan.cuts.shape[0], *state, dtype=torch.float32)
    for level in plan.levels:
        steps = [t[level.rows] for t in padded]  # (S, L, ...) each
        initial = None if level.parent_slots is None else store.index_select(0, level.parent_slots)  # (S, Hv, ...)
        if level.sources is not None:  # roots continuing cached paths; the others start from zeros
            known = torch.cat([past.states, past.states.new_zeros(1, *past.states.shape[1:])])  # (P + 1, ...)
            initial = known[torch.where(level.sources >= 0, level.sources, past.states.shape[0])]
        level_out, final = rule(*steps[:3], g=steps[3], beta=steps[4], initial_state=initial,
                                output_final_state=True, use_qk_l2norm_in_kernel=True)  # (S, L, Hv, Dv)
        out[level.rows[level.valid]] = level_out[level.valid]
        if level.stored is not None:
            store[level.slots] = final.index_select(0, level.stored)
        if level.cut_chains is not None:
            cut_states[level.cut_order] = final.index_select(0, level.cut_chains)
    return out[:plan.num_rows], cut_states


def gated_delta_block(module: nn.Module, x: torch.Tensor, plan: RecurrencePlan,
                      past: PastEnds | None = None) -> tuple[torch.Tensor, PastEnds | None]:
    """A Gated DeltaNet layer (Qwen3.5's `Qwen3_5GatedDeltaNet`, Qwen3-Next's) on rows `x` (R, hidden) normed:
    projections, convolution along paths, the rule along chains, gated RMSNorm, output projection -> (R, hidden),
    and the states and tails at the plan's cuts (None without cuts)."""
    rows = x.shape[0]
    mixed, z, b, a = _projections(module, x)  # (R, 2 Kd + Vd), (R, Hv, Dv), (R, Hv), (R, Hv)
    mixed, tails = causal_conv_along_paths(mixed, module.conv1d, module.activation, plan, past)
    q, k, v = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    q = q.reshape(rows, -1, module.head_k_dim)  # (R, Hk, Dk)
    k = k.reshape(rows, -1, module.head_k_dim)  # (R, Hk, Dk)
    v = v.reshape(rows, -1, module.head_v_dim)  # (R, Hv, Dv)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)  # (R, Hv) float32
    out, states = gated_delta_along_chains(module, q, k, v, g, beta, plan, past)  # (R, Hv, Dv)
    out = module.norm(out.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))  # (R * Hv, Dv)
    return module.out_proj(out.reshape(rows, -1)), None if states is None else PastEnds(states, tails)


def _projections(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(mixed q/k/v before the convolution (R, 2 Kd + Vd), z (R, Hv, Dv), b (R, Hv), a (R, Hv)): Qwen3.5 projects
    each separately; Qwen3-Next projects q/k/v/z and b/a together, grouped by key head."""
    rows = x.shape[0]
    if hasattr(module, "in_proj_qkvz"):  # Qwen3-Next
        q, k, v, z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(x[None]), module.in_proj_ba(x[None]))
        mixed = torch.cat([t.reshape(rows, -1) for t in (q, k, v)], dim=-1)  # (R, 2 Kd + Vd)
        return mixed, z[0], b[0], a[0]
    z = module.in_proj_z(x).view(rows, -1, module.head_v_dim)  # (R, Hv, Dv)
    return module.in_proj_qkv(x), z, module.in_proj_b(x), module.in_proj_a(x)
