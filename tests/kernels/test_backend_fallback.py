"""A flash-attn that does not import: "auto" falls back to the Triton kernels and says so; "flash" refuses.

No CUDA is needed: choosing a backend for a CUDA device touches no device, and the Triton backend is accepted
for any device while the session interprets its kernels (tests/conftest.py).
"""

import logging
import sys

import pytest
import torch

from radix_core.attention import make_backend

CUDA = torch.device("cuda")


@pytest.fixture
def broken_flash_attn(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # `import flash_attn.cute` raises ImportError


def test_auto_falls_back_to_triton_and_logs_why(broken_flash_attn, caplog):
    with caplog.at_level(logging.WARNING, logger="radix_core.attention"):
        backend = make_backend("auto", CUDA, torch.bfloat16)
    assert backend.name == "triton"
    assert "flash-attn 4 does not import" in caplog.text and "pip install 'radixserve[gpu]'" in caplog.text


def test_flash_asked_for_by_name_says_what_to_install(broken_flash_attn):
    with pytest.raises(ValueError, match=r"attention='flash' needs flash-attn 4.*pip install 'radixserve\[gpu\]'"):
        make_backend("flash", CUDA, torch.float16)


def test_float32_goes_to_triton_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="radix_core.attention"):
        assert make_backend("auto", CUDA, torch.float32).name == "triton"
    assert caplog.text == ""
