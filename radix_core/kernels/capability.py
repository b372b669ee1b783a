"""Where the Triton kernels can run, and the launchers' shared argument checks.

Triton decides for each `@triton.jit` function, when it is defined, whether it is compiled for the GPU or run
by Triton's CPU interpreter (`TRITON_INTERPRET=1`); that includes Triton's own library (`tl.sum`, `tl.max`),
defined at `import triton`. Interpreted kernels work only when that library is interpreted too, so the
variable must be set before triton is first imported (transformers' model modules import it). `INTERPRETED`
records whether that happened, so a launcher can refuse a CPU tensor with a message instead of failing deep
inside Triton.
"""

from __future__ import annotations

import contextlib

import torch
import triton.language as tl
from triton import knobs
from triton.runtime.jit import JITFunction

INTERPRETED = bool(knobs.runtime.interpret) and not isinstance(tl.sum, JITFunction)
INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def triton_available(device: torch.device | str | None = None) -> bool:
    """Whether the kernels can run on `device` (default: CUDA when present, else the CPU).

    True on a CUDA device (compiled kernels), and on any device when Triton was imported under
    `TRITON_INTERPRET=1` (the interpreter copies device tensors to the host and back).
    """
    if INTERPRETED:
        return True
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def check_runnable(name: str, *tensors: torch.Tensor) -> None:
    """Raise a `ValueError` unless all `tensors` share one device on which the kernels can run."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{name}: all tensors must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if not triton_available(device):
        raise ValueError(
            f"{name}: tensors are on {device}, but compiled Triton kernels need a CUDA device; on the CPU set "
            "TRITON_INTERPRET=1 before triton is first imported, or use the torch reference"
        )


def launch_device(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """The context to launch a kernel on `tensor`'s device in: Triton launches on the thread's current CUDA
    device, which is not `tensor`'s on `cuda:1` unless made so."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def check_dtype(name: str, what: str, tensor: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    """Raise a `ValueError` naming `what` unless `tensor.dtype` is one of `allowed`."""
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise ValueError(f"{name}: {what} must be one of {names}, got {str(tensor.dtype).removeprefix('torch.')}")


def check_ndim(name: str, what: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise a `ValueError` unless `tensor` has `ndim` dimensions; `layout` spells the expected shape."""
    if tensor.dim() != ndim:
        raise ValueError(f"{name}: {what} must be {layout}, got shape {tuple(tensor.shape)}")


def check_qkv(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise a `ValueError` unless q, k and v each have `ndim` dimensions (`layout`), a float dtype and a contiguous
    last (head) dimension."""
    for what, t in (("q", q), ("k", k), ("v", v)):
        check_ndim(name, what, t, ndim, layout)
        check_dtype(name, what, t, FLOAT_DTYPES)
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: {what} must have a contiguous head dim (strides {t.stride()})")
