"""A local Ray Serve for the served benchmarks, started as `radixserve serve serve_config.yaml` starts it: Serve's
HTTP and gRPC proxies on free loopback ports, with the YAML's gRPC servicers, and the environment the launcher
gives the Ray it starts (`set_ray_environment`: the gRPC message limit, Ray's workers (Serve's controller and
proxies too, not only the replicas) at the YAML's `placement.niceness`, Serve's control loop interval); and the
YAML's application deployed on it with a benchmark's own sections (`app_args`, `run_app`)."""

from __future__ import annotations

import socket
from pathlib import Path

import ray
import yaml
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.app import build
from deployments.launcher import load_config, set_ray_environment

ROOT = Path(__file__).resolve().parents[1]


def start_serve(http_port: int | None = None) -> tuple[dict, int]:
    """(serve_config.yaml, the gRPC port) of a freshly started local Ray and Serve; its HTTP proxy on `http_port`
    (a free port when None)."""
    path = ROOT / "serve_config.yaml"
    config = yaml.safe_load(path.read_text())
    set_ray_environment(load_config(str(path)))  # read when ray.init starts Ray
    port = free_port()
    # "local": a Ray of its own even where `ray start` (or a test's `ray.cluster_utils.Cluster`, killed before its
    # shutdown) left its address in Ray's temp directory; with no address ray.init would connect there.
    ray.init(address="local", include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})
    serve.start(http_options={"host": "127.0.0.1", "port": http_port or free_port()},
                grpc_options={"port": port,
                              "grpc_servicer_functions": config["grpc_options"]["grpc_servicer_functions"]})
    return config, port


def app_args(config: dict, **sections) -> dict:
    """The args of `config`'s (serve_config.yaml's) radixserve application with `sections` in place of its own
    (each section replaced whole)."""
    return {**config["applications"][0]["args"], **sections}


def run_app(args: dict) -> DeploymentHandle:
    """The radixserve application on `args`, deployed as `serve run serve_config.yaml` deploys it; its handle."""
    return serve.run(build(args), name="radixserve", route_prefix="/")


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
