"""`EngineConfig`: how an `Engine` runs a checkpoint (device, dtype, radix mode, attention backend).

    engine = Engine.from_pretrained(model, EngineConfig(radix="full"))
    engine = Engine.from_pretrained(model, radix="full")  # the same: its fields as keywords

The server takes the same object from its YAML (`engine:` in `serve_config.yaml`), so each default is written
here once. The choice lists are the modules' that use them (`radix_core.batch`, `radix_core.attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

from radix_core.attention import ATTENTION_CHOICES
from radix_core.batch import RADIX_CHOICES
from radix_core.prefix_cache import check_budget

DEFAULT_RADIX_THRESHOLD = 1.0  # the cost model decides every batch with any sharing
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings, checked when made.

    `device`: "auto" (CUDA when present, else the CPU) or a torch device ("cpu", "cuda"). `dtype`: weights and
    activations, "auto" (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16 or float16; the library also
    takes a `torch.dtype` (e.g. torch.float64 for reference runs). `radix`: "off" (ragged baseline), "mlp"
    (RadixMLP: position-wise work on compact rows), "full" (attention in compact space too) or "auto" (per batch:
    the mode of least predicted time, `radix_core.mode_cost`, calibrated by `Engine.warm_up`; "off" without asking
    the model when the compression N'/N is above `radix_threshold`). `attention`: the backend, "auto"
    (flash-attn on CUDA in half precision when it loads, else Triton on CUDA, torch on the CPU), "torch",
    "flash" or "triton". `prefix_cache_bytes`: the budget of the prefix K/V cache kept across batches
    (`radix_core.prefix_cache`), "auto" (256 MiB on the CPU, 30% of the device memory free after loading on
    CUDA), a number of bytes, or 0 for none.
    """

    device: str = "auto"
    dtype: str = "auto"
    radix: str = "auto"
    radix_threshold: float = DEFAULT_RADIX_THRESHOLD
    attention: str = "auto"
    prefix_cache_bytes: int | str = "auto"

    def __post_init__(self) -> None:
        _check_choice("radix", self.radix, RADIX_CHOICES)
        _check_choice("attention", self.attention, ATTENTION_CHOICES)
        if isinstance(self.dtype, str):
            _check_choice("dtype", self.dtype, DTYPE_CHOICES)
        if not 0.0 <= self.radix_threshold <= 1.0:
            raise ValueError(f"radix_threshold is a compression N'/N between 0 and 1, got {self.radix_threshold}")
        check_budget(self.prefix_cache_bytes)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}: choose one of {', '.join(choices)}")
