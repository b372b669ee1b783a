"""radix_core: the radixserve engine. Imports torch, numpy, transformers and triton; never Ray or gRPC."""

from radix_core.engine import Engine, ForwardResult
from radix_core.engine_config import EngineConfig
from radix_core.errors import RequestError
from radix_core.index import RadixIndex, build_radix_index
from radix_core.tasks import TaskConfig

__all__ = ["Engine", "EngineConfig", "ForwardResult", "RadixIndex", "RequestError", "TaskConfig", "build_radix_index"]
