"""Loading errors a user can act on: a wrong path, a hub id without network, an unsupported family."""

import shutil

import pytest
from transformers import GPT2Config

from radix_core import Engine
from radix_core.architectures import SUPPORTED_FAMILIES, ModelLoadError, model_load_error
from radix_core.tasks import TaskConfig, load_task_context


@pytest.mark.parametrize("model", ["/nonexistent/model-dir", "Qwen/Qwen3-Reranker-0.6B"])
def test_unloadable_model_names_itself_and_the_local_directory_fix(model):
    for load in (lambda: Engine.from_pretrained(model, device="cpu"), lambda: load_task_context(model, TaskConfig())):
        with pytest.raises(ModelLoadError) as err:
            load()
        assert repr(model) in str(err.value) and "RADIXSERVE_MODEL=/path/to/model" in str(err.value)


def test_unsupported_family_lists_the_supported_ones(tmp_path):
    GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="'gpt2' model; radixserve supports the " + ", ".join(SUPPORTED_FAMILIES)):
        Engine.from_pretrained(str(tmp_path), device="cpu")


def _load_error(model: str) -> str:
    with pytest.raises(ModelLoadError) as err:
        Engine.from_pretrained(model, device="cpu")
    return str(err.value)


@pytest.mark.parametrize("model", ["/nonexistent/model-dir", "./models/missing", "~/no-such-dir/model"])
def test_missing_path_says_it_does_not_exist_not_a_hub_message(model):
    message = _load_error(model)
    assert f"model path {model!r} does not exist" in message and "RADIXSERVE_MODEL=/path/to/model" in message
    assert "hub" not in message.lower() and "repo id" not in message.lower()


def test_directory_without_config_is_not_a_model_directory(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    message = _load_error(str(tmp_path))
    assert f"model {str(tmp_path)!r} is not a model directory: it has no config.json" in message


def test_file_is_not_a_model_directory(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert "is a file, not a model directory" in _load_error(str(tmp_path / "model.safetensors"))


def test_config_without_weights_names_the_weights(tmp_path, tiny_model_dir):
    shutil.copy(tiny_model_dir() / "config.json", tmp_path / "config.json")
    message = _load_error(str(tmp_path))
    assert message.startswith(f"could not read the weights of model directory {str(tmp_path)!r}: ")
    assert "check that its weights files are complete" in message


def test_unreachable_hub_id_says_hub_offline_and_the_local_fix():
    message = _load_error("Qwen/Qwen3-Reranker-0.6B")
    assert "as a Hugging Face hub id its config could not be loaded" in message
    assert "HF_HUB_OFFLINE is set" in message and "hf download Qwen/Qwen3-Reranker-0.6B" in message
    assert len(message) < 1000, "the hub's multi-paragraph error is cut to its first line"


def test_model_load_error_serves_other_parts_such_as_the_tokenizer(tmp_path):
    err = model_load_error(str(tmp_path / "gone"), "tokenizer", OSError("Repo id must be in the form 'namespace/name'"))
    assert isinstance(err, ModelLoadError) and "does not exist" in str(err) and "Repo id" not in str(err)
    (tmp_path / "config.json").write_text("{}")
    err = model_load_error(str(tmp_path), "tokenizer", OSError("tokenizer.json is truncated\nmore"))
    assert str(err).startswith(f"could not read the tokenizer of model directory {str(tmp_path)!r}: "
                               "tokenizer.json is truncated. ")
