"""The engine replica's compute thread and the host allocator setting it starts with."""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
import textwrap
import threading

import pytest

from deployments.compute_thread import ComputeThread

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


def test_every_call_runs_on_one_thread_that_is_not_the_callers():
    compute = ComputeThread()
    blocking = {compute.call(threading.get_ident) for _ in range(3)}

    async def awaited() -> set[int]:
        return set(await asyncio.gather(*(compute.run(threading.get_ident) for _ in range(8))))

    assert len(blocking) == 1
    assert asyncio.run(awaited()) == blocking
    assert blocking != {threading.get_ident()}


def test_calls_carry_the_callers_context_and_raise_its_errors():
    compute = ComputeThread()

    async def in_request() -> str:
        request_id.set("req-7")
        return await compute.run(request_id.get)

    assert asyncio.run(in_request()) == "req-7"
    with pytest.raises(ZeroDivisionError):
        compute.call(lambda: 1 / 0)
    assert compute.call(lambda: "still serving") == "still serving"
    assert compute.call(int, "ff", base=16) == 255  # keyword arguments pass through


PAGE_FAULTS = textwrap.dedent("""
    import resource, sys, threading
    import numpy as np
    from radix_core.host_memory import keep_freed_memory
    if sys.argv[1] == "kept":
        assert keep_freed_memory()
    def faults():  # activations of a few sizes, freed together, as a forward allocates them
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        blocks = [np.ones(mib << 20, dtype=np.uint8) for mib in (4, 12, 20, 8, 16)]
        del blocks
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    counts = []
    def compute():
        faults()
        counts.append(min(faults() for _ in range(5)))
    thread = threading.Thread(target=compute)
    thread.start()
    thread.join()
    print(counts[0])
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and Linux page-fault counts")
def test_kept_freed_memory_is_not_faulted_in_again():
    """By default glibc gives 60 MiB of freed blocks back to the kernel and faults them in again the next time
    (about 1,500 page faults); kept, they are reused."""
    def faults(setting: str) -> int:
        out = subprocess.run([sys.executable, "-c", PAGE_FAULTS, setting], capture_output=True, text=True,
                             check=True)
        return int(out.stdout)

    assert faults("default") > 1000
    assert faults("kept") < 50
