"""What the serve tests share: free loopback ports, `serve_config.yaml`'s gRPC servicers, and `GrpcDeployment`:
one local Ray + Serve with the gRPC proxy that (re)deploys the application when a test asks for another config."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import ray
import yaml
from ray import serve

from deployments.app import build

ROOT = Path(__file__).resolve().parents[1]
SERVICERS = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["grpc_options"]["grpc_servicer_functions"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GrpcDeployment:
    """`use(name)` deploys `{**base, **configs[name]}` unless it is deployed already, then waits until `probe`
    (an Info call on the channel) answers: OK, or UNAUTHENTICATED for the configs named in `keyed`."""

    def __init__(self, base: dict, configs: dict[str, dict], probe: Callable[[grpc.Channel], object],
                 keyed: frozenset[str] = frozenset()):
        self.base, self.configs, self.probe, self.keyed = base, configs, probe, keyed
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.http_port = free_port()
        self.channel = grpc.insecure_channel(self.address)
        self.current = None

    def start(self, start_local_ray: Callable[[], None]) -> None:
        start_local_ray()
        serve.start(grpc_options={"port": self.port, "grpc_servicer_functions": SERVICERS},
                    http_options={"host": "127.0.0.1", "port": self.http_port})

    def use(self, name: str) -> GrpcDeployment:
        if name != self.current:
            serve.run(build({**self.base, **self.configs[name]}), name="radixserve", route_prefix="/")
            self._wait_until_answering(name in self.keyed)
            self.current = name
        return self

    def stop(self) -> None:
        self.channel.close()
        try:
            serve.shutdown()
        finally:
            ray.shutdown()

    def _wait_until_answering(self, keyed: bool, timeout_s: float = 60) -> None:
        """Until the proxy routes to the new ingress."""
        want = grpc.StatusCode.UNAUTHENTICATED if keyed else grpc.StatusCode.OK
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.probe(self.channel)
                code = grpc.StatusCode.OK
            except grpc.RpcError as err:
                code = err.code()
            if code == want:
                return
            assert time.monotonic() < deadline, f"the app did not answer {want.name} in {timeout_s} s (got {code})"
            time.sleep(0.5)
