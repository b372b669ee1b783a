"""A local Ray Serve for the served benchmarks, started as `serve run serve_config.yaml` starts it: Serve's HTTP
and gRPC proxies on free loopback ports, with the YAML's gRPC servicers."""

from __future__ import annotations

import socket
from pathlib import Path

import ray
import yaml
from ray import serve

ROOT = Path(__file__).resolve().parents[1]


def start_serve(http_port: int | None = None) -> tuple[dict, int]:
    """(serve_config.yaml, the gRPC port) of a freshly started local Ray and Serve; its HTTP proxy on `http_port`
    (a free port when None)."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    ray.init(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})
    serve.start(http_options={"host": "127.0.0.1", "port": http_port or free_port()},
                grpc_options={"port": port,
                              "grpc_servicer_functions": config["grpc_options"]["grpc_servicer_functions"]})
    return config, port


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
