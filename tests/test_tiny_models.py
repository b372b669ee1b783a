"""Tiny random-weight models: they load offline through the Auto classes, run, and carry the
settings and tokens that other tests rely on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from radix_core import tiny_models
from radix_core.tiny_models import ARCHS, HEADS, PRESETS, make_tiny_model
from radixserve import cli

AUTO_CLASSES = {"causal_lm": AutoModelForCausalLM, "seq_cls": AutoModelForSequenceClassification, "base": AutoModel}
CLASS_SUFFIX = {"causal_lm": "ForCausalLM", "seq_cls": "ForSequenceClassification", "base": "Model"}
TEXTS = ["what is a radix tree", "Grüße aus Zürich, ça va? 北京是中国的首都。🎉 yes"]


def _load(model_dir: Path, head: str):
    return AUTO_CLASSES[head].from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def _output(model, head: str, **inputs) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    return out.last_hidden_state if head == "base" else out.logits


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("arch", ARCHS)
def test_auto_classes_load_and_run(tiny_model_dir, arch, head):
    model_dir = tiny_model_dir(arch, head)
    model, loading_info = AUTO_CLASSES[head].from_pretrained(model_dir, output_loading_info=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")  # (2, T)
    out = _output(model.eval(), head, **batch)
    assert not any(loading_info.values()), f"checkpoint and class disagree: {loading_info}"
    width = {"causal_lm": model.config.vocab_size, "seq_cls": 1, "base": model.config.hidden_size}[head]
    assert type(model).__name__.endswith(CLASS_SUFFIX[head])
    assert model.config.model_type in (arch, f"{arch}_text")  # Qwen3.5: the text model of a multimodal family
    assert out.shape[0] == 2 and out.shape[-1] == width
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_seq_cls_scores_a_padded_batch_like_each_text_alone(tiny_model_dir, arch):
    model, tokenizer = _load(tiny_model_dir(arch, "seq_cls"), "seq_cls")
    batched = _output(model, "seq_cls", **tokenizer(TEXTS, padding=True, return_tensors="pt"))[:, 0]  # (2,)
    alone = torch.cat([_output(model, "seq_cls", **tokenizer(t, return_tensors="pt"))[:, 0] for t in TEXTS])
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_long_sequence_stays_finite_and_varied(tiny_model_dir, arch):
    model, _ = _load(tiny_model_dir(arch, "base"), "base")
    ids = torch.randint(0, model.config.vocab_size, (1, 1024), generator=torch.Generator().manual_seed(0))
    hidden = _output(model, "base", input_ids=ids)[0]  # (1024, hidden)
    assert torch.isfinite(hidden).all()
    cosine = torch.nn.functional.cosine_similarity(hidden[:-1], hidden[1:], dim=-1)  # (1023,)
    assert cosine.mean() < 0.5, "hidden states are nearly constant across tokens"


def test_family_traits(tiny_model_dir):
    configs = {arch: AutoConfig.from_pretrained(tiny_model_dir(arch, "base")) for arch in ARCHS}
    weights = {arch: load_file(tiny_model_dir(arch, "base") / "model.safetensors") for arch in ARCHS}
    qwen3 = configs["qwen3"]
    assert qwen3.head_dim != qwen3.hidden_size // qwen3.num_attention_heads
    assert any("q_norm" in name for name in weights["qwen3"])
    assert weights["qwen2"]["layers.0.self_attn.q_proj.bias"].abs().sum() > 0
    assert configs["mistral"].sliding_window is None
    assert configs["llama"].rope_parameters["rope_type"] == "llama3"
    assert {c.tie_word_embeddings for c in configs.values()} == {True, False}
    assert len({c.rope_parameters["rope_theta"] for c in configs.values()}) > 1


@pytest.mark.parametrize("arch", ARCHS)
def test_config_token_ids_match_tokenizer(tiny_model_dir, arch):
    model_dir = tiny_model_dir(arch, "causal_lm")
    config, tokenizer = AutoConfig.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    assert config.vocab_size >= len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config.pad_token_id == tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert config.bos_token_id == tokenizer.pad_token_id
    assert tokenizer.model_max_length == config.max_position_embeddings


def test_tokenizer_special_and_answer_tokens(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    added = tokenizer.get_added_vocab()
    assert {"<|endoftext|>", "<|im_start|>", "<|im_end|>"} <= set(added)
    chat = "<|im_start|>user\nhi<|im_end|>"
    assert tokenizer.convert_ids_to_tokens(tokenizer(chat).input_ids)[0] == "<|im_start|>"
    assert tokenizer.decode(tokenizer(chat).input_ids, skip_special_tokens=True) == "user\nhi"
    for word in ("yes", "no"):
        ids = tokenizer(word).input_ids
        assert len(ids) == 1 and word not in added, f"{word!r} must be one regular token, got {ids}"


@pytest.mark.parametrize("text", [
    "what is the capital of australia",
    "  two  spaces, a tab\tand a newline\n\nend",
    "Grüße aus Zürich, ça va? crème brûlée",
    "北京是中国的首都。",
    "Great news 🎉 the release is out! 🚀",
    "Москва — столица России.",
])
def test_tokenizer_round_trips(tiny_model_dir, text):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode("utf-8")), "expected merges, not only byte tokens"


def test_same_seed_same_weights_and_global_rng_untouched(tmp_path):
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = load_file(make_tiny_model(tmp_path / "a", seed=7) / "model.safetensors")
    assert torch.equal(torch.rand(1), expected_next)
    again = load_file(make_tiny_model(tmp_path / "b", seed=7) / "model.safetensors")
    other = load_file(make_tiny_model(tmp_path / "c", seed=8) / "model.safetensors")
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_bench_preset_sizes(tiny_model_dir):
    config = AutoConfig.from_pretrained(tiny_model_dir("qwen3", "base", "bench"))
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (512, 8, 1536)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (8, 4, 64)


@pytest.mark.parametrize("kwargs, message", [
    (dict(arch="gpt2"), "unknown arch"),
    (dict(head="token_cls"), "unknown head"),
    (dict(vocab_size=100), "smaller than the tokenizer"),
    (dict(arch="qwen2", head_dim=32), "qwen2 has no head_dim"),
])
def test_bad_arguments_say_what_to_do(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_tiny_model(tmp_path, **kwargs)


def test_cli_make_tiny_model_writes_a_loadable_model(tmp_path, capsys):
    out_dir = tmp_path / "cli-model"
    status = cli.main(["make-tiny-model", str(out_dir), "--arch", "qwen2", "--head", "seq_cls", "--seed", "3"])
    assert status == 0
    assert capsys.readouterr().out.strip() == str(out_dir.resolve())
    model, tokenizer = _load(out_dir, "seq_cls")
    assert type(model).__name__ == "Qwen2ForSequenceClassification"
    assert torch.isfinite(_output(model, "seq_cls", **tokenizer(TEXTS, padding=True, return_tensors="pt"))).all()


def test_cli_choices_match_tiny_models():
    assert cli.TINY_ARCHS == tiny_models.ARCHS
    assert cli.TINY_HEADS == tiny_models.HEADS
    assert cli.TINY_PRESETS == tuple(PRESETS)


def test_cli_import_is_light():
    code = "import sys, radixserve.cli; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
