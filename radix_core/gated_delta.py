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
  independent: one call of the chunked rule per depth, the chains padded to the depth's longest with steps that
  leave the state as it is (k = v = 0, beta = 0, g = 0: decay 1, no update), `initial_state` per chain.

This is the function transformers computes per sequence, up to float reassociation (its chunks of 64 start at
position 0, ours at each chain's first row). The rule itself is the family's own torch reference
(`torch_chunk_gated_delta_rule` of its modeling module), fp32 inside.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN


@dataclass
class ChainLevel:
    """The chains of one depth, padded to the longest; on the engine's device."""

    rows: torch.Tensor  # (S, L) int64 rows of each chain, padded with R (the zero row)
    valid: torch.Tensor  # (S, L) bool the real steps
    parents: torch.Tensor | None  # (S,) int64 each chain's parent chain in the previous level; None at depth 0


@dataclass
class RecurrencePlan:
    """What every recurrent layer of one batch reads: the convolution windows and the chains by depth."""

    num_rows: int
    window: torch.Tensor  # (R, kernel) int64 rows of each row's window, oldest first, R (the zero row) above a root
    levels: list[ChainLevel]


def row_parents(token_rows: np.ndarray, cu_seqlens: np.ndarray, num_rows: int) -> np.ndarray:
    """(R,) int64 row of each row's previous token (-1 at a sequence start), from the row of each token (N,);
    equal histories share one row, so duplicates agree."""
    parent = np.full(num_rows, -1, dtype=np.int64)
    inner = np.ones(token_rows.shape[0], dtype=bool)
    inner[cu_seqlens[:-1]] = False  # (N,) tokens with a previous token
    where = np.flatnonzero(inner)
    parent[token_rows[where]] = token_rows[where - 1]
    return parent


def recurrence_plan(parent: np.ndarray, kernel: int, device: torch.device) -> RecurrencePlan:
    """The plan over the forest of rows whose parents are `parent` (R,), each parent before its children."""
    num_rows = parent.shape[0]
    window = np.empty((num_rows, kernel), dtype=np.int64)  # (R, kernel)
    ancestor = np.arange(num_rows)
    for j in range(kernel - 1, -1, -1):  # the row itself last, its parent before it, ...
        window[:, j] = np.where(ancestor >= 0, ancestor, num_rows)
        ancestor = np.where(ancestor >= 0, parent[np.maximum(ancestor, 0)], -1)
    return RecurrencePlan(num_rows, torch.from_numpy(window).to(device), _chain_levels(parent, device))


def _chain_levels(parent: np.ndarray, device: torch.device) -> list[ChainLevel]:
    """The chains of the forest (module docstring), grouped by depth, shallowest first."""
    num_rows = parent.shape[0]
    if num_rows == 0:
        return []
    children = np.bincount(parent[parent >= 0], minlength=num_rows)  # (R,)
    rows = np.arange(num_rows)
    starts = parent != rows - 1  # roots and rows not right after their parent
    starts[0] = True
    starts[1:] |= children[:-1] > 1  # the first row after a branching row
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
    position = np.empty_like(depth)  # (S,) each chain's place in its level
    levels = []
    for d in range(int(depth.max()) + 1):
        chains = np.flatnonzero(depth == d)  # (S_d,)
        position[chains] = np.arange(chains.shape[0])
        width = int(lengths[chains].max())
        steps = np.arange(width)  # (L,)
        valid = steps[None, :] < lengths[chains, None]  # (S_d, L)
        padded = np.where(valid, chain_start[chains, None] + steps[None, :], num_rows)  # (S_d, L)
        parents = None if d == 0 else torch.from_numpy(position[chain_parent[chains]]).to(device)
        levels.append(ChainLevel(torch.from_numpy(padded).to(device), torch.from_numpy(valid).to(device), parents))
    return levels


def causal_conv_along_paths(x: torch.Tensor, conv: nn.Conv1d, activation: str,
                            plan: RecurrencePlan) -> torch.Tensor:
    """The depthwise causal convolution of `x` (R, C) along each row's path, then `activation`: (R, C) in x's dtype.
    As transformers' `causal_conv1d_fn` (weights' dtype inside), one gathered window row at a time."""
    weight = conv.weight[:, 0]  # (C, kernel)
    padded = torch.cat([x.to(weight.dtype), x.new_zeros(1, x.shape[1], dtype=weight.dtype)])  # (R + 1, C)
    out = padded.index_select(0, plan.window[:, 0]) * weight[:, 0]  # (R, C)
    for j in range(1, weight.shape[1]):
        out += padded.index_select(0, plan.window[:, j]) * weight[:, j]
    if conv.bias is not None:
        out += conv.bias
    return ACT2FN[activation](out).to(x.dtype)


def gated_delta_along_chains(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, plan: RecurrencePlan) -> torch.Tensor:
    """The gated delta rule (q/k L2-normed inside, as the layer asks) over the plan's chains, one call per depth:
    q, k (R, Hk, Dk), v (R, Hv, Dv), g, beta (R, Hv) -> (R, Hv, Dv) in v's dtype."""
    rule = sys.modules[type(module).__module__].torch_chunk_gated_delta_rule
    padded = [torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in (q, k, v, g, beta)]  # (R + 1, ...) each
    out = v.new_empty(plan.num_rows + 1, *v.shape[1:])  # (R + 1, Hv, Dv); the last row takes the padding
    final = None
    for level in plan.levels:
        steps = [t[level.rows] for t in padded]  # (S, L, ...) each
        initial = None if level.parents is None else final.index_select(0, level.parents)  # (S, Hv, Dk, Dv)
        level_out, final = rule(*steps[:3], g=steps[3], beta=steps[4], initial_state=initial,
                                output_final_state=True, use_qk_l2norm_in_kernel=True)  # (S, L, Hv, Dv)
        out[level.rows[level.valid]] = level_out[level.valid]
    return out[:plan.num_rows]


def gated_delta_block(module: nn.Module, x: torch.Tensor, plan: RecurrencePlan) -> torch.Tensor:
    """A Gated DeltaNet layer (Qwen3.5's `Qwen3_5GatedDeltaNet`, Qwen3-Next's) on rows `x` (R, hidden) normed:
    projections, convolution along paths, the rule along chains, gated RMSNorm, output projection."""
    rows = x.shape[0]
    mixed, z, b, a = _projections(module, x)  # (R, 2 Kd + Vd), (R, Hv, Dv), (R, Hv), (R, Hv)
    mixed = causal_conv_along_paths(mixed, module.conv1d, module.activation, plan)
    q, k, v = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    q = q.reshape(rows, -1, module.head_k_dim)  # (R, Hk, Dk)
    k = k.reshape(rows, -1, module.head_k_dim)  # (R, Hk, Dk)
    v = v.reshape(rows, -1, module.head_v_dim)  # (R, Hv, Dv)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)  # (R, Hv) float32
    out = gated_delta_along_chains(module, q, k, v, g, beta, plan)  # (R, Hv, Dv)
    out = module.norm(out.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))  # (R * Hv, Dv)
    return module.out_proj(out.reshape(rows, -1))  # (R, hidden)


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
