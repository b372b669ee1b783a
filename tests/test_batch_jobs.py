"""`radixserve embed/rerank --input`: batch jobs against the application on a local Ray (gRPC proxy on loopback),
through the CLI in-process. The .npy rows equal single Embed calls; a row the server refuses stops the job with
exit status 1, the rows before it kept and named in the summary; the rerun after the fix skips what was written
and completes the file. Offline: an interrupted last line is dropped before resuming.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ray import serve

from deployments.app import build
from radixserve import cli
from radixserve.batch_jobs import _complete_lines
from radixserve.client import ScoringClient

TEXTS = [f"text {i}: prefixes shared {'again ' * (i % 4)}" for i in range(11)]
DOCS = ["a radix tree stores strings", "bread rises", "tries share prefixes"]


@pytest.fixture(scope="module")
def address(tiny_model_dir, serve_cluster):
    port = serve_cluster.ensure().grpc_port
    try:
        serve.run(build({"model": str(tiny_model_dir("qwen3", "causal_lm")),
                         "placement": {"engine": {"cpus": 0.5}, "ingress": {"cpus": 0.5}}}),
                  name="radixserve", route_prefix="/")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub, deadline = health_pb2_grpc.HealthStub(channel), time.monotonic() + 90
            while True:
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1:
                        break
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline, "the application did not serve within 90 s"
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        serve_cluster.clear()


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_embed_job_writes_rows_equal_to_single_calls_and_resumes(address, tmp_path, capsys):
    source = write_jsonl(tmp_path / "texts.jsonl", TEXTS[:5] + [{"text": t} for t in TEXTS[5:]])
    out = tmp_path / "vectors.npy"
    args = ["embed", "--address", address, "--input", str(source), "--output", str(out), "--batch-size", "3",
            "--concurrency", "3"]
    assert cli.main(args) == 0
    vectors = np.load(out)
    with ScoringClient(address) as client:
        single = np.asarray([client.embed([t]).embeddings[0].values for t in TEXTS], dtype=np.float32)
    assert vectors.shape == single.shape and np.allclose(vectors, single, atol=1e-5)
    assert "11 rows written" in capsys.readouterr().err

    bad = write_jsonl(tmp_path / "bad.jsonl", TEXTS[:6] + ["word " * 5000] + TEXTS[6:])  # row 6: over the limit
    out2 = tmp_path / "vectors2.npy"
    args2 = ["embed", "--address", address, "--input", str(bad), "--output", str(out2), "--batch-size", "2",
             "--no-truncate"]
    assert cli.main(args2) == 1
    err = capsys.readouterr().err
    assert "failed: rows 6-7: INVALID_ARGUMENT" in err and "6 rows written" in err and not out2.exists()
    write_jsonl(bad, TEXTS[:6] + ["now a text"] + TEXTS[6:])
    assert cli.main(args2) == 0
    assert "6 rows written" in capsys.readouterr().err.replace("(6 already there)", "")  # rows 6..11 this time
    assert np.allclose(np.load(out2)[:6], single[:6], atol=1e-5) and np.load(out2).shape == (12, single.shape[1])


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rerank_job_writes_one_response_per_query(address, tmp_path, capsys):
    rows = [{"query": f"query {i}", "documents": DOCS} for i in range(4)]
    source = write_jsonl(tmp_path / "queries.jsonl", rows)
    out = tmp_path / "ranked.jsonl"
    assert cli.main(["rerank", "--address", address, "--input", str(source), "--output", str(out),
                     "--top-n", "2"]) == 0
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["row"] for a in answers] == [0, 1, 2, 3]
    assert all(len(a["results"]) == 2 and a["usage"]["computed_tokens"] > 0 for a in answers)
    assert cli.main(["rerank", "--address", address, "--input", str(source), "--output", str(out)]) == 0
    assert "0 rows written" in capsys.readouterr().err and len(out.read_text().splitlines()) == 4


def test_an_interrupted_last_line_is_dropped_before_resuming(tmp_path):
    out = tmp_path / "ranked.jsonl"
    out.write_text('{"row": 0}\n{"row": 1}\n{"row": 2, "resu')
    assert _complete_lines(out) == 2 and out.read_text() == '{"row": 0}\n{"row": 1}\n'
    assert _complete_lines(tmp_path / "missing.jsonl") == 0
