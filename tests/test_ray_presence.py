"""`bench/ray_presence.py`'s accounting of what else ran beside the forward: per process name, kernel work queue
threads as one, the benchmark's own processes left out, and its counts read from this machine's /proc."""

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from ray_presence import node_activity, process_counts  # noqa: E402  (bench/ is not a package)

TICK = os.sysconf("SC_CLK_TCK")


def test_activity_sums_a_name_groups_kernel_workers_and_leaves_out_the_benchmark():
    before = {10: ("raylet", 100, 5), 11: ("ray::IDLE", 50, 0), 12: ("ray::IDLE", 70, 1),
              20: ("kworker/0:0-events", 1000, 0), 30: ("python", 5, 0), 40: ("gcs_server", 0, 0)}
    after = {10: ("raylet", 300, 5 + TICK), 11: ("ray::IDLE", 90, 0), 12: ("ray::IDLE", 130, 1),
             20: ("kworker/0:0-mm_percpu_wq", 1400, 0), 21: ("kworker/1:0-events", 200, 0),
             30: ("python", 905, 3 * TICK), 40: ("gcs_server", 0, 0)}
    rows = node_activity(before, after, seconds=2.0, skip={30})
    assert rows["raylet"] == (100.0, 0.5)
    assert rows["ray::IDLE"] == (50.0, 0.0)  # both processes of the name: (40 + 60) / 2 s
    # one kworker renamed by the work it ran last, one that started during the window: 400 + 200 switches
    assert rows["kworker/* (the kernel's work queues)"] == (300.0, 0.0)
    assert "python" not in rows  # the benchmark's own process
    assert "gcs_server" not in rows  # never woke


def test_process_counts_read_this_process_from_proc():
    counts = process_counts()
    name, switches, ticks = counts[os.getpid()]
    assert name == Path("/proc/self/comm").read_text().strip()
    assert switches > 0 and ticks >= 0
