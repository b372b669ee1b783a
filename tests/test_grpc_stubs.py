"""The checked-in gRPC stubs are what the .protos generate, and serve_config.yaml's servicer functions import.

Fails after an edit of proto/radixserve/v1/scoring.proto or proto/tei/v1/tei.proto until the stubs are regenerated
(commands in radixserve/v1/__init__.py and radixserve/tei/v1/__init__.py), and when grpcio-tools is not the pinned
version (its protoc writes its own version into the files).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray.serve.config import gRPCOptions

ROOT = Path(__file__).resolve().parents[1]
# (the protoc include flag, the .proto, where its stubs are checked in)
PROTOS = {"radixserve.v1": ("-Iproto", Path("proto/radixserve/v1/scoring.proto"), Path("radixserve/v1")),
          "tei.v1": ("-Iradixserve=proto", Path("proto/tei/v1/tei.proto"), Path("radixserve/tei/v1"))}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("package", PROTOS)
def test_checked_in_stubs_match_a_fresh_generation(package, tmp_path):
    include, proto, stubs = PROTOS[package]
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", include, f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", str(proto)], cwd=ROOT, check=True, timeout=50)
    names = [f"{proto.stem}_pb2.py", f"{proto.stem}_pb2_grpc.py"]
    for name in names:
        fresh = (tmp_path / stubs / name).read_text()
        assert (ROOT / stubs / name).read_text() == fresh, (
            f"{stubs / name} differs from what {proto} generates: regenerate it ({stubs / '__init__.py'})")


def test_serve_config_servicer_functions_import():
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    servicers = gRPCOptions(**config["grpc_options"]).grpc_servicer_func_callable
    assert [f.__name__ for f in servicers] == [
        "install", "add_ScoringServicer_to_server", "add_HealthServicer_to_server", "add_InfoServicer_to_server",
        "add_EmbedServicer_to_server", "add_PredictServicer_to_server", "add_RerankServicer_to_server",
        "add_TokenizeServicer_to_server"]
