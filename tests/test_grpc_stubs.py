"""The checked-in gRPC stubs are what the .proto generates, and serve_config.yaml's servicer functions import.

Fails after an edit of proto/radixserve/v1/scoring.proto until the stubs are regenerated (command in
radixserve/v1/__init__.py), and when grpcio-tools is not the pinned version (its protoc writes its own version into
the files).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray.serve.config import gRPCOptions

ROOT = Path(__file__).resolve().parents[1]
PROTO = Path("proto/radixserve/v1/scoring.proto")
STUBS = ("scoring_pb2.py", "scoring_pb2_grpc.py")


@pytest.mark.timeout(60)
def test_checked_in_stubs_match_a_fresh_generation(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Iproto", f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", str(PROTO)], cwd=ROOT, check=True, timeout=50)
    for name in STUBS:
        fresh = (tmp_path / "radixserve" / "v1" / name).read_text()
        assert (ROOT / "radixserve" / "v1" / name).read_text() == fresh, (
            f"radixserve/v1/{name} differs from what {PROTO} generates: regenerate it (radixserve/v1/__init__.py)")


def test_serve_config_servicer_functions_import():
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    servicers = gRPCOptions(**config["grpc_options"]).grpc_servicer_func_callable
    assert [f.__name__ for f in servicers] == ["add_ScoringServicer_to_server", "add_HealthServicer_to_server"]
