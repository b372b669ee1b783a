"""Session-wide test setup: offline Hugging Face, tiny model directories built once per session, and a process that
ends once pytest has reported, without the interpreter's finalization."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

# No machine here reaches a model hub; set before anything imports huggingface_hub, which reads these once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# Triton kernels run under Triton's interpreter in the tests, with or without CUDA: the kernel tests build CPU
# tensors and the Triton engine test runs on the CPU, so a CUDA machine runs the same tests as CI
# (bench/gpu_check.py runs the compiled kernels). It must be chosen before anything imports triton
# (transformers' model modules do): Triton fixes "interpreted or compiled" per function at definition.
os.environ.setdefault("TRITON_INTERPRET", "1")
EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process once pytest has reported and every plugin has unconfigured, without the interpreter's
    finalization: native libraries the tests load (Ray's core worker, gRPC, torch) keep threads past the session, and
    once, after all 90 slow tests had passed, the process died at exit in libstdc++ (a string hash; SIGSEGV: `make`
    failed a green run). A Ray still up is shut down first, as its exit handler would."""
    if EXIT_STATUS not in config.stash:
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(config.stash[EXIT_STATUS])


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`tiny_model_dir(arch="qwen3", head="causal_lm", preset="tiny") -> Path`, each built once per session.

    Tests must treat the directories as read-only: other tests get the same ones.
    """
    from radix_core.tiny_models import PRESETS, make_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    built: dict[tuple[str, str, str], Path] = {}

    def get(arch: str = "qwen3", head: str = "causal_lm", preset: str = "tiny") -> Path:
        key = (arch, head, preset)
        if key not in built:
            built[key] = make_tiny_model(root / "-".join(key), arch, head, **PRESETS[preset])
        return built[key]

    return get


@pytest.fixture(scope="session")
def serve_cluster():
    """The local Ray with Serve's HTTP and gRPC proxies that serve test modules share (`tests/serving.py`
    `ServeCluster`): `serve_cluster.ensure()` starts it on first use; it stops at the end of the session."""
    from serving import ServeCluster

    cluster = ServeCluster()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def start_local_ray(serve_cluster) -> Callable[..., None]:
    """`start_local_ray(**ray_init_options)` starts a 2-CPU loopback Ray of the test's own (the test shuts it down),
    for tests where a Ray to themselves is the point (killed nodes, autoscaling); the shared cluster stops first."""
    from serving import start_local_ray

    def start(**options) -> None:
        serve_cluster.stop()
        start_local_ray(**options)

    return start


@pytest.fixture(scope="session")
def start_local_ray_with_metrics(start_local_ray) -> Callable[[int], None]:
    """`start_local_ray_with_metrics(port)`: a Ray of the test's own, with the node's metrics agent serving
    Prometheus text on 127.0.0.1:`port` (`ray.init(_metrics_export_port=...)`) and exporting every second rather
    than every 10 s (`metrics_report_interval_ms`; Ray floors it at 1 s)."""
    return lambda port: start_local_ray(_metrics_export_port=port,
                                        _system_config={"metrics_report_interval_ms": 1000})


@pytest.fixture(autouse=True)
def _a_ray_of_its_own_stops_the_shared_cluster(request: pytest.FixtureRequest) -> None:
    """A serve test that is not on the shared cluster starts a Ray of its own (the README's serve command in a
    subprocess, a cluster of several nodes): the shared cluster's processes stop first, so they take no CPU from it."""
    if request.node.get_closest_marker("serve") is not None and "serve_cluster" not in request.fixturenames:
        request.getfixturevalue("serve_cluster").stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules without Ray first, then the modules on the shared serve cluster, then those that start a Ray of their
    own: the shared cluster starts once rather than once per module (order within each group is kept)."""
    group: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        if "serve_cluster" in item.fixturenames and "start_local_ray" not in item.fixturenames:
            kind = 1
        elif item.get_closest_marker("serve") is not None or "start_local_ray" in item.fixturenames:
            kind = 2
        else:
            kind = 0
        group[module] = max(group.get(module, 0), kind)
    items.sort(key=lambda item: group[item.nodeid.split("::")[0]])


@pytest.fixture
def workdir():
    """A short private directory: Ray's socket paths must stay under 107 characters."""
    with tempfile.TemporaryDirectory(prefix="rs-launch-", dir="/tmp") as path:
        yield Path(path)
