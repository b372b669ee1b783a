"""The GPU check's report: each check and timing is written to the markdown file (and printed) as it comes, so a
run that dies or is stopped still leaves what it found; `Report.failed` says whether the run should exit non-zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Check:
    name: str
    shape: str
    dtype: str
    error: float | None  # None: not run (see note)
    tolerance: float
    note: str = ""
    supported: bool = True  # False: this machine cannot run it (e.g. one GPU for a second-device check)

    @property
    def passed(self) -> bool:
        return self.error is not None and self.error <= self.tolerance

    @property
    def result(self) -> str:
        if self.error is not None:
            return "PASS" if self.passed else "FAIL"
        return "FAIL (not run)" if self.supported else "not run (unsupported here)"


@dataclass
class Timing:
    name: str
    shape: str
    ms: float
    note: str = ""


class Report:
    """Appends to `path` and flushes after every line."""

    def __init__(self, path: Path, header: list[str]):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w")
        self.failures = 0
        self._write(*header)

    def section(self, title: str, columns: list[str]) -> None:
        self._write("", f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns))

    def check(self, c: Check) -> None:
        """A supported check that did not run counts as a failure: the machine should have run it."""
        self.failures += not c.passed and c.supported
        error = "-" if c.error is None else f"{c.error:.2e}"
        note = f" ({c.note})" if c.note else ""
        self._write(f"| {c.name} | {c.shape} | {c.dtype} | {error} | {c.tolerance:.0e} | {c.result}{note} |")

    def timing(self, t: Timing) -> None:
        self._write(f"| {t.name} | {t.shape} | {t.ms:.3f} | {t.note} |")

    def guarded(self, name: str, shape: str, dtype: str, tolerance: float, measure: Callable[[], float]) -> None:
        """Run `measure() -> error` as one check; an exception is recorded as that check's failure."""
        try:
            self.check(Check(name, shape, dtype, measure(), tolerance))
        except Exception as err:  # a crash is a finding (e.g. a kernel refusing a shape); the others go on
            self.check(Check(name, shape, dtype, None, tolerance, _reason(err)))

    def timed(self, name: str, shape: str, measure: Callable[[], tuple[float, str]]) -> None:
        """Run `measure() -> (ms, note)` as one timing; an exception is recorded as that timing's failure, and
        the timings after it still run."""
        try:
            ms, note = measure()
        except Exception as err:
            self.failures += 1
            self._write(f"| {name} | {shape} | - | FAIL ({_reason(err)}) |")
            return
        self.timing(Timing(name, shape, ms, note))

    def failed(self, part: str, err: Exception) -> None:
        """A part that raised outside its guarded checks and timings (e.g. while building its inputs): counted as
        a failure; the run goes on with the next part."""
        self.failures += 1
        self._write("", f"**{part} stopped**: {_reason(err)}")

    def close(self, seconds: float) -> None:
        self._write("", f"Finished in {seconds:.0f} s; {self.failures} failed or not run. "
                        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        self._file.close()

    def _write(self, *lines: str) -> None:
        for line in lines:
            print(line, flush=True)
            self._file.write(line + "\n")
        self._file.flush()


def _reason(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err)[:100]}"


CHECK_COLUMNS = ["check", "shape", "dtype", "max error", "tolerance", "result"]
TIMING_COLUMNS = ["op", "shape", "ms", "note"]
