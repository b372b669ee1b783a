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

With the prefix cache the plan reads cached rows (`plan.past`: K/V of the attention layers, and where a sequence
continues a cached prefix the recurrent layers' state and convolution tail there) and keeps the admitted rows'
(`plan.kept`: K/V, final states, and the states after the rows where cached segments end).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radix_core.architectures import Architecture
from radix_core.attention import AttentionBackend
from radix_core.gated_delta import PastEnds, RecurrencePlan, gated_delta_block, recurrence_plan, row_parents

if TYPE_CHECKING:
    from radix_core.forward import BatchPlan


def run_hybrid_layers(arch: Architecture, plan: BatchPlan, backend: AttentionBackend) -> torch.Tensor:
    """(F + C, hidden) final-normed hidden states of the plan's final rows (all computed rows when it names none),
    then of its cached rows, as `radix_core.forward.run_layers`."""
    h = arch.embed_tokens(plan.row_ids)  # (R, hidden)
    cos, sin = arch.rotary_emb(h, plan.row_positions.unsqueeze(0))  # (1, R, rotary dim) each
    cos, sin = cos[0], sin[0]  # (R, rotary dim)
    recurrence = _recurrence(arch, plan, h.device)
    attention_layer = linear_layer = 0  # the cache's slots: K/V per attention layer, states per recurrent one
    last = len(arch.layers) - 1
    for i, layer in enumerate(arch.layers):
        x = layer.input_layernorm(h)
        if hasattr(layer, "linear_attn"):
            out, ends = gated_delta_block(layer.linear_attn, x, recurrence, _past_ends(plan, linear_layer))
            if ends is not None:
                plan.kept.keep_end(linear_layer, ends.states, ends.tails)
            linear_layer += 1
        else:
            out = gated_attention_block(arch, attention_layer, layer.self_attn, x, cos, sin, plan, backend)
            attention_layer += 1
        if i == last and plan.final_rows is not None:  # after the token mixer, only the rows read
            h, out = plan.final_part(h), plan.final_part(out)  # (F, hidden) each
        h = h + out
        h = h + layer.mlp(layer.post_attention_layernorm(h)[None])[0]  # a batch of one: Qwen3-Next's experts
    return plan.with_cached(arch.norm(h))


def _recurrence(arch: Architecture, plan: BatchPlan, device: torch.device) -> RecurrencePlan:
    """The recurrent layers' plan of the batch: the forest of its computed rows, roots continuing cached states,
    chains cut where the cache keeps a state."""
    past_end = None if plan.past is None else plan.past.end_of_sequence
    parents, sources = row_parents(plan.token_rows, plan.cu_seqlens, plan.num_rows, past_end)  # (R,) each
    cuts = None if plan.kept is None else plan.kept.end_rows
    return recurrence_plan(parents, arch.config.linear_conv_kernel_dim, device, sources, cuts)


def _past_ends(plan: BatchPlan, layer: int) -> PastEnds | None:
    """The `layer`-th recurrent layer's cached states and tails the batch continues, if any."""
    if plan.past is None or plan.past.end_states is None:
        return None
    return PastEnds(plan.past.end_states[layer], plan.past.end_tails[layer])


def gated_attention_block(arch: Architecture, slot: int, attn, x: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor, plan: BatchPlan, backend: AttentionBackend) -> torch.Tensor:
    """Gated self-attention on rows `x` (R, hidden) normed, as `Qwen3_5Attention` computes it; `slot`: the
    layer's place among the attention layers (its K/V's in the prefix cache)."""
    rows = x.shape[0]
    q, gate = torch.chunk(attn.q_proj(x).view(rows, -1, 2 * attn.head_dim), 2, dim=-1)  # (R, Hq, D) each
    q = attn.q_norm(q)
    k = attn.k_norm(attn.k_proj(x).view(rows, -1, attn.head_dim))  # (R, Hkv, D)
    v = attn.v_proj(x).view(rows, -1, attn.head_dim)  # (R, Hkv, D)
    q, k = arch.apply_rotary(q, k, cos, sin, unsqueeze_dim=1)  # the first `rotary dim` of each head
    if plan.kept is not None:
        plan.kept.keep_layer(slot, k, v)
    past = plan.past.kv(slot) if plan.attention.past is not None else None  # (C, Hkv, D) each
    out = backend(q, k, v, plan.attention, attn.scaling, past).reshape(rows, -1)  # (R, Hq * D)
    return attn.o_proj(out * torch.sigmoid(gate.reshape(rows, -1)))  # (R, hidden)

