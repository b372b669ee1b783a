"""A flash-attn that does not load: "auto" falls back to the Triton kernels and says so; "flash" refuses.

Not loading is any failure of `import flash_attn.cute`: not installed (ImportError), or installed but refused by
the CuTe DSL loader it imports, which raises RuntimeError ("cu13 install is incomplete", "No CTK flavor
installed", no compatible toolkit flavor). No CUDA is needed: choosing a backend for a CUDA device touches no
device, and the Triton backend is accepted for any device while the session interprets its kernels
(tests/conftest.py).
"""

import logging
import sys

import pytest
import torch

from radix_core.attention import make_backend

CUDA = torch.device("cuda")
# The first line of nvidia-cutlass-dsl 4.8.1's loader error when only its base libraries are installed.
CUTE_DSL_REFUSAL = "No CTK flavor installed: expected one or more of _cutlass_ir.cu{N}.cpython-...so"


@pytest.fixture(params=["not installed", "CuTe DSL loader refuses"])
def broken_flash_attn(request, monkeypatch, tmp_path):
    """`import flash_attn.cute` fails: ImportError, or a stand-in package that raises RuntimeError as it loads.
    Yields the error's type name."""
    if request.param == "not installed":
        monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # `import flash_attn.cute` raises ImportError
        yield "ModuleNotFoundError"
        return
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text(f"raise RuntimeError({CUTE_DSL_REFUSAL!r})\n")
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "RuntimeError"
    sys.modules.pop("flash_attn", None)  # the stand-in package, imported before its `cute` raised


def test_auto_falls_back_to_triton_and_logs_why(broken_flash_attn, caplog):
    with caplog.at_level(logging.WARNING, logger="radix_core.attention"):
        backend = make_backend("auto", CUDA, torch.bfloat16)
    assert backend.name == "triton"
    assert "flash-attn 4 does not import" in caplog.text and "pip install 'radixserve[gpu]'" in caplog.text
    assert len(caplog.records) == 1 and f"({broken_flash_attn}: " in caplog.text  # why, once


def test_flash_asked_for_by_name_says_what_to_install(broken_flash_attn):
    with pytest.raises(ValueError, match=r"attention='flash' needs flash-attn 4.*pip install 'radixserve\[gpu\]'"):
        make_backend("flash", CUDA, torch.float16)


def test_float32_goes_to_triton_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="radix_core.attention"):
        assert make_backend("auto", CUDA, torch.float32).name == "triton"
    assert caplog.text == ""
