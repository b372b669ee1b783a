"""What the serve tests share: free loopback ports, `serve_config.yaml`'s gRPC servicers, `ServeCluster` (the one
local Ray with Serve's HTTP and gRPC proxies that every serve module shares unless it needs a Ray of its own),
`GrpcDeployment` (deploys the application on it, again when a test asks for another config), `Launched`: the
README's serve command (`radixserve serve CONFIG`) as a subprocess with its own local Ray, and `held_compute`: the
engine replicas' compute threads held, so that requests queue as they would behind a long batch on any machine."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import ray
import yaml
from ray import serve
from ray.exceptions import RayActorError

from deployments.app import build
from deployments.launcher import GRPC_MESSAGE_SIZE_ENV

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 240  # a local Ray plus two replicas on a busy 2-core machine
SERVICERS = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["grpc_options"]["grpc_servicer_functions"]


# Ports for the servers under test: above Ray's worker ports (10002-19999 by default) and below the kernel's
# ephemeral range. A port the kernel hands out (binding port 0) is in that range, so in the seconds before the
# server binds it, a connection Ray opens while it starts could take it as its local port (seen once: the proxy
# "Failed to bind to address '0.0.0.0:39359'").
TEST_PORTS = (20000, 32767)


class CallResult:
    """The part of Ray's `ReplicaResult` a request router reads: done callbacks, which run when `finish` is called,
    or at once when added to a finished call (as Ray's do)."""

    def __init__(self, finished: bool = False):
        self.finished, self.callbacks = finished, []

    def add_done_callback(self, callback: Callable) -> None:
        if self.finished:
            callback(self)
        else:
            self.callbacks.append(callback)

    def finish(self) -> None:
        self.finished = True
        for callback in self.callbacks:
            callback(self)


def free_port() -> int:
    """A port of `TEST_PORTS` that nothing holds right now, at random (test processes running side by side)."""
    low, high = TEST_PORTS[0], min(TEST_PORTS[1], ephemeral_ports()[0] - 1)
    for port in random.sample(range(low, high + 1), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high} after 200 tries")


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for local ports it picks itself (Linux; its default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except OSError:
        return 32768, 60999


def start_local_ray(**options) -> None:
    """A new local Ray (`address="local"`: never another process's cluster) of 2 CPUs unless `options` (`ray.init`'s)
    say otherwise.

    Ray waits a fixed 30 s for a new raylet to register; the first start on a fresh install, under load, can
    take longer, so a start that timed out is retried once."""
    for attempt in range(2):
        try:
            ray.init(**{"address": "local", "num_cpus": 2, "include_dashboard": False, "log_to_driver": False,
                        **options})
            return
        except Exception as err:  # Ray raises a bare Exception for this timeout
            ray.shutdown()
            if attempt or "timed out during startup" not in str(err):
                raise


def replica_actors(deployment: str) -> list:
    """The Ray actors of `deployment`'s Serve replicas, in every namespace."""
    named = [a for a in ray.util.list_named_actors(all_namespaces=True) if f"#{deployment}#" in a["name"]]
    return [ray.get_actor(a["name"], namespace=a["namespace"]) for a in named]


@contextlib.contextmanager
def held_compute(timeout_s: float = 60.0) -> Iterator[Callable[[], int]]:
    """Every engine replica's compute thread busy with a wait until the block ends (or `timeout_s`, should the
    test never end it): the requests a test sends inside queue in the batcher, and its first batch waits to be
    built, as they would behind a long batch, however fast or slow the machine. Yields `ongoing()`: the requests
    the replicas hold now (Serve's count: queued, in a batch, or waiting for their answer), for the test to wait
    until its calls all arrived. With `placement.topology: combined` the engine replicas are the ingress's."""
    actors = replica_actors("EngineReplica") or replica_actors("Ingress")

    def engine_replica(actor):  # runs in the replica's process
        from deployments.engine_link import LocalEngine

        user = actor._replica_impl._user_callable_wrapper.user_callable
        return user.engine.replica if isinstance(user.engine, LocalEngine) else user

    def hold(actor, seconds: float) -> None:  # runs in the replica's process (a closure: pickled by value)
        replica = engine_replica(actor)
        replica.test_release, started = threading.Event(), threading.Event()

        def wait() -> None:
            started.set()
            replica.test_release.wait(seconds)

        threading.Thread(target=replica.compute.call, args=(wait,), daemon=True).start()
        if not started.wait(seconds):
            raise TimeoutError(f"the compute thread did not take the hold within {seconds} s")

    def release(actor) -> None:
        engine_replica(actor).test_release.set()

    ray.get([actor.__ray_call__.remote(hold, timeout_s) for actor in actors])
    try:
        yield lambda: sum(ray.get([actor.get_num_ongoing_requests.remote() for actor in actors]))
    finally:
        for released in [actor.__ray_call__.remote(release) for actor in actors]:
            try:
                ray.get(released)
            except RayActorError:  # the test killed it inside the block: nothing of it is held any more
                pass


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    """Seconds until `condition()` held, polled every `poll_s`; fails the test after `timeout_s`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what} did not happen within {timeout_s} s"
        time.sleep(poll_s)
    return time.monotonic() - started


class ServeCluster:
    """The local Ray with Serve's proxies (HTTP and gRPC, on free loopback ports) that the serve test modules share:
    started by the first module that asks (`ensure`), its applications deleted when a module is done (`clear`), and
    stopped before a module starts a Ray of its own (metrics export, killed nodes) or at the end of the session."""

    def __init__(self):
        self.running = False
        self.grpc_port = self.http_port = 0

    def ensure(self) -> ServeCluster:
        if not self.running:
            self.grpc_port, self.http_port = free_port(), free_port()
            start_local_ray()
            serve.start(grpc_options={"port": self.grpc_port, "grpc_servicer_functions": SERVICERS},
                        http_options={"host": "127.0.0.1", "port": self.http_port})
            self.running = True
        return self

    def clear(self) -> None:
        """Delete every application, so the next module starts on an empty cluster."""
        if self.running:
            for name in serve.status().applications:
                serve.delete(name)

    def stop(self) -> None:
        if self.running:
            self.running = False
            try:
                serve.shutdown()
            finally:
                ray.shutdown()


class GrpcDeployment:
    """`use(name)` deploys `merged(base, configs[name])` on the shared `ServeCluster` unless it is deployed already,
    then waits until `probe` (an Info call on the channel) answers: OK, or UNAUTHENTICATED for the configs named in
    `keyed`."""

    def __init__(self, base: dict, configs: dict[str, dict], probe: Callable[[grpc.Channel], object],
                 keyed: frozenset[str] = frozenset()):
        self.base, self.configs, self.probe, self.keyed = base, configs, probe, keyed
        self.cluster: ServeCluster | None = None
        self.channel: grpc.Channel | None = None
        self.current = None

    @property
    def port(self) -> int:
        return self.cluster.grpc_port

    @property
    def http_port(self) -> int:
        return self.cluster.http_port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, cluster: ServeCluster) -> None:
        self.cluster = cluster.ensure()
        self.channel = grpc.insecure_channel(self.address)

    def use(self, name: str) -> GrpcDeployment:
        if name != self.current:
            serve.run(build(merged(self.base, self.configs[name])), name="radixserve", route_prefix="/")
            self._wait_until_answering(name in self.keyed)
            self.current = name
        return self

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.cluster is not None:
            self.cluster.clear()

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


def merged(args: dict, changes: dict) -> dict:
    """`args` with `changes` applied section by section (`{"limits": {...}}` changes only the keys it names)."""
    out = dict(args)
    for key, value in changes.items():
        both_sections = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both_sections else value
    return out


def write_config(path: Path, http_port: int, grpc_port: int, **args) -> Path:
    """serve_config.yaml with the given ports and args changed (section by section, `merged`)."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"], config["grpc_options"]["port"] = http_port, grpc_port
    config["applications"][0]["args"] = merged(config["applications"][0]["args"], args)
    path.write_text(yaml.safe_dump(config))
    return path


class Launched:
    """`radixserve serve CONFIG` in its own session, with its own RAY_TMPDIR and `env` added; output in `log`."""

    def __init__(self, config: Path, model: Path, workdir: Path, env: dict[str, str] | None = None):
        self.log_path = workdir / "launcher.log"
        env = dict(os.environ, RADIXSERVE_MODEL=str(model), RAY_TMPDIR=str(workdir), HF_HUB_OFFLINE="1", **(env or {}))
        env.pop(GRPC_MESSAGE_SIZE_ENV, None)
        env.pop("RAY_ADDRESS", None)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "radixserve.cli", "serve", str(config),
                                          "--drain-timeout", "60"], cwd=ROOT, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """Last resort after a failed test: the launcher's session (its local Ray), and nothing else."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def wait_until_serving(client, launched: Launched) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert launched.proc.poll() is None, f"launcher exited early:\n{launched.log[-3000:]}"
        try:
            client.info()
            return
        except grpc.RpcError:
            time.sleep(1)
    pytest.fail(f"not serving after {START_TIMEOUT_S} s:\n{launched.log[-3000:]}")
