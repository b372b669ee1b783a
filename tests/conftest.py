"""Session-wide test setup: offline Hugging Face, and tiny model directories built once per session."""

from __future__ import annotations

import os
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
def start_local_ray() -> Callable[[], None]:
    """`start_local_ray()` starts the 2-CPU loopback Ray a serve test runs on (the test shuts it down)."""
    return _start_local_ray


def _start_local_ray(**options) -> None:
    """A new 2-CPU local Ray (`address="local"`: never another process's cluster), with `ray.init` `options`.

    Ray waits a fixed 30 s for a new raylet to register; the first start on a fresh install, under load, can
    take longer, so a start that timed out is retried once."""
    import ray

    for attempt in range(2):
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, **options)
            return
        except Exception as err:  # Ray raises a bare Exception for this timeout
            ray.shutdown()
            if attempt or "timed out during startup" not in str(err):
                raise


@pytest.fixture(scope="session")
def start_local_ray_with_metrics() -> Callable[[int], None]:
    """`start_local_ray_with_metrics(port)`: the same local Ray, with the node's metrics agent serving Prometheus
    text on 127.0.0.1:`port` (`ray.init(_metrics_export_port=...)`) and exporting every second rather than every
    10 s (`metrics_report_interval_ms`; Ray floors it at 1 s)."""
    return _start_local_ray_with_metrics


def _start_local_ray_with_metrics(port: int) -> None:
    _start_local_ray(_metrics_export_port=port, _system_config={"metrics_report_interval_ms": 1000})


@pytest.fixture
def workdir():
    """A short private directory: Ray's socket paths must stay under 107 characters."""
    with tempfile.TemporaryDirectory(prefix="rs-launch-", dir="/tmp") as path:
        yield Path(path)
