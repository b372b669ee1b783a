"""Loading a transformers checkpoint of a supported family and exposing the parts the compact forward drives.

We reuse upstream modules and weights (embeddings, norms, projections, Qwen3 q/k-norm, Qwen2 qkv bias, rotary
with any rope scaling, MLP, heads) and only replace the batch orchestration and attention around them. On the CPU
two swaps compute the same products in less time: the layers' float32 linears on prepacked oneDNN weights
(`radix_core.packed_linear`), and the dense families' norms, SiLU MLPs and rotary in fewer passes, the same bits
(`radix_core.lean_layers`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PretrainedConfig,
)

from radix_core.lean_layers import ROTARY_FAMILIES, lean_layers, lean_rotary
from radix_core.packed_linear import pack_linears, packs

SUPPORTED_FAMILIES = ("qwen3", "qwen2", "llama", "mistral", "qwen3_5_text", "qwen3_next")
HYBRID_FAMILIES = ("qwen3_5_text", "qwen3_next")  # Gated DeltaNet and gated attention layers: radix_core.hybrid_layers
# multimodal checkpoints whose text model we run, read as that model's family (text inputs only)
MULTIMODAL_FAMILIES = ("qwen3_5",)
HEADS = {"causal_lm": AutoModelForCausalLM, "seq_cls": AutoModelForSequenceClassification, "base": AutoModel}


class ModelLoadError(RuntimeError):
    """The checkpoint could not be found, read or used; the message says what to do."""


@dataclass
class Architecture:
    """The parts of one loaded model, in the order the forward uses them."""

    family: str  # config.model_type, one of SUPPORTED_FAMILIES (a multimodal checkpoint's text model type)
    head: str  # "causal_lm" (lm_head), "seq_cls" (score) or "base" (hidden states only)
    config: PretrainedConfig
    embed_tokens: nn.Embedding
    layers: nn.ModuleList  # decoder layers: input_layernorm, self_attn (or linear_attn), post_attention_layernorm, mlp
    norm: nn.Module  # final RMSNorm
    rotary_emb: nn.Module  # (x, position_ids (1, N)) -> cos, sin (1, N, head_dim)
    apply_rotary: callable  # the family's apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    head_module: nn.Module | None  # lm_head (vocab) or score (num_labels); None for a base model
    max_seq_len: int  # longest sequence computed exactly: max positions, capped by any sliding window

    @property
    def hybrid(self) -> bool:
        """Some layers are Gated DeltaNet layers (`radix_core.hybrid_layers` runs the model)."""
        return self.family in HYBRID_FAMILIES

    @property
    def attention_layers(self) -> list[nn.Module]:
        """The self-attention modules, layer by layer (a hybrid's full-attention layers only)."""
        return [layer.self_attn for layer in self.layers if hasattr(layer, "self_attn")]

    @property
    def vocab_size(self) -> int:
        return self.embed_tokens.num_embeddings

    @property
    def hidden_size(self) -> int:
        return self.embed_tokens.embedding_dim


def load_architecture(model: str, device: torch.device, dtype: torch.dtype, packed: bool = False,
                      lean: bool = False) -> Architecture:
    """Load `model` (local directory or hub id) with transformers, in eval mode on `device` and `dtype`. `packed`:
    the decoder layers' linears run on prepacked weights where `radix_core.packed_linear` applies. `lean`: on the
    CPU, the dense families' norms, MLPs and rotary as `radix_core.lean_layers` (the same bits, fewer passes)."""
    config = load_config(model)
    head = head_of(config)
    try:
        loaded = HEADS[head].from_pretrained(model, dtype=dtype)
    except (OSError, ValueError) as err:
        raise model_load_error(model, "weights", err) from err
    loaded.to(device).eval().requires_grad_(False)
    base = loaded if head == "base" else loaded.model
    base = getattr(base, "language_model", base)  # a multimodal model's text model
    if packed and packs(device, dtype):
        pack_linears(base.layers)
    lean = lean and device.type == "cpu"
    if lean:
        lean_layers(base)
    return Architecture(
        family=config.model_type,
        head=head,
        config=config,
        embed_tokens=base.embed_tokens,
        layers=base.layers,
        norm=base.norm,
        rotary_emb=base.rotary_emb,
        apply_rotary=lean_rotary if lean and config.model_type in ROTARY_FAMILIES else
        sys.modules[type(base.layers[0]).__module__].apply_rotary_pos_emb,
        head_module={"causal_lm": getattr(loaded, "lm_head", None),
                     "seq_cls": getattr(loaded, "score", None)}.get(head),
        max_seq_len=max_seq_len(config),
    )


def load_config(model: str) -> PretrainedConfig:
    """The model's config, refusing families we do not support with a message listing the supported ones. A
    multimodal checkpoint's is its text model's config, with the checkpoint's architectures and labels."""
    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:
        raise model_load_error(model, "config", err) from err
    if config.model_type in MULTIMODAL_FAMILIES:
        text = config.get_text_config()
        text.architectures, text.id2label = config.architectures, config.id2label
        config = text
    if config.model_type not in SUPPORTED_FAMILIES:
        raise ModelLoadError(
            f"model {model!r} is a {config.model_type!r} model; radixserve supports the "
            f"{', '.join(SUPPORTED_FAMILIES)} families (and the text model of {', '.join(MULTIMODAL_FAMILIES)})"
        )
    return config


def model_load_error(model: str, part: str, err: Exception) -> ModelLoadError:
    """The error for transformers failing to load `part` ("config", "weights", "tokenizer") of `model`.

    transformers treats anything that is not an existing directory as a hub id, so a mistyped path surfaces as
    a hub message ("Repo id must be in the form ...", "couldn't connect to huggingface.co"). This says which of
    the cases it was (a path that does not exist, a path that is not a model directory, a directory whose files
    could not be read, a hub id that could not be fetched) and how to fix it.
    """
    path = Path(model).expanduser()
    fix = "(for the server: RADIXSERVE_MODEL=/path/to/model, a directory that exists on every Ray node)"
    if path.is_dir() and not (path / "config.json").is_file():
        return ModelLoadError(
            f"model {model!r} is not a model directory: it has no config.json. Give the directory that holds "
            f"config.json and the weights {fix}, e.g. a snapshot under $HF_HOME/hub/models--ORG--NAME/snapshots/")
    if path.is_dir():
        return ModelLoadError(
            f"could not read the {part} of model directory {model!r}: {_first_line(err)}. The directory has "
            f"config.json; check that its {part} files are complete and readable (download it again if not)")
    if path.exists():
        return ModelLoadError(f"model {model!r} is a file, not a model directory: give the directory that holds "
                              f"config.json and the weights {fix}")
    if _looks_like_path(model):
        return ModelLoadError(
            f"model path {model!r} does not exist (resolved to {path.absolute()}). Fix the path {fix}")
    offline = " HF_HUB_OFFLINE is set, so only models already in the Hugging Face cache load." \
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") else ""
    return ModelLoadError(
        f"model {model!r} is not a local directory, and as a Hugging Face hub id its {part} could not be loaded: "
        f"{_first_line(err)}.{offline} Check the id's spelling and that huggingface.co is reachable, or download "
        f"it (`hf download {model}`) and give the local directory {fix}")


def _looks_like_path(model: str) -> bool:
    """Hub ids are `name` or `org/name`; anything absolute, relative-dotted, home-based or deeper is a path."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1


def _first_line(err: Exception, limit: int = 300) -> str:
    """The first line of an exception's message, at most `limit` characters (hub errors run to paragraphs)."""
    line = (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def head_of(config: PretrainedConfig) -> str:
    """"causal_lm", "seq_cls" or "base", from the checkpoint's architectures (a multimodal one generating text is
    read as its text model's causal LM)."""
    architectures = config.architectures or []
    if any(a.endswith(("ForCausalLM", "ForConditionalGeneration")) for a in architectures):  # the latter: multimodal
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
