"""The processes of one server launch, found by a tag in their environment: what they did while the peer benchmark
(`bench/peer_vllm.py`) measured, and ending whatever of them outlives the server's own shutdown. `bench/host_path.py`
tags the Ray it starts the same way, to count each process's CPU at full load (`bench/host_capacity.py`).

Every process a server starts (Ray's daemons and workers, vLLM's engine core and worker) inherits its launcher's
environment, so a variable set there with a value of this launch's own (`TAG_ENV=<uuid>`) finds all of them and
nothing else: no process is ended by name.
"""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from pathlib import Path

TAG_ENV = "RADIXSERVE_PEER_BENCH"
THREAD_ENV = re.compile(r"(OMP_|GOMP_|KMP_|LD_PRELOAD|RAY_worker_niceness)")  # what places and ranks threads


def tagged(tag: str) -> list[int]:
    """Ids of the processes whose environment carries this launch's tag (all of them are this script's)."""
    mark, pids = f"{TAG_ENV}={tag}".encode(), []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            pass
    return pids


def kill_tagged(tag: str) -> list[str]:
    """SIGKILL every process still carrying `tag`; their names."""
    left = []
    for pid in tagged(tag):
        try:
            name = process_name(pid)
            os.kill(pid, signal.SIGKILL)
        except OSError:  # it exited meanwhile
            continue
        left.append(f"{pid} ({name})")
    return left


def process_name(pid: int) -> str:
    """A process title without its detail (`ray::ServeController`, `VLLM::Worker`, `ray-dashboard-JobHead-0`), a
    program's name (`raylet`), or python's module, script or `-c`."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    program = argv[0].split(" (")[0]
    if "python" not in Path(program).name:
        return program.split(".")[0] if program.startswith(("ray", "VLLM::")) else Path(program).name
    rest = argv[1:]
    while rest and rest[0].startswith("-") and rest[0] not in ("-c", "-m"):
        rest = rest[1:]
    if not rest or rest[0] == "-c":
        return "python" + (" -c" if rest else "")
    return "python " + (f"-m {rest[1]}" if rest[0] == "-m" else Path(rest[0]).name)


def proc_stat(pid: int) -> tuple[int, int, int]:
    """(utime + stime in ticks, nice, threads) from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[16]), int(fields[17])


class ProcessTable:
    """What a launch's processes did between construction and `finish`: per process name, their count, nice
    levels, threads, the CPUs their threads may run on (thread count per `Cpus_allowed_list`), CPU seconds, and
    the variables of their environment that place or rank threads (`THREAD_ENV`)."""

    def __init__(self, tag: str):
        self.tag = tag
        self.before = {}
        for pid in tagged(tag):
            try:
                self.before[pid] = proc_stat(pid)
            except OSError:  # it exited meanwhile
                pass

    def finish(self) -> dict[str, dict]:
        table: dict[str, dict] = {}
        for pid in tagged(self.tag):
            try:
                name, stat = process_name(pid), proc_stat(pid)
                affinity = Counter(self._cpus(task) for task in Path(f"/proc/{pid}/task").iterdir())
                environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            row = table.setdefault(name, {"processes": 0, "nice": set(), "threads": 0, "cpu_s": 0.0,
                                          "affinity": Counter(), "env": {}})
            row["env"].update(kv.split("=", 1) for kv in environ if THREAD_ENV.match(kv) and "=" in kv)
            ticks = stat[0] - self.before.get(pid, (0,))[0]
            row["processes"] += 1
            row["nice"].add(stat[1])
            row["threads"] += stat[2]
            row["cpu_s"] += ticks / os.sysconf("SC_CLK_TCK")
            row["affinity"].update(affinity)
        return {name: {**row, "nice": sorted(row["nice"]), "affinity": dict(row["affinity"])}
                for name, row in sorted(table.items(), key=lambda item: -item[1]["cpu_s"])}

    @staticmethod
    def _cpus(task: Path) -> str:
        status = (task / "status").read_text()
        return re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
