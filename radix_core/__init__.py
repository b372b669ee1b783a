"""radix_core: the radixserve engine. Imports torch, numpy, transformers and triton; never Ray or gRPC.

The names below load their module when first used (PEP 562), so `from radix_core import EngineConfig` (the
server's configuration check) does not import torch."""

from __future__ import annotations

import importlib

_HOMES = {
    "Engine": "radix_core.engine", "ForwardResult": "radix_core.engine", "EngineConfig": "radix_core.engine_config",
    "RequestError": "radix_core.errors", "RadixIndex": "radix_core.index", "build_radix_index": "radix_core.index",
    "TaskConfig": "radix_core.tasks.config",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'radix_core' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
