"""The test session interprets Triton kernels whether or not CUDA is present (issue 16, item 2).

The kernel tests build CPU tensors and the Triton engine test runs on the CPU, so a CUDA machine that compiled
the kernels instead would fail them. `tests/conftest.py` chooses the interpreter; here it runs in a fresh
interpreter with `torch.cuda.is_available` answering each way, as on a CPU and on a GPU machine.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from radix_core.kernels import capability

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
PROBE = """
import os, runpy, sys
import torch
torch.cuda.is_available = lambda: {cuda}
runpy.run_path(sys.argv[1])
print(os.environ.get("TRITON_INTERPRET"))
"""


@pytest.mark.parametrize("cuda", [False, True])
def test_conftest_chooses_the_interpreter_with_and_without_cuda(cuda):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", PROBE.format(cuda=cuda), str(CONFTEST)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "1"


def test_this_session_interprets_the_kernels():
    assert capability.INTERPRETED, "triton was imported before tests/conftest.py set TRITON_INTERPRET=1"
