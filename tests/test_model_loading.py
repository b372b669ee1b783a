"""Loading errors a user can act on: a wrong path, a hub id without network, an unsupported family."""

import pytest
from transformers import GPT2Config

from radix_core import Engine
from radix_core.architectures import SUPPORTED_FAMILIES, ModelLoadError
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
