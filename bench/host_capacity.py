"""What the host side of a node sustains when the forward runs on an accelerator: the CPU each process of the served
application spent at full load, per 1,000 documents, and the documents/s a node of `cores` CPUs could feed its
engine replica with at those costs.

On this machine the forward runs on the same CPUs, so it is taken out by thread: the engine replica's threads that
ran it (the compute thread and its OpenMP workers, the `torch_threads` busiest of the replica) are counted apart
from its other threads (Ray's core worker, Serve's loops, the batcher). The compute thread's own host work between
forwards (cache lookup, plan, cache commit, finish) is counted with the forward there, so the arithmetic takes it
from the in-process stages instead (`feeder_ms`).

The arithmetic, for X documents/s on a node of `cores` CPUs, with each cost c in ms of CPU per 1,000 documents:
every process's CPU must fit in the cores, X * (sum of c) / 1e6 <= cores (ingress replicas scale out, so the
ingress's share may spread over any cores); and each process a node or replica has one of is held by its one
interpreter to one core: Ray Serve's proxy (one per node) X <= 1e6 / c, the IndexBuilder (one per engine replica)
likewise, and the engine replica (its feeder's stages and its other threads, one interpreter) likewise. The host
sustains the least of these; `bound` names which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from peer_vllm_processes import process_name, tagged

PROXY, INDEX_BUILDER = "ray::ProxyActor", "ray::IndexBuilder"
ENGINE = "ray::ServeReplica:radixserve:EngineReplica"
FORWARD_THREADS, OTHER_THREADS = "engine replica: forward threads", "engine replica: other threads"
FEEDER_STAGES = ("cache lookup", "plan", "cache commit", "finish")  # the compute thread's host work per batch
ONE_CORE = {"Ray Serve's proxy (one per node)": (PROXY,), "the IndexBuilder (one per engine replica)": (INDEX_BUILDER,),
            "the engine replica (feeder stages and other threads)": ("feeder", OTHER_THREADS)}


def thread_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of `pid`, to the nanosecond (`/proc/PID/task/TID/schedstat`; utime and stime
    count 10 ms ticks, coarse beside a small request's milliseconds)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except OSError:  # the thread ended
            continue
    return out


def process_seconds(tag: str) -> dict[int, tuple[str, float]]:
    """(name, CPU seconds of its live threads) of every process carrying `tag` (`peer_vllm_processes.tagged`); a
    thread that ends between two readings takes its time with it (a Ray worker's threads live as long as it)."""
    out = {}
    for pid in tagged(tag):
        try:
            out[pid] = (process_name(pid), sum(thread_seconds(pid).values()))
        except OSError:  # it exited meanwhile
            continue
    return out


class LoadCpu:
    """The CPU the tagged processes spend between construction and `per_1000(docs, torch_threads)`, by process
    name, the engine replica's split into its `torch_threads` busiest threads and the rest."""

    def __init__(self, tag: str):
        self.tag = tag
        self.processes = process_seconds(tag)
        self.engine_threads = {pid: thread_seconds(pid) for pid, (name, _) in self.processes.items() if name == ENGINE}

    def per_1000(self, docs: int, torch_threads: int) -> dict[str, float]:
        """Milliseconds of CPU per 1,000 documents, per process name (the engine replica as two rows)."""
        spent: dict[str, float] = {}
        for pid, (name, seconds) in process_seconds(self.tag).items():
            if name == ENGINE and pid in self.engine_threads:
                before = self.engine_threads[pid]
                used = sorted((s - before.get(tid, 0.0) for tid, s in thread_seconds(pid).items()), reverse=True)
                spent[FORWARD_THREADS] = spent.get(FORWARD_THREADS, 0.0) + sum(used[:torch_threads])
                spent[OTHER_THREADS] = spent.get(OTHER_THREADS, 0.0) + sum(used[torch_threads:])
                continue
            spent[name] = spent.get(name, 0.0) + seconds - self.processes.get(pid, (name, 0.0))[1]
        return {name: 1e6 * s / docs for name, s in sorted(spent.items(), key=lambda item: -item[1])}


@dataclass(frozen=True)
class Capacity:
    docs_s: float  # what the host side sustains
    bound: str  # what holds it there
    host_ms: float  # CPU per 1,000 documents of every process but the forward's threads, the feeder's stages in


def capacity(cpu_ms: dict[str, float], feeder_ms: float, cores: int) -> Capacity:
    """Documents/s the host side of a `cores`-CPU node sustains at these costs (module docstring): `cpu_ms` from
    `LoadCpu.per_1000`, `feeder_ms` the compute thread's host stages per 1,000 documents (`FEEDER_STAGES`)."""
    costs = {**{name: ms for name, ms in cpu_ms.items() if name != FORWARD_THREADS}, "feeder": feeder_ms}
    host_ms = sum(costs.values())
    limits = {f"all host CPU on {cores} cores": 1e6 * cores / host_ms}
    for what, names in ONE_CORE.items():
        ms = sum(costs.get(name, 0.0) for name in names)
        if ms > 0:
            limits[what] = 1e6 / ms
    bound = min(limits, key=limits.get)
    return Capacity(limits[bound], bound, host_ms)
