"""`EngineConfig`: how an `Engine` runs a checkpoint (device, dtype, radix mode, attention backend).

    engine = Engine.from_pretrained(model, EngineConfig(radix="full"))
    engine = Engine.from_pretrained(model, radix="full")  # the same: its fields as keywords

The server takes the same object from its YAML (`engine:` in `serve_config.yaml`), so each default is written
here once, and so are the choices of each setting: the modules that run them (`radix_core.batch`,
`radix_core.mode_cost`, `radix_core.attention`, `radix_core.prefix_cache`) import them from here. This module
imports nothing heavy, so the server checks its configuration before torch is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("off", "mlp", "full")  # the order `auto` breaks ties in: the simpler mode first
RADIX_CHOICES = ("auto", *MODES)
ATTENTION_CHOICES = ("auto", "torch", "flash", "triton")
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
    CUDA), a number of bytes, or 0 for none. `batch_invariant`: a sequence's outputs bitwise the same whatever else
    is in its batch, whichever radix mode runs, whether its prefix came from the prefix cache (matmuls in fixed
    row tiles, `radix_core.invariant_matmul`; attention over keys split at fixed positions,
    `radix_core.invariant_attention`, which replaces the `attention` backend: leave that "auto").
    """

    device: str = "auto"
    dtype: str = "auto"
    radix: str = "auto"
    radix_threshold: float = DEFAULT_RADIX_THRESHOLD
    attention: str = "auto"
    prefix_cache_bytes: int | str = "auto"
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        _check_choice("radix", self.radix, RADIX_CHOICES)
        _check_choice("attention", self.attention, ATTENTION_CHOICES)
        if isinstance(self.dtype, str):
            _check_choice("dtype", self.dtype, DTYPE_CHOICES)
        if not 0.0 <= self.radix_threshold <= 1.0:
            raise ValueError(f"radix_threshold is a compression N'/N between 0 and 1, got {self.radix_threshold}")
        check_cache_budget(self.prefix_cache_bytes)
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant is true or false, got {self.batch_invariant!r}")
        if self.batch_invariant and self.attention != "auto":
            raise ValueError(f"batch_invariant runs its own attention (radix_core.invariant_attention), not "
                             f"attention={self.attention!r}: leave attention 'auto' or turn batch_invariant off")


def check_cache_budget(setting: int | str) -> None:
    """Raise a `ValueError` naming `prefix_cache_bytes` unless it is "auto" or a whole number of bytes, 0 or more."""
    if setting != "auto" and (isinstance(setting, bool) or not isinstance(setting, int) or setting < 0):
        raise ValueError(f"prefix_cache_bytes must be 'auto', 0 (no prefix cache) or a whole number of bytes; got "
                         f"{setting!r}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}: choose one of {', '.join(choices)}")
