"""Tiny random-weight transformers models with a small trained tokenizer, for tests and smoke runs.

No machine here reaches a model hub, and tests compare our forward against transformers itself
(docs/ARCHITECTURE.md, section 6 "Invariants"), so we write real checkpoints to a directory and load
them back through the ordinary loading path: `AutoModel*.from_pretrained(dir)` and
`AutoTokenizer.from_pretrained(dir)`.

Each architecture gets settings that real checkpoints of its family use and that a careless
forward would get wrong: Qwen3 has q/k-norm and head_dim = 2 * hidden / heads (like Qwen3-0.6B)
with tied embeddings; Qwen2 has its qkv bias; Llama has llama3 rope scaling and tied embeddings;
Mistral has head_dim = hidden / heads / 2 (like Mistral-Nemo) and no sliding window; Qwen3.5 has
three Gated DeltaNet layers to one gated attention layer, head_dim = 2 * hidden / heads with a
quarter of it rotated, Gated DeltaNet decay rates exp(A_log) with A_log in [-3, 0.5) (states that
carry across a trie branch) and tied embeddings; Qwen3-Next the same layers (q/k/v/z projected together)
with a mixture of 4 experts (2 a token) and a shared expert in every layer. Weights are
re-drawn with std = hidden_size ** -0.5 (0.125 for the tiny preset, not transformers' 0.02), norm
weights in [0.5, 1.5) and biases with std 0.1, so hidden states and attention patterns are far from
constant and an exactness test has something to catch.

The tokenizer is a byte-level BPE (Qwen2 pre-tokenizer regex) trained on `data/tiny_corpus.txt`
once per process, with the Qwen chat special tokens appended after the trained vocabulary as in the
real Qwen tokenizers. Token choices, the same for every architecture and head:

* eos = `<|im_end|>` (as in Qwen3 chat, reranker and embedding checkpoints), pad = `<|endoftext|>`,
  no bos token and no unk token (byte-level BPE covers every byte); the model config carries
  bos_token_id = `<|endoftext|>` like Qwen3's config.json, eos and pad as above.
* `yes` and `no` are single regular tokens (the Qwen3-Reranker scores their logits).
* No post-processor: encoding adds no tokens.
* The model's vocab_size is len(tokenizer) rounded up to a multiple of 64, so it is larger than
  the tokenizer, as in Qwen (151936 embedding rows for 151669 tokens).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

ARCHS = ("qwen3", "qwen2", "llama", "mistral", "qwen3_5", "qwen3_next")
HEADS = ("causal_lm", "seq_cls", "base")
PRESETS: dict[str, dict] = {
    "tiny": {},  # the make_tiny_model defaults: hidden 64, 2 layers, 4 heads, 2 kv heads
    "small": dict(hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=384),
    "bench": dict(
        hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536,
        head_dim=64, max_position_embeddings=4096,
    ),
}

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
EOS_TOKEN, PAD_TOKEN = IM_END, ENDOFTEXT
SINGLE_TOKEN_WORDS = ("yes", "no")
CORPUS_PATH = Path(__file__).parent / "data" / "tiny_corpus.txt"
BPE_VOCAB_SIZE = 3000  # trained entries (256 bytes + merges); the corpus supports ~5400
VOCAB_MULTIPLE = 64
# Qwen2's pre-tokenizer split: contractions, letter runs with one leading non-letter, single
# digits, punctuation runs, newlines, spaces (transformers.models.qwen2.tokenization_qwen2).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_HEAD_SUFFIX = {"causal_lm": "ForCausalLM", "seq_cls": "ForSequenceClassification", "base": "Model"}


@dataclass(frozen=True)
class _ArchTraits:
    """What one family's tiny checkpoints look like beyond the shared sizes."""

    class_prefix: str  # transformers class names: f"{prefix}Config", f"{prefix}ForCausalLM", ...
    head_dim_ratio: float | None  # default head_dim = ratio * hidden / heads; None: no head_dim setting
    rope_parameters: dict
    tie_word_embeddings: bool
    rms_norm_eps: float
    config_extras: dict = field(default_factory=dict)  # further config kwargs for this family only
    class_names: dict = field(default_factory=dict)  # "config" or a head -> class name, where not prefix + suffix
    hybrid: bool = False  # Gated DeltaNet layers: linear_* sizes from the shared ones, `layer_types`


_ARCH_TRAITS = {
    "qwen3": _ArchTraits("Qwen3", 2.0, {"rope_type": "default", "rope_theta": 1_000_000.0}, True, 1e-6),
    "qwen2": _ArchTraits("Qwen2", None, {"rope_type": "default", "rope_theta": 250_000.0}, False, 1e-5),
    "llama": _ArchTraits(
        "Llama", 1.0,
        {
            "rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 256,
        },
        True, 1e-5,
    ),
    "mistral": _ArchTraits(
        "Mistral", 0.5, {"rope_type": "default", "rope_theta": 1_000_000.0}, False, 1e-5,
        config_extras={"sliding_window": None},  # full attention; MistralConfig defaults to a 4096 window
    ),
    "qwen3_5": _ArchTraits(
        "Qwen3_5", 2.0,
        {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        True, 1e-6,
        class_names={"config": "Qwen3_5TextConfig", "seq_cls": "Qwen3_5TextForSequenceClassification",
                     "base": "Qwen3_5TextModel"},
        hybrid=True,
    ),
    "qwen3_next": _ArchTraits(
        "Qwen3Next", 2.0, {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
        False, 1e-6,
        config_extras=dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                           shared_expert_intermediate_size=32),
        hybrid=True,
    ),
}
HYBRID_LAYER_TYPES = ("linear_attention", "full_attention")


def make_tiny_model(
    out_dir: str | Path,
    arch: str = "qwen3",
    head: str = "causal_lm",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    head_dim: int | None = None,
    vocab_size: int | None = None,
    max_position_embeddings: int = 2048,
    num_labels: int = 1,
    layer_types: Sequence[str] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write a random-weight `arch` model with a `head` and its tokenizer to `out_dir`; return the path.

    `head` picks XxxForCausalLM, XxxForSequenceClassification (`num_labels` outputs named
    LABEL_0.., pad_token_id set so batches pool the last real token) or XxxModel.
    `layer_types` (hybrid families only, one of `HYBRID_LAYER_TYPES` per layer): None takes the family's
    pattern, three "linear_attention" layers then one "full_attention" (Qwen3.5), and the last layer
    "full_attention" (the 2-layer tiny preset: one of each).
    `head_dim=None` takes the family default (see
    the module docstring); `vocab_size=None` takes len(tokenizer) rounded up to 64. The same
    arguments and seed give the same weights. Writes safetensors and leaves the global RNG alone.
    """
    _check_choice("arch", arch, ARCHS)
    _check_choice("head", head, HEADS)
    tokenizer = make_tiny_tokenizer(max_position_embeddings)
    config = _make_config(
        arch, tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, intermediate_size=intermediate_size, head_dim=head_dim,
        vocab_size=vocab_size, max_position_embeddings=max_position_embeddings, num_labels=num_labels,
        layer_types=layer_types,
    )
    model = _build_model(arch, head, config, seed).to(dtype)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def make_tiny_tokenizer(model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """The tiny byte-level BPE tokenizer as a transformers fast tokenizer (see the module docstring)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=[IM_START, IM_END],  # as Qwen's additional_special_tokens
        model_max_length=model_max_length,
    )


@functools.cache
def _tokenizer_json() -> str:
    """Train the BPE tokenizer on the shipped corpus (~0.1 s) once per process; return its JSON."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS_PATH.read_text(encoding="utf-8")], trainer)
    tokenizer.add_special_tokens([ENDOFTEXT, IM_START, IM_END])  # appended after the BPE vocab, as in Qwen
    _check_single_tokens(tokenizer)
    return tokenizer.to_str()


def _check_single_tokens(tokenizer: Tokenizer) -> None:
    """Fail loudly if a corpus edit made `yes` or `no` stop being one regular vocabulary token."""
    for word in SINGLE_TOKEN_WORDS:
        tokens = tokenizer.encode(word).tokens
        if tokens != [word]:
            raise RuntimeError(
                f"tiny tokenizer splits {word!r} into {tokens}; it must be one token. "
                f"Add more lines with a bare {word!r} to {CORPUS_PATH}."
            )


def _make_config(arch: str, tokenizer: PreTrainedTokenizerFast, *, hidden_size: int, num_layers: int,
                 num_heads: int, num_kv_heads: int, intermediate_size: int, head_dim: int | None,
                 vocab_size: int | None, max_position_embeddings: int, num_labels: int,
                 layer_types: Sequence[str] | None) -> transformers.PreTrainedConfig:
    """The family's config class filled with the shared sizes, the family traits and the token ids."""
    traits = _ARCH_TRAITS[arch]
    config_cls = getattr(transformers, traits.class_names.get("config", f"{traits.class_prefix}Config"))
    return config_cls(
        vocab_size=_model_vocab_size(len(tokenizer), vocab_size),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(traits.rope_parameters),
        tie_word_embeddings=traits.tie_word_embeddings,
        rms_norm_eps=traits.rms_norm_eps,
        initializer_range=hidden_size**-0.5,
        bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=num_labels,
        **_head_dim_kwargs(arch, hidden_size, num_heads, head_dim),
        **_hybrid_kwargs(arch, num_layers, hidden_size, num_heads, num_kv_heads, layer_types),
        **traits.config_extras,
    )


def _hybrid_kwargs(arch: str, num_layers: int, hidden_size: int, num_heads: int, num_kv_heads: int,
                   layer_types: Sequence[str] | None) -> dict:
    """A hybrid family's Gated DeltaNet sizes (key heads = kv heads, value heads = heads, both of
    hidden / heads dims, as Qwen3.5's two value heads per key head) and its `layer_types`."""
    if not _ARCH_TRAITS[arch].hybrid:
        if layer_types is not None:
            raise ValueError(f"layer_types is for the hybrid families ({', '.join(_hybrid_archs())}), not {arch!r}")
        return {}
    if layer_types is None:
        layer_types = ["full_attention" if (i + 1) % 4 == 0 or i == num_layers - 1 else "linear_attention"
                       for i in range(num_layers)]
    if len(layer_types) != num_layers or not set(layer_types) <= set(HYBRID_LAYER_TYPES):
        raise ValueError(f"layer_types must name one of {', '.join(HYBRID_LAYER_TYPES)} for each of the "
                         f"{num_layers} layers, got {list(layer_types)}")
    dim = hidden_size // num_heads
    return dict(layer_types=list(layer_types), linear_num_key_heads=num_kv_heads, linear_num_value_heads=num_heads,
                linear_key_head_dim=dim, linear_value_head_dim=dim, linear_conv_kernel_dim=4)


def _hybrid_archs() -> list[str]:
    return [arch for arch, traits in _ARCH_TRAITS.items() if traits.hybrid]


def _head_dim_kwargs(arch: str, hidden_size: int, num_heads: int, head_dim: int | None) -> dict:
    """`{"head_dim": n}` for families that have the setting; Qwen2 only has hidden / heads."""
    ratio = _ARCH_TRAITS[arch].head_dim_ratio
    if ratio is None:
        if head_dim not in (None, hidden_size // num_heads):
            raise ValueError(
                f"qwen2 has no head_dim setting (it is hidden_size // num_heads = {hidden_size // num_heads}), "
                f"got head_dim={head_dim}; drop head_dim or pick another arch."
            )
        return {}
    return {"head_dim": head_dim or int(ratio * hidden_size // num_heads)}


def _model_vocab_size(tokenizer_len: int, requested: int | None) -> int:
    """Embedding rows: `requested`, or len(tokenizer) rounded up to VOCAB_MULTIPLE."""
    if requested is None:
        return math.ceil(tokenizer_len / VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    if requested < tokenizer_len:
        raise ValueError(f"vocab_size={requested} is smaller than the tokenizer ({tokenizer_len} tokens); "
                         f"pass vocab_size >= {tokenizer_len} or None.")
    return requested


def _build_model(arch: str, head: str, config: transformers.PreTrainedConfig, seed: int) -> PreTrainedModel:
    """Instantiate the head class and re-draw its weights from `seed`, leaving the global RNG as it was."""
    traits = _ARCH_TRAITS[arch]
    model_cls = getattr(transformers, traits.class_names.get(head, f"{traits.class_prefix}{_HEAD_SUFFIX[head]}"))
    with torch.random.fork_rng(devices=[]):  # construction draws transformers' own init from the global RNG
        model = model_cls(config)
    _randomize_weights(model, std=config.initializer_range, seed=seed)
    return model.eval()


@torch.no_grad()
def _randomize_weights(model: PreTrainedModel, std: float, seed: int) -> None:
    """Matrices ~ N(0, std), norm weights ~ U[0.5, 1.5), biases ~ N(0, 0.1): nothing is constant.

    Drawn here rather than by transformers so a seed gives the same weights across transformers
    versions; tied embeddings are one parameter and are drawn once. Measured on 1024 random tokens
    (tiny preset): adjacent tokens' final hidden states have cosine 0.04-0.16 in every family; a
    bias std of 0.5 pushed Qwen2's to 0.75 (the v-bias passes through attention unchanged).
    """
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith(".A_log"):  # Gated DeltaNet decay rates exp(A_log): short and long memories
            param.uniform_(-3.0, 0.5, generator=generator)
        elif name.endswith(".bias"):
            param.normal_(0.0, 0.1, generator=generator)
        elif param.ndim == 1 and not param.any():  # zero-centred RMSNorm (Qwen3.5's 1 + w): gains in [0.5, 1.5)
            param.uniform_(-0.5, 0.5, generator=generator)
        elif param.ndim == 1:  # RMSNorm weights, including Qwen3's q_norm / k_norm
            param.uniform_(0.5, 1.5, generator=generator)
        else:
            param.normal_(0.0, std, generator=generator)


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    """Reject an unknown arch or head with the list of supported ones."""
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
