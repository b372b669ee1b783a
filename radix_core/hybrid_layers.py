"""The layer loop of hybrid models (Qwen3.5, Qwen3-Next): Gated DeltaNet layers along the trie, gated attention
layers through the attention backend, everything else position-wise on the plan's rows.

Per layer the token mixer is the layer's own: `linear_attn` (a Gated DeltaNet, `radix_core.gated_delta`: the
recurrence over the forest of rows, each chain once from its parent chain's state) or `self_attn` (attention with
an output gate: q_proj gives each head's query and gate, q/k RMSNorm, rotary on the leading part of the head
(`partial_rotary_factor`), the backend over the plan's attention metadata as in every mode, then
`out * sigmoid(gate)` before o_proj). Norms, MLPs (Qwen3-Next's mixture of experts too) and the head run on the
rows as for every family.

The recurrence follows the plan's rows: in `off` each sequence is its own chain; in `mlp` and `full` the compact
rows' trie, so a shared prefix's recurrence runs once (in `mlp` too: only its attention is laid out per sequence).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radix_core.architectures import Architecture
from radix_core.attention import AttentionBackend
from radix_core.gated_delta import gated_delta_block, recurrence_plan, row_parents

if TYPE_CHECKING:
    from radix_core.forward import BatchPlan


def run_hybrid_layers(arch: Architecture, plan: BatchPlan, backend: AttentionBackend) -> torch.Tensor:
    """(R, hidden) final-normed hidden states of the plan's rows."""
    if plan.past is not None or plan.kept is not None:
        raise ValueError(f"the prefix cache does not hold the recurrent state of {arch.family} models: run them "
                         f"without it (prefix_cache_bytes 0)")
    h = arch.embed_tokens(plan.row_ids)  # (R, hidden)
    cos, sin = arch.rotary_emb(h, plan.row_positions.unsqueeze(0))  # (1, R, rotary dim) each
    cos, sin = cos[0], sin[0]  # (R, rotary dim)
    parents = row_parents(plan.token_rows, plan.cu_seqlens, plan.num_rows)  # (R,)
    recurrence = recurrence_plan(parents, arch.config.linear_conv_kernel_dim, h.device)
    for layer in arch.layers:
        x = layer.input_layernorm(h)
        if hasattr(layer, "linear_attn"):
            h = h + gated_delta_block(layer.linear_attn, x, recurrence)
        else:
            h = h + gated_attention_block(arch, layer.self_attn, x, cos, sin, plan, backend)
        h = h + layer.mlp(layer.post_attention_layernorm(h)[None])[0]  # a batch of one: Qwen3-Next's experts
    return arch.norm(h)


def gated_attention_block(arch: Architecture, attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          plan: BatchPlan, backend: AttentionBackend) -> torch.Tensor:
    """Gated self-attention on rows `x` (R, hidden) normed, as `Qwen3_5Attention` computes it."""
    rows = x.shape[0]
    q, gate = torch.chunk(attn.q_proj(x).view(rows, -1, 2 * attn.head_dim), 2, dim=-1)  # (R, Hq, D) each
    q = attn.q_norm(q)
    k = attn.k_norm(attn.k_proj(x).view(rows, -1, attn.head_dim))  # (R, Hkv, D)
    v = attn.v_proj(x).view(rows, -1, attn.head_dim)  # (R, Hkv, D)
    q, k = arch.apply_rotary(q, k, cos, sin, unsqueeze_dim=1)  # the first `rotary dim` of each head
    out = backend(q, k, v, plan.attention, attn.scaling).reshape(rows, -1)  # (R, Hq * D)
    return attn.o_proj(out * torch.sigmoid(gate.reshape(rows, -1)))  # (R, hidden)

