"""Loading a transformers checkpoint of a supported family and exposing the parts the compact forward drives.

We reuse upstream modules and weights (embeddings, norms, projections, Qwen3 q/k-norm, Qwen2 qkv bias, rotary
with any rope scaling, MLP, heads) and only replace the batch orchestration and attention around them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PretrainedConfig,
)

SUPPORTED_FAMILIES = ("qwen3", "qwen2", "llama", "mistral")
HEADS = {"causal_lm": AutoModelForCausalLM, "seq_cls": AutoModelForSequenceClassification, "base": AutoModel}


class ModelLoadError(RuntimeError):
    """The checkpoint could not be found, read or used; the message says what to do."""


@dataclass
class Architecture:
    """The parts of one loaded model, in the order the forward uses them."""

    family: str  # config.model_type, one of SUPPORTED_FAMILIES
    head: str  # "causal_lm" (lm_head), "seq_cls" (score) or "base" (hidden states only)
    config: PretrainedConfig
    embed_tokens: nn.Embedding
    layers: nn.ModuleList  # decoder layers: input_layernorm, self_attn, post_attention_layernorm, mlp
    norm: nn.Module  # final RMSNorm
    rotary_emb: nn.Module  # (x, position_ids (1, N)) -> cos, sin (1, N, head_dim)
    apply_rotary: callable  # the family's apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    head_module: nn.Module | None  # lm_head (vocab) or score (num_labels); None for a base model
    max_seq_len: int  # longest sequence computed exactly: max positions, capped by any sliding window

    @property
    def vocab_size(self) -> int:
        return self.embed_tokens.num_embeddings

    @property
    def hidden_size(self) -> int:
        return self.embed_tokens.embedding_dim


def load_architecture(model: str, device: torch.device, dtype: torch.dtype) -> Architecture:
    """Load `model` (local directory or hub id) with transformers, in eval mode on `device` and `dtype`."""
    config = load_config(model)
    head = head_of(config)
    try:
        loaded = HEADS[head].from_pretrained(model, dtype=dtype)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not load the weights of model {model!r}: {err}") from err
    loaded.to(device).eval().requires_grad_(False)
    base = loaded if head == "base" else loaded.model
    first_attn = base.layers[0].self_attn
    return Architecture(
        family=config.model_type,
        head=head,
        config=config,
        embed_tokens=base.embed_tokens,
        layers=base.layers,
        norm=base.norm,
        rotary_emb=base.rotary_emb,
        apply_rotary=sys.modules[type(first_attn).__module__].apply_rotary_pos_emb,
        head_module={"causal_lm": getattr(loaded, "lm_head", None), "seq_cls": getattr(loaded, "score", None)}.get(head),
        max_seq_len=max_seq_len(config),
    )


def load_config(model: str) -> PretrainedConfig:
    """The model's config, refusing families we do not support with a message listing the supported ones."""
    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"could not load model {model!r}: {err}. Give a local directory holding config.json and the weights "
            f"(for the server: set RADIXSERVE_MODEL=/path/to/model), or make sure the hub id is right and reachable."
        ) from err
    if config.model_type not in SUPPORTED_FAMILIES:
        raise ModelLoadError(
            f"model {model!r} is a {config.model_type!r} model; radixserve supports the "
            f"{', '.join(SUPPORTED_FAMILIES)} families"
        )
    return config


def head_of(config: PretrainedConfig) -> str:
    """"causal_lm", "seq_cls" or "base", from the checkpoint's architectures."""
    architectures = config.architectures or []
    if any(a.endswith("ForCausalLM") for a in architectures):
        return "causal_lm"
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "seq_cls"
    return "base"


def max_seq_len(config: PretrainedConfig) -> int:
    """Longest sequence computed exactly: a sliding window no shorter than the sequence equals full causal
    attention, so lengths are capped at the window (Mistral's applies to every layer; Qwen2/Qwen3 have one
    only on their `sliding_attention` layers)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    if window and (config.model_type == "mistral" or "sliding_attention" in layer_types):
        return min(config.max_position_embeddings, window)
    return config.max_position_embeddings
