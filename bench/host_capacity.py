"""What the host side of a node sustains when the forward runs on an accelerator: the CPU each process of the served
application spends per 1,000 documents at full load beyond what it spends idle, and the documents/s a node of
`cores` CPUs could feed its engine replica with at those costs.

Two parts of a process's CPU are told apart. What it spends idle (Ray's daemons, each worker's core worker waking
every 10 ms, the controller's loop) goes with the wall time, whatever the documents; it is read over `idle_s`
seconds before the load, as a share of a core. What it spends beyond that at full load goes with the documents: a
process's CPU over the load less its idle share times the load's wall time, per 1,000 documents. Read together, a
slow forward (the `bench` preset on these CPUs: ~20 s per 1,000 documents) would charge each document with 20 s of
the daemons' idle work.

On this machine the forward runs on the same CPUs, so it is taken out by thread: the engine replica's threads that
ran it (the compute thread and its OpenMP workers, the `torch_threads` busiest of the replica over the load) are
counted apart from its other threads (Ray's core worker, Serve's loops, the batcher). The compute thread's own host
work between forwards (cache lookup, plan, cache commit, finish) is counted with the forward there, so the arithmetic
takes it from the in-process stages instead (`feeder_ms`).

The arithmetic, for X documents/s on a node of `cores` CPUs, with each process's cost c in ms of CPU per 1,000
documents and idle share i of a core: every process's CPU must fit in the cores, X * (sum of c) / 1e6 <= cores -
(sum of i) (ingress replicas scale out, so the ingress's share may spread over any cores); and each process a node
or replica has one of is held by its one interpreter to one core: Ray Serve's proxy (one per node) X <= (1 - i) *
1e6 / c, the IndexBuilder (one per engine replica) likewise, and the engine replica (its feeder's stages and its
other threads, one interpreter) likewise. The host sustains the least of these; `bound` names which.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from peer_vllm_processes import process_name, tagged

PROXY, INDEX_BUILDER = "ray::ProxyActor", "ray::IndexBuilder"
ENGINE = "ray::ServeReplica:radixserve:EngineReplica"
INGRESS = "ray::ServeReplica:radixserve:Ingress"  # also the engine replica's process under `topology: combined`
FORWARD_THREADS, OTHER_THREADS = "engine replica: forward threads", "engine replica: other threads"
FEEDER_STAGES = ("cache lookup", "plan", "cache commit", "finish")  # the compute thread's host work per batch
ONE_CORE = {"Ray Serve's proxy (one per node)": (PROXY,), "the IndexBuilder (one per engine replica)": (INDEX_BUILDER,),
            "the engine replica (feeder stages and other threads)": ("feeder", OTHER_THREADS)}

Snapshot = dict[int, tuple[str, dict[int, float]]]  # pid -> (process name, CPU seconds of each live thread)


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


def snapshot(tag: str) -> Snapshot:
    """Every process carrying `tag` (`peer_vllm_processes.tagged`) and its live threads' CPU seconds; a thread that
    ends between two snapshots takes its time with it (a Ray worker's threads live as long as it)."""
    out = {}
    for pid in tagged(tag):
        try:
            out[pid] = (process_name(pid), thread_seconds(pid))
        except OSError:  # it exited meanwhile
            continue
    return out


def spent(before: Snapshot, after: Snapshot, engine: str, forward: set[int]) -> dict[str, float]:
    """CPU seconds between two snapshots per process name, the `engine` process's as its `forward` threads and the
    rest."""
    out: dict[str, float] = {}
    for pid, (name, threads) in after.items():
        earlier = before.get(pid, (name, {}))[1]
        for tid, seconds in threads.items():
            row = (FORWARD_THREADS if tid in forward else OTHER_THREADS) if name == engine else name
            out[row] = out.get(row, 0.0) + seconds - earlier.get(tid, 0.0)
    return out


@dataclass(frozen=True)
class Cost:
    ms: float  # CPU per 1,000 documents beyond the idle share
    idle: float  # share of a core spent idle


class LoadCpu:
    """Construction reads the tagged processes idle for `idle_s` seconds, then marks the load's start;
    `per_1000(docs, torch_threads)` gives each process's `Cost` over the load since. `engine`: the name of the
    process the engine replica runs in (the ingress's under `placement.topology: combined`)."""

    def __init__(self, tag: str, idle_s: float, engine: str = ENGINE):
        self.tag, self.engine = tag, engine
        idle_start, started = snapshot(tag), time.perf_counter()
        time.sleep(idle_s)
        self.idle = (idle_start, snapshot(tag), time.perf_counter() - started)
        self.start, self.started = self.idle[1], time.perf_counter()

    def per_1000(self, docs: int, torch_threads: int) -> dict[str, Cost]:
        end, wall = snapshot(self.tag), time.perf_counter() - self.started
        load = [(tid, seconds - self.start.get(pid, (name, {}))[1].get(tid, 0.0))
                for pid, (name, threads) in end.items() if name == self.engine for tid, seconds in threads.items()]
        forward = {tid for tid, _ in sorted(load, key=lambda item: -item[1])[:torch_threads]}
        before, idle_end, idle_s = self.idle
        idle = {name: s / idle_s for name, s in spent(before, idle_end, self.engine, forward).items()}
        costs = {name: Cost(max(0.0, 1e6 * (s - idle.get(name, 0.0) * wall) / docs), idle.get(name, 0.0))
                 for name, s in spent(self.start, end, self.engine, forward).items()}
        return dict(sorted(costs.items(), key=lambda item: -item[1].ms))


@dataclass(frozen=True)
class Capacity:
    docs_s: float  # what the host side sustains
    bound: str  # what holds it there
    host_ms: float  # CPU per 1,000 documents of every process but the forward's threads, the feeder's stages in
    idle_cores: float  # cores the processes take idle


def capacity(costs: dict[str, Cost], feeder_ms: float, cores: int) -> Capacity:
    """Documents/s the host side of a `cores`-CPU node sustains at these costs (module docstring): `costs` from
    `LoadCpu.per_1000`, `feeder_ms` the compute thread's host stages per 1,000 documents (`FEEDER_STAGES`)."""
    costs = {**{name: c for name, c in costs.items() if name != FORWARD_THREADS}, "feeder": Cost(feeder_ms, 0.0)}
    host_ms, idle = sum(c.ms for c in costs.values()), sum(c.idle for c in costs.values())
    limits = {f"all host CPU on {cores} cores": 1e6 * (cores - idle) / host_ms}
    for what, names in ONE_CORE.items():
        ms = sum(costs[name].ms for name in names if name in costs)
        if ms > 0:
            limits[what] = 1e6 * (1 - sum(costs[name].idle for name in names if name in costs)) / ms
    bound = min(limits, key=limits.get)
    return Capacity(limits[bound], bound, host_ms, idle)
