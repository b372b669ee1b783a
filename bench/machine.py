"""What a benchmark ran on, in words, for the titles of its plots: a PNG alone says what it measured."""

from __future__ import annotations

import inspect
import os
import platform

from radix_core.tiny_models import PRESETS, make_tiny_model


def machine() -> str:
    """The accelerator if there is one, else the CPU: "NVIDIA H200" or "2 CPUs (Intel(R) Xeon(R) Processor)"."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{os.cpu_count()} CPUs ({cpu_model()})"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def tiny_model(preset: str, arch: str = "qwen3") -> str:
    """A random-weight test model in words: "qwen3 `bench` preset (hidden 512, 8 layers, random weights)"."""
    defaults = {name: p.default for name, p in inspect.signature(make_tiny_model).parameters.items()}
    shape = {**defaults, **PRESETS[preset]}
    return f"{arch} `{preset}` preset (hidden {shape['hidden_size']}, {shape['num_layers']} layers, random weights)"


def plot_title(what: str, model: str) -> str:
    """`what` on the first line; the model and the machine on the second."""
    return f"{what}\n{model} on {machine()}"
