"""The benchmarks' timer: interleaved rounds whose order rotates, median with min and max."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from timing import interleaved_timings  # noqa: E402  (bench/ is not a package)


def test_every_runner_leads_a_round_and_the_range_holds_the_median():
    calls = []
    runners = {name: (lambda name=name: calls.append(name)) for name in ("off", "mlp", "full")}
    timings = interleaved_timings(runners, repeats=6, warmup=False)
    rounds = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    assert [r[0] for r in rounds] == ["off", "mlp", "full", "off", "mlp", "full"]
    assert all(sorted(r) == ["full", "mlp", "off"] for r in rounds)
    assert all(t.low <= t.median <= t.high for t in timings.values())
