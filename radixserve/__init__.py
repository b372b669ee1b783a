"""radixserve: the client side (`radixserve.client`, the `radixserve` CLI) and the gRPC stubs (`radixserve.v1`).

Importing it imports neither torch nor Ray.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("radixserve")
except PackageNotFoundError:  # a source tree on PYTHONPATH that was never installed
    __version__ = "0+unknown"
