"""`radixserve serve [CONFIG]`: Ray Serve's own `serve run CONFIG`, with the checks and the shutdown it lacks.

`serve run` alone (Ray 2.60) shares ports silently (its proxies bind with SO_REUSEPORT, so a second one splits
traffic with the first), lets the gRPC proxy take 2 GiB messages, keeps running after the application failed to
deploy, and on SIGTERM tears everything down with requests in flight. This launcher, in order:

1. validates the config (Ray's `ServeDeploySchema`, and `AppArgs` for radixserve applications, every section);
2. refuses to start when the HTTP or gRPC port is taken, naming the port, the process holding it and the fix;
3. checks each application's model before Ray starts (a local path must be a model directory; a hub id needs the
   local Hugging Face cache or the network) and names the model it will serve (`RADIXSERVE_MODEL` included);
   where `RADIXSERVE_MODEL` overrides `args.model`, `serve run` gets a copy of CONFIG with that model in its args,
   so Ray's own log and the replicas of a cluster (which the variable does not reach) name the model served;
   with `$RAY_ADDRESS` set, waits up to `--ray-wait` seconds for something to accept a connection there and
   otherwise refuses to start, naming the address (`ray.init` would retry a dead address for ever);
4. sets `RAY_SERVE_GRPC_MAX_MESSAGE_SIZE` from `limits.max_request_bytes` (unless set): Ray reads it when its proxy
   imports `ray.serve._private.constants`, so it must be in the environment of the Ray it starts;
   sets `RAY_worker_niceness` from `placement.niceness` (unless set), so the Ray it starts runs Serve's proxies at
   the replicas' priority, not Ray's 15 (the replicas get theirs from their runtime_env on any cluster);
   sets `RAY_SERVE_CONTROL_LOOP_INTERVAL_S` to `CONTROL_LOOP_INTERVAL_S` (unless set): Serve's controller wakes
   every 0.1 s by default, and on a small CPU node those wake-ups (its own and the GCS calls each makes) stall a
   CPU forward's threads;
   raises the open-files soft limit to the hard one and says so, for the Ray it starts: every client connection is
   a file in Ray's proxies;
5. starts Ray (a local cluster of its own, or joins `$RAY_ADDRESS`) and runs `serve run CONFIG --non-blocking`,
   the real command, leaving out of its output the lines Ray prints for a normal state that read as failures
   (`RAY_NOISE`);
6. follows the applications: DEPLOY_FAILED shuts down, prints Ray's deploy error and, last, its one-line cause,
   and exits 1;
7. on SIGTERM or Ctrl-C drains: deletes the applications, so their replicas take no new requests and finish the
   ones they hold (each deployment's `graceful_shutdown_timeout_s`, bounded here by `--drain-timeout`), while
   the proxies stay up to deliver the answers; then shuts Serve down (its controller stops the proxies, then
   itself), then Ray, and exits 0. A second signal stops at once.
"""

from __future__ import annotations

import argparse
import errno
import os
import resource
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

GRPC_MESSAGE_SIZE_ENV = "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"
CONTROL_LOOP_ENV = "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"
# Seconds between Serve controller passes (health checks, autoscaling, replica start and stop): Ray's 0.1 took ~6%
# of a core on an idle 2-CPU node (the controller and the GCS), 0.5 ~2.4% (README, "Serve's controller").
CONTROL_LOOP_INTERVAL_S = "0.5"
# The proxy's limit sits this far above limits.max_request_bytes so the ingress's own RESOURCE_EXHAUSTED (naming
# max_request_bytes) answers messages just over it; gRPC's framing adds 5 bytes, metadata travels separately.
ENVELOPE_BYTES = 64 * 1024
APP_IMPORT_PATH = "deployments.app:build"
DEFAULT_HTTP = ("127.0.0.1", 8000)  # Ray's defaults when the config leaves http_options out
DEFAULT_GRPC_PORT = 9000
POLL_S = 1.0
# Between status checks once every application is RUNNING: each `serve.status()` is a call to Serve's controller and
# the GCS, and at POLL_S the launcher, the controller and the GCS took ~3% of a core on an idle 2-CPU node of the
# ~11% the whole server took; at 5 s the server took ~8% (README, "Serve's controller").
WATCH_S = 5.0
# Above the deployments' graceful_shutdown_timeout_s (Ray's default 20 s) so Ray's own bound ends a drain first.
DEFAULT_DRAIN_TIMEOUT_S = 30.0
# Long enough for a Ray head started beside the launcher (a pod's head container, `ray start` in a script) to listen.
DEFAULT_RAY_WAIT_S = 60.0
SHUTDOWN_TIMEOUT_S = 30.0  # Serve's own bound on its controller's shutdown (`serve.shutdown()`)
DEDUP_SKIP_ENV = "RAY_DEDUP_LOGS_SKIP_REGEX"  # lines of Ray's processes the driver does not print; read at `import ray`
# Ray 2.60's controller deregisters the autoscaling state of every fixed-size deployment it deploys or deletes,
# registered or not, and warns when it was not: so each start and stop of an application with an autoscaled
# deployment (the engine) beside a fixed-size one (the ingress) warns about the ingress. Ray's log files keep it.
RAY_NOISE = r"Cannot deregister autoscaling state for deployment"


class LaunchError(RuntimeError):
    """The server cannot start as configured; the message says why and what to change."""


def serve(config_path: str, drain_timeout_s: float, ray_wait_s: float = DEFAULT_RAY_WAIT_S) -> int:
    """Run CONFIG until it fails to deploy (exit 1) or a signal drains it (exit 0)."""
    skip_ray_noise()
    config = load_config(config_path)
    check_ports_free(config, config_path)
    for app in radixserve_apps(config):
        check_model(app["args"].model)
        print(f"radixserve: application {app['name']!r} serves model {app['args'].model!r}", flush=True)
    check_ray_address(os.environ.get("RAY_ADDRESS"), ray_wait_s)
    set_ray_environment(config)
    print(f"radixserve: open files limit {raise_open_files_limit()}", flush=True)
    stop = StopSignals()
    stop.install()
    with tempfile.TemporaryDirectory(prefix="radixserve-") as directory:
        _start_serve(config_for_serve_run(config_path, config, Path(directory)), stop)
    names = [app["name"] for app in config["applications"]]
    failure = _wait_for_stop_or_failure(names, stop)
    if not failure:
        _drain(names, drain_timeout_s, stop)
    _shutdown()
    if failure:  # after the shutdown's own output, so the cause is the last thing on the screen
        print(failure, file=sys.stderr, flush=True)
    return 1 if failure else 0


def load_config(config_path: str) -> dict[str, Any]:
    """The YAML, checked by Ray's schema and, for radixserve applications, by `AppArgs` (as `build` will): each
    such application's `args` is then its `AppArgs` (`RADIXSERVE_MODEL` applied)."""
    import yaml
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    from deployments.config import AppArgs

    path = Path(config_path)
    if not path.is_file():
        raise LaunchError(f"config file {config_path!r} does not exist; give the path of a Serve config such as "
                          f"serve_config.yaml")
    raw = yaml.safe_load(path.read_text()) or {}
    try:
        config = ServeDeploySchema.model_validate(raw).model_dump(mode="json")
        for app in radixserve_apps(config):
            app["args"] = AppArgs.model_validate(app["args"])
    except ValidationError as err:
        raise LaunchError(f"{config_path}: {err}") from err
    return config


def skip_ray_noise() -> None:
    """Add `RAY_NOISE` to the lines Ray's driver does not print (an operator's own pattern is kept); before Ray is
    imported, which reads it once."""
    if "ray" in sys.modules:
        raise RuntimeError(f"{DEDUP_SKIP_ENV} must be set before ray is imported")
    own = os.environ.get(DEDUP_SKIP_ENV)
    os.environ[DEDUP_SKIP_ENV] = f"{own}|{RAY_NOISE}" if own else RAY_NOISE


def config_for_serve_run(config_path: str, config: dict[str, Any], directory: Path) -> str:
    """The file `serve run` reads: `config_path`, or where `RADIXSERVE_MODEL` changed an application's model, a copy
    of it in `directory` with that model in the application's args (each radixserve application's `args.model` is
    then the model it serves)."""
    import yaml

    from deployments.config import MODEL_ENV

    raw = yaml.safe_load(Path(config_path).read_text())
    changed = False
    for written, validated in zip(raw["applications"], config["applications"]):
        args = written.get("args") or {}
        if validated["import_path"] == APP_IMPORT_PATH and args.get("model") != validated["args"].model:
            written["args"] = {**args, "model": validated["args"].model}
            changed = True
    if not changed:
        return config_path
    copy = directory / Path(config_path).name
    copy.write_text(yaml.safe_dump(raw, sort_keys=False))
    print(f"radixserve: serve run reads {copy}: {config_path} with the model from ${MODEL_ENV}", flush=True)
    return str(copy)


def radixserve_apps(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The config's radixserve applications (`load_config` validates their args)."""
    return [app for app in config["applications"] if app["import_path"] == APP_IMPORT_PATH]


def settings_yaml(config: dict[str, Any]) -> str:
    """The radixserve applications' validated args as YAML, keyed by application name: every setting with its
    value, the defaults included (each written once, in its section's type)."""
    import yaml

    return yaml.safe_dump({app["name"]: app["args"].model_dump(mode="json") for app in radixserve_apps(config)},
                          sort_keys=False)


def check_model(model: str) -> None:
    """Refuse at once a model the replicas could not load: a local path that is not a model directory, or a hub id
    that is neither in the local Hugging Face cache nor reachable (offline, or no network). Without this, each
    replica retries the hub for about a minute before the deploy fails."""
    from deployments.config import MODEL_ENV

    path = Path(model).expanduser()
    looks_local = path.exists() or model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
    fix = f"set {MODEL_ENV} (or args.model) to a local model directory, e.g. one made with " \
          "`radixserve make-tiny-model DIR`"
    if looks_local:
        if not path.is_dir():
            raise LaunchError(f"model path {model!r} does not exist or is not a directory: {fix}")
        if not (path / "config.json").is_file():
            raise LaunchError(f"model path {model!r} is not a model directory (no config.json in it): {fix}")
        return
    if _in_hub_cache(model):
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or not _hub_reachable():
        raise LaunchError(f"model {model!r} is a Hugging Face hub id that is not in the local cache, and the hub "
                          f"cannot be reached (offline or no network): download it where the hub is reachable, or "
                          f"{fix}")


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the hub (or $HF_ENDPOINT) opens within `timeout_s`."""
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def check_ray_address(address: str | None, wait_s: float) -> None:
    """With `address` a Ray cluster's `host:port` (`ray://host:port` for Ray Client), wait up to `wait_s` seconds for
    a TCP connection to open there; raise LaunchError when none does. No address, `auto`, `local`, another scheme or
    no port: nothing to check here (Ray resolves those itself)."""
    if not address or address in ("auto", "local"):
        return
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    if scheme not in ("", "ray") or not host or not port.isdigit():
        return
    deadline, error = time.monotonic() + wait_s, None
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(5.0, wait_s))):
                return
        except OSError as err:
            error = err
        if time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    raise LaunchError(
        f"RAY_ADDRESS={address}: no Ray cluster answered there within {wait_s:g} s (--ray-wait; last error: "
        f"{error}). Start the cluster there (`ray start --head --port {port}`), correct RAY_ADDRESS, or unset it "
        f"to serve on a Ray of the launcher's own.")


def listening_addresses(config: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(config key, host, port) of each port the proxies will bind: HTTP always, gRPC when it has servicers."""
    http = config.get("http_options") or {}
    grpc = config.get("grpc_options") or {}
    addresses = [("http_options.port", http.get("host") or DEFAULT_HTTP[0], http.get("port") or DEFAULT_HTTP[1])]
    if grpc.get("grpc_servicer_functions"):
        addresses.append(("grpc_options.port", "::", grpc.get("port") or DEFAULT_GRPC_PORT))
    return addresses


def check_ports_free(config: dict[str, Any], config_path: str) -> None:
    """Bind each port once, without SO_REUSEPORT (which Ray's proxies set, so they would share it)."""
    for key, host, port in listening_addresses(config):
        if _port_is_free(host, port):
            continue
        holder = _listener_of(port)
        raise LaunchError(
            f"port {port} ({key} in {config_path}) is already in use{f' by {holder}' if holder else ''}: another "
            f"radixserve/serve run (or a Ray cluster running Serve) is listening there, and a second server would "
            f"share the port and split its traffic. Stop that one first (Ctrl-C or SIGTERM for a launcher; "
            f"`ray stop` for a cluster started with `ray start`), or serve on another port by changing {key}.")


def _port_is_free(host: str, port: int) -> bool:
    """SO_REUSEADDR only: a port left in TIME_WAIT is free, one with a listener (any address) is not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # no IPv6 on this machine: gRPC binds IPv4 only
        return _port_is_free("0.0.0.0", port)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack, as gRPC's [::]
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return False
            raise LaunchError(f"cannot bind {host}:{port} to check it is free: {err}") from err
    return True


def _listener_of(port: int) -> str | None:
    """'pid N (command)' of a process of this user listening on `port`, from /proc; None when not visible."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                return f"pid {proc.name} ({command[:80]})"
        except OSError:
            continue
    return None


def set_grpc_message_limit(config: dict[str, Any]) -> None:
    """`RAY_SERVE_GRPC_MAX_MESSAGE_SIZE` = the largest `limits.max_request_bytes` + ENVELOPE_BYTES, unless already
    set."""
    limits = [app["args"].limits.max_request_bytes for app in radixserve_apps(config)]
    if limits and GRPC_MESSAGE_SIZE_ENV not in os.environ:
        os.environ[GRPC_MESSAGE_SIZE_ENV] = str(grpc_message_limit(max(limits)))


def set_ray_environment(config: dict[str, Any]) -> None:
    """What the Ray this process starts reads from its environment (step 4 of the module docstring), each unless
    already set: the gRPC message limit, the workers' nice level and Serve's control loop interval."""
    set_grpc_message_limit(config)
    set_worker_niceness(config)
    set_control_loop_interval()


def set_worker_niceness(config: dict[str, Any]) -> None:
    """`RAY_worker_niceness` = the lowest `placement.niceness` of the radixserve applications, unless already set."""
    from deployments.config import NICENESS_ENV

    levels = [app["args"].placement.niceness for app in radixserve_apps(config)]
    if levels and NICENESS_ENV not in os.environ:
        os.environ[NICENESS_ENV] = str(min(levels))


def set_control_loop_interval() -> None:
    """`RAY_SERVE_CONTROL_LOOP_INTERVAL_S` = `CONTROL_LOOP_INTERVAL_S`, unless already set."""
    os.environ.setdefault(CONTROL_LOOP_ENV, CONTROL_LOOP_INTERVAL_S)


def raise_open_files_limit() -> str:
    """The soft open-files limit (RLIMIT_NOFILE) raised to the hard one, for this process and the Ray it starts
    (Ray's proxies and replicas inherit it): each HTTP connection is a file in Ray's HTTP proxy, and the usual soft
    limit of 1,024 would refuse connections long before the ingress's request slots run out. Returns what to
    log."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return f"{soft} (the hard limit)"
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as err:
        return f"{soft}: raising it to the hard limit {hard} failed ({err}); raise it with `ulimit -n`"
    return f"{soft} -> {hard} (the hard limit)"


def grpc_message_limit(max_request_bytes: int) -> int:
    """The proxy's gRPC message limit for an ingress accepting `max_request_bytes` (gRPC's own cap is 2 GiB - 1)."""
    return min(max_request_bytes + ENVELOPE_BYTES, 2**31 - 1)


class StopSignals:
    """SIGTERM and SIGINT: the first asks for a drain (`requested` is set), a second for stopping at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = threading.Event()
        self.count = 0

    def install(self) -> None:
        for signum in self.SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 1:
            print(f"radixserve: {signal.Signals(signum).name} again: stopping now", file=sys.stderr, flush=True)
        self.requested.set()


def _start_serve(config_path: str, stop: StopSignals) -> None:
    """Connect to (or start) Ray, then put back our handlers over the ones `ray.init` sets; then `serve run`."""
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE
    from ray.serve.scripts import run

    # Without RAY_ADDRESS a Ray of its own ("local"): with no address ray.init would join the cluster whose address a
    # `ray start` left in Ray's temp directory, and wait on it where that cluster is gone.
    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", namespace=SERVE_NAMESPACE)
    stop.install()
    run.main(args=[config_path, "--non-blocking"], prog_name="serve run", standalone_mode=False)


def _wait_for_stop_or_failure(names: list[str], stop: StopSignals) -> str | None:
    """Block until a signal (None) or an application in DEPLOY_FAILED (its error, for stderr); the applications'
    status is checked every POLL_S, every WATCH_S while all are RUNNING."""
    from ray import serve

    reported: dict[str, str] = {}
    while not stop.requested.wait(WATCH_S if all(reported.get(n) == "RUNNING" for n in names) else POLL_S):
        statuses = serve.status().applications
        for name in names:
            app = statuses.get(name)
            status = app.status.value if app else "NOT_STARTED"
            if status != reported.get(name):
                reported[name] = status
                print(f"radixserve: application {name!r} is {status}", flush=True)
            if status == "DEPLOY_FAILED":
                return deploy_failure(name, app)
    return None


def deploy_failure(name: str, app: Any) -> str:
    """Ray's deploy errors (the application's and each failed deployment's, tracebacks with the cause last),
    then each cause again on one line, last, where one reads first."""
    messages = [app.message] + [d.message for _, d in sorted(app.deployments.items())
                                if d.status.value in ("DEPLOY_FAILED", "UNHEALTHY")]
    messages = [m.strip() for m in messages if m and m.strip()] or ["Ray gave no message; see the Serve logs"]
    causes = dict.fromkeys(m.splitlines()[-1].strip() for m in messages)
    return "\n".join(messages + [f"radixserve: application {name!r} failed to deploy:"]
                     + [f"  {cause}" for cause in causes]
                     + ["Fix that and start again (the full errors are above); stopping."])


def _drain(names: list[str], timeout_s: float, stop: StopSignals) -> None:
    """Delete the applications (replicas finish what they hold) and wait until they are gone or `timeout_s`."""
    from ray import serve

    print(f"radixserve: draining: no new requests; in-flight ones get up to {timeout_s:g} s", flush=True)
    for name in names:
        serve.delete(name, _blocking=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and stop.count < 2:
        remaining = set(names) & set(serve.status().applications)
        if not remaining:
            print("radixserve: drained", flush=True)
            return
        time.sleep(min(POLL_S / 4, max(0.0, deadline - time.monotonic())))
    print(f"radixserve: applications still stopping after {timeout_s:g} s; stopping them now", file=sys.stderr,
          flush=True)


def _shutdown(timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Shut Serve down, then Ray. The controller is asked without a call left waiting on it, then watched until it
    is gone (it stops the applications and proxies, then kills itself): `serve.shutdown()` waits in a call that
    the controller's own ray.kill ends, which Ray reports as a failed task ("ServeController.graceful_shutdown
    failed ... killed by ray.kill") although nothing failed."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    def controller() -> Any:
        try:
            return ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        except ValueError:  # no such actor (any more)
            return None

    if (running := controller()) is not None:
        ray.get(running.graceful_shutdown.remote(wait=False), timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while controller() is not None:
            if time.monotonic() > deadline:
                print(f"radixserve: Serve's controller still running after {timeout_s:g} s; stopping Ray",
                      file=sys.stderr, flush=True)
                break
            time.sleep(POLL_S / 4)
    ray.shutdown()


def add_subcommand(subparsers: Any) -> None:
    """`radixserve serve [CONFIG] [--drain-timeout S] [--ray-wait S]`, registered by radixserve.cli."""
    parser = subparsers.add_parser(
        "serve", help="run the server: serve run CONFIG, with port checks, a drain on SIGTERM, exit 1 on a failed "
                      "deploy",
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default="serve_config.yaml", help="Serve config (default: %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=DEFAULT_DRAIN_TIMEOUT_S, metavar="S",
                        help="longest wait for in-flight requests after SIGTERM/Ctrl-C (default: %(default)s)")
    parser.add_argument("--ray-wait", type=float, default=DEFAULT_RAY_WAIT_S, metavar="S",
                        help="with RAY_ADDRESS set, longest wait for that cluster to accept a connection before "
                             "refusing to start (default: %(default)s)")
    parser.add_argument("--print-config", action="store_true",
                        help="print each radixserve application's args as validated, every default filled in "
                             "(RADIXSERVE_MODEL applied), as YAML, and exit without starting anything")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.print_config:
            print(settings_yaml(load_config(args.config)), end="")
            return 0
        return serve(args.config, args.drain_timeout, args.ray_wait)
    except LaunchError as err:
        print(f"radixserve serve: {err}", file=sys.stderr)
        return 2
