"""`radixserve serve` (deployments/launcher.py): what it refuses before Ray starts (taken ports, bad args), the
gRPC message limit it hands Ray, the settings it prints, that the client package reaches it only lazily, and on a
real local Ray: SIGTERM lets in-flight requests finish, the proxy refuses oversized messages, a model that cannot
load ends the launcher with status 1 and the load error.

The serve tests run the launcher as a subprocess (its own local Ray under a private RAY_TMPDIR, free ports), so
they never touch another test's cluster; each bounds its waits.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest
import yaml
from serving import (ROOT, START_TIMEOUT_S, TEST_PORTS, Launched, ephemeral_ports, free_port, wait_until_serving,
                     write_config)

from deployments import launcher
from deployments.config import MODEL_ENV, NICENESS_ENV, AppArgs
from deployments.launcher import ENVELOPE_BYTES, GRPC_MESSAGE_SIZE_ENV, LaunchError

MAX_REQUEST_BYTES = 200_000
ACCESS_LINE = re.compile(r" -- .*\bOK [0-9.]+ms$", re.MULTILINE)  # Ray's "CALL rerank OK 12.3ms"
# one engine replica without autoscaling (serve_config.yaml autoscales it), half a CPU for each deployment
ONE_ENGINE = {"engine": {"num_replicas": 1, "autoscaling": None, "cpus": 0.5}, "ingress": {"cpus": 0.5}}


def listen_like_ray(port: int) -> socket.socket:
    """A listener with SO_REUSEPORT, as Ray's proxies bind: a second such bind would succeed and share the port."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", port))
    sock.listen()
    return sock


# --- before Ray starts ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["grpc_options.port", "http_options.port"])
def test_taken_port_refuses_start_naming_port_holder_and_fix(tmp_path, key):
    taken, other = free_port(), free_port()
    ports = (other, taken) if key == "grpc_options.port" else (taken, other)
    config = launcher.load_config(str(write_config(tmp_path / "c.yaml", *ports)))
    with listen_like_ray(taken), pytest.raises(LaunchError) as err:
        launcher.check_ports_free(config, "c.yaml")
    message = str(err.value)
    assert message.startswith(f"port {taken} ({key} in c.yaml) is already in use by pid {os.getpid()} (")
    assert "Stop that one first" in message and f"or serve on another port by changing {key}" in message


def test_free_ports_pass_the_check(tmp_path):
    launcher.check_ports_free(launcher.load_config(str(write_config(tmp_path / "c.yaml", free_port(),
                                                                    free_port()))), "c.yaml")


def test_cli_exits_2_with_the_message_when_the_port_is_taken(tmp_path):
    taken = free_port()
    path = write_config(tmp_path / "c.yaml", free_port(), taken)
    with listen_like_ray(taken):
        done = subprocess.run([sys.executable, "-m", "radixserve.cli", "serve", str(path)], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert f"radixserve serve: port {taken} (grpc_options.port in {path}) is already in use" in done.stderr


def test_unknown_app_arg_is_refused_by_name(tmp_path):
    with pytest.raises(LaunchError, match="unknown setting.*'max_batch_tokns' \\(did you mean "
                                          "'batching.max_batch_tokens'"):
        launcher.load_config(str(write_config(tmp_path / "c.yaml", 1, 2, max_batch_tokns=5)))
    with pytest.raises(LaunchError, match="'max_batch_tokns' \\(did you mean 'max_batch_tokens'\\?\\) for "
                                          "BatchingConfig"):
        launcher.load_config(str(write_config(tmp_path / "c.yaml", 1, 2, batching={"max_batch_tokns": 5})))


def test_grpc_message_limit_is_max_request_bytes_plus_envelope(tmp_path, monkeypatch):
    monkeypatch.setenv(GRPC_MESSAGE_SIZE_ENV, "")  # so the teardown restores what was there (nothing, usually)
    monkeypatch.delenv(GRPC_MESSAGE_SIZE_ENV)  # and the value set_grpc_message_limit writes does not leak
    config = launcher.load_config(str(write_config(tmp_path / "c.yaml", 1, 2, limits={"max_request_bytes": 1000})))
    launcher.set_grpc_message_limit(config)
    assert os.environ[GRPC_MESSAGE_SIZE_ENV] == str(1000 + ENVELOPE_BYTES)
    monkeypatch.setenv(GRPC_MESSAGE_SIZE_ENV, "4096")
    launcher.set_grpc_message_limit(config)
    assert os.environ[GRPC_MESSAGE_SIZE_ENV] == "4096", "an operator's own setting is kept"
    assert launcher.grpc_message_limit(2**31) == 2**31 - 1, "gRPC's limit is a signed 32-bit int"


def test_worker_niceness_is_the_placements_unless_set(tmp_path, monkeypatch):
    monkeypatch.setenv(NICENESS_ENV, "")  # restored at teardown; the value set_worker_niceness writes does not leak
    monkeypatch.delenv(NICENESS_ENV)
    config = launcher.load_config(str(write_config(tmp_path / "c.yaml", 1, 2, placement={"niceness": 5})))
    launcher.set_worker_niceness(config)
    assert os.environ[NICENESS_ENV] == "5"
    monkeypatch.setenv(NICENESS_ENV, "10")
    launcher.set_worker_niceness(config)
    assert os.environ[NICENESS_ENV] == "10", "an operator's own setting is kept"


def test_control_loop_interval_is_the_launchers_unless_set(monkeypatch):
    monkeypatch.setenv(launcher.CONTROL_LOOP_ENV, "")  # restored at teardown, so the value set here does not leak
    monkeypatch.delenv(launcher.CONTROL_LOOP_ENV)
    launcher.set_control_loop_interval()
    assert os.environ[launcher.CONTROL_LOOP_ENV] == launcher.CONTROL_LOOP_INTERVAL_S == "0.5"
    monkeypatch.setenv(launcher.CONTROL_LOOP_ENV, "0.1")
    launcher.set_control_loop_interval()
    assert os.environ[launcher.CONTROL_LOOP_ENV] == "0.1", "an operator's own setting is kept"


def test_print_config_shows_every_setting_and_reads_back(tmp_path, monkeypatch):
    """`radixserve serve --print-config`: the validated args with every default, `RADIXSERVE_MODEL` applied; the
    printed settings are a config that validates to the same `AppArgs`."""
    monkeypatch.setenv(MODEL_ENV, "/models/tiny")
    path = write_config(tmp_path / "c.yaml", 1, 2, batching={"max_queue_wait_s": 2.0},
                        tasks={"templates": {"embed": {"query": "Instruct: {instruction}\nQuery:{text}"}}})
    done = subprocess.run([sys.executable, "-m", "radixserve.cli", "serve", str(path), "--print-config"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    printed = yaml.safe_load(done.stdout)["radixserve"]
    assert printed["model"] == "/models/tiny" and printed["batching"]["max_queue_wait_s"] == 2.0
    assert printed["engine"]["radix_threshold"] == AppArgs(model="m").engine.radix_threshold  # a default, filled in
    (app,) = launcher.load_config(str(path))["applications"]
    assert AppArgs.model_validate(printed) == app["args"]


def test_serve_run_reads_the_config_with_the_model_served(tmp_path, monkeypatch):
    """`RADIXSERVE_MODEL` set: `serve run` gets a copy of the config with that model in the args (Ray logs the args
    it builds the application with); unset, the config itself."""
    path = write_config(tmp_path / "c.yaml", 1, 2, batching={"max_queue_wait_s": 2.0})
    copies = tmp_path / "copies"
    copies.mkdir()
    monkeypatch.delenv(MODEL_ENV, raising=False)
    assert launcher.config_for_serve_run(str(path), launcher.load_config(str(path)), copies) == str(path)
    monkeypatch.setenv(MODEL_ENV, "/models/tiny")
    copy = launcher.config_for_serve_run(str(path), launcher.load_config(str(path)), copies)
    assert copy == str(copies / "c.yaml")
    written = yaml.safe_load((copies / "c.yaml").read_text())
    assert written["applications"][0]["args"] == {**yaml.safe_load(path.read_text())["applications"][0]["args"],
                                                  "model": "/models/tiny"}


def test_the_client_package_imports_no_server_module():
    """`radixserve.cli` reaches the launcher through one lazy import (`radixserve serve`), so importing it (and the
    client) loads nothing of `deployments`: the dependency between the packages runs one way."""
    code = ("import sys, radixserve.cli, radixserve.client; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'deployments'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr



def test_the_config_check_loads_neither_torch_nor_transformers(tmp_path):
    """The launcher checks the configuration before Ray starts, in a fraction of a second: the config types and
    the packages' `__init__`s they pass through import nothing heavy."""
    path = write_config(tmp_path / "c.yaml", 1, 2, tasks={"max_items": 64}, engine={"radix": "full"})
    code = (f"import sys; from deployments import launcher; launcher.load_config({str(path)!r}); "
            "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)

# --- on a local Ray -------------------------------------------------------------------------------------------------

@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.parametrize("topology", ["split", "combined"])
def test_sigterm_drains_in_flight_requests_and_exits_0(tiny_model_dir, workdir, topology):
    """Combined, the replica that drains holds the engine and the batches its requests wait in."""
    from radixserve.client import ScoringClient

    grpc_port = free_port()
    # Requests wait up to 2 s for their batch, so they are still in flight when SIGTERM arrives.
    config = write_config(workdir / "c.yaml", free_port(), grpc_port,
                          batching={"batch_wait_timeout_s": 2.0, "index_builder": "inline"},
                          limits={"max_request_bytes": MAX_REQUEST_BYTES},
                          placement={**ONE_ENGINE, "topology": topology})
    launched = Launched(config, tiny_model_dir(), workdir)
    try:
        with ScoringClient(f"127.0.0.1:{grpc_port}", timeout_s=60, retries=0) as client:
            wait_until_serving(client, launched)
            check_message_limits(grpc_port)
            check_malformed_message(grpc_port)
            results: list[str] = []

            def call(i: int) -> None:
                try:
                    client.rerank("what is a trie", [f"document {i}", "bread"])
                    results.append("OK")
                except grpc.RpcError as err:
                    results.append(err.code().name)

            threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
            for thread in threads:
                thread.start()
            time.sleep(0.5)
            sent = time.monotonic()
            launched.proc.send_signal(signal.SIGTERM)
            for thread in threads:
                thread.join(90)
            status = launched.wait(90)
        assert results == ["OK"] * 16, launched.log[-3000:]
        assert status == 0 and time.monotonic() - sent < 60, launched.log[-3000:]
        assert "radixserve: drained" in launched.log
        assert not ACCESS_LINE.search(launched.log), "serve_config.yaml turns access logs off"
    finally:
        launched.kill()


# What a clean start and stop printed before: Ray's notes on normal states that read as failures (the launcher
# leaves the first out of its output; the second came from a shutdown call left waiting on the controller).
FAILURE_LOOKALIKES = ("Cannot deregister autoscaling state", "graceful_shutdown failed", "killed by `ray.kill`",
                      "Traceback", "ERROR")


@pytest.mark.serve
@pytest.mark.slow
def test_a_clean_start_and_stop_log_the_model_served_and_nothing_like_a_failure(tiny_model_dir, workdir):
    """The README's serve command (serve_config.yaml: an autoscaled engine beside a fixed ingress) with
    `RADIXSERVE_MODEL`, stopped with Ctrl-C: Ray's own build line names the model served, not the config's. Ray's
    temp directory names a cluster that is gone (as a `ray start` or a test's `Cluster` killed before its shutdown
    leaves it): without `RAY_ADDRESS` the launcher starts a Ray of its own rather than waiting on that one."""
    from radixserve.client import ScoringClient

    grpc_port, model = free_port(), tiny_model_dir()
    (workdir / "ray").mkdir()
    (workdir / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
    launched = Launched(write_config(workdir / "c.yaml", free_port(), grpc_port), model, workdir)
    try:
        with ScoringClient(f"127.0.0.1:{grpc_port}", timeout_s=60, retries=0) as client:
            wait_until_serving(client, launched)
        launched.proc.send_signal(signal.SIGINT)
        assert launched.wait(90) == 0, launched.log[-3000:]
    finally:
        launched.kill()
    log = launched.log
    assert f"Importing application 'radixserve' with arguments {{'model': '{model}'" in log, log[-3000:]
    assert "Qwen/Qwen3-Reranker-0.6B" not in log and "radixserve: drained" in log
    assert [line for line in log.splitlines() if any(words in line for words in FAILURE_LOOKALIKES)] == []


def check_message_limits(grpc_port: int) -> None:
    """Over the proxy's limit: gRPC refuses it (RESOURCE_EXHAUSTED) before any of our code or a replica sees it;
    between max_request_bytes and that limit: the ingress refuses it, naming max_request_bytes."""
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        rerank = channel.unary_unary("/radixserve.v1.Scoring/Rerank")
        from radixserve.v1 import scoring_pb2 as pb

        for size, expected in [(MAX_REQUEST_BYTES + 2 * ENVELOPE_BYTES, "larger than max"),
                               (MAX_REQUEST_BYTES + 100, "max_request_bytes")]:
            request = pb.RerankRequest(query="q", documents=["x" * size]).SerializeToString()
            with pytest.raises(grpc.RpcError) as err:
                rerank(request, timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and expected in err.value.details()


def check_malformed_message(grpc_port: int) -> None:
    """Bytes that are no RerankRequest: Ray's proxy fails to decode them before our code runs and answers UNKNOWN
    naming protobuf's DecodeError (README, gRPC API); the server keeps serving."""
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary("/radixserve.v1.Scoring/Rerank")(b"\xff\xff\xff\xff", timeout=30)
    assert err.value.code() == grpc.StatusCode.UNKNOWN and "DecodeError" in err.value.details(), err.value


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.parametrize("model, words", [
    ("/no/such/model", "model path '/no/such/model' does not exist"),
    ("./relative/missing", "model path './relative/missing' does not exist"),
    ("no-such-org/no-such-model", "is a Hugging Face hub id that is not in the local cache, and the hub cannot be "
                                  "reached"),
])
def test_a_model_that_cannot_load_is_refused_before_ray_starts(model, words, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LaunchError, match="RADIXSERVE_MODEL") as err:
        launcher.check_model(model)
    assert words in str(err.value)


def test_a_directory_without_a_config_is_no_model(tmp_path, tiny_model_dir):
    with pytest.raises(LaunchError, match="is not a model directory .no config.json in it."):
        launcher.check_model(str(tmp_path))
    launcher.check_model(str(tiny_model_dir()))  # a real one passes


def test_cli_refuses_a_missing_model_at_once_naming_the_fix(tmp_path):
    path = write_config(tmp_path / "c.yaml", free_port(), free_port())
    env = dict(os.environ, RADIXSERVE_MODEL=str(tmp_path / "no-such-model"))
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "radixserve.cli", "serve", str(path)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 2 and time.monotonic() - began < 60
    assert f"model path '{tmp_path / 'no-such-model'}' does not exist" in done.stderr


def test_a_ray_address_is_checked_for_a_listener_until_the_wait_ends():
    """Something listening passes (also when it starts listening during the wait); `auto`, `local`, no address and
    other schemes are left to Ray; a dead address is refused after the wait, naming it and the fixes."""
    for address in (None, "", "auto", "local", "anyscale://cluster", "headnode"):
        launcher.check_ray_address(address, wait_s=0)
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        launcher.check_ray_address(f"127.0.0.1:{port}", wait_s=0)
        launcher.check_ray_address(f"ray://127.0.0.1:{port}", wait_s=0)
    late = free_port()
    server: list[socket.socket] = []
    timer = threading.Timer(0.5, lambda: server.append(socket.create_server(("127.0.0.1", late))))
    timer.start()
    try:
        launcher.check_ray_address(f"127.0.0.1:{late}", wait_s=30)
    finally:
        timer.join()
        server[0].close()
    dead = free_port()
    began = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launcher.check_ray_address(f"ray://127.0.0.1:{dead}", wait_s=1.5)
    assert 1.5 <= time.monotonic() - began < 10
    assert str(err.value).startswith(f"RAY_ADDRESS=ray://127.0.0.1:{dead}: no Ray cluster answered there within 1.5 s")
    assert "correct RAY_ADDRESS, or unset it" in str(err.value)


def test_cli_refuses_a_ray_address_where_no_cluster_listens(tmp_path, tiny_model_dir):
    """Without the check `ray.init` retries the dead address for ever, printing GCS timeouts."""
    path, dead = write_config(tmp_path / "c.yaml", free_port(), free_port()), free_port()
    env = dict(os.environ, RADIXSERVE_MODEL=str(tiny_model_dir()), RAY_ADDRESS=f"127.0.0.1:{dead}")
    done = subprocess.run([sys.executable, "-m", "radixserve.cli", "serve", str(path), "--ray-wait", "2"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 2, done.stderr
    assert f"radixserve serve: RAY_ADDRESS=127.0.0.1:{dead}: no Ray cluster answered there within 2 s" in done.stderr


@pytest.mark.serve
@pytest.mark.slow
def test_model_that_cannot_load_exits_1_with_the_load_error_last(workdir):
    """A directory that passes the launcher's check (it has a config.json) but is no loadable model: the deploy
    fails in Ray, and the one-line cause is the last thing the launcher prints."""
    model = workdir / "broken-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = write_config(workdir / "c.yaml", free_port(), free_port(), placement=ONE_ENGINE)
    launched = Launched(config, model, workdir)
    try:
        assert launched.wait(START_TIMEOUT_S) == 1, launched.log[-3000:]
        assert f"radixserve: application 'radixserve' serves model '{model}'" in launched.log
        summary = launched.log.split("radixserve: application 'radixserve' failed to deploy:", 1)[1]
        assert str(model) in summary and summary.rstrip().endswith("stopping.")
    finally:
        launched.kill()


def test_servers_under_test_get_ports_outside_the_ranges_ray_and_the_kernel_pick_from():
    """A port the kernel picked (port 0) can be taken by a connection Ray opens before the server binds it."""
    ports = {free_port() for _ in range(20)}
    assert all(TEST_PORTS[0] <= port < ephemeral_ports()[0] for port in ports), ports
