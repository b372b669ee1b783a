"""In-process benchmark candidates in a child process of their own, without Ray.

A Ray driver is no place to time an engine: Serve's handle keeps threads of its own there (its router's event loop
and long-poll client) that take the GIL between the forward's kernels, and while the engine's thread waits for it
torch's OpenMP worker spins. Measured on 2 CPUs with the `tiny` preset: the same 1,000-document `Engine.rerank`
took 0.54-0.71 s in a plain process and 0.63-1.70 s in a driver with one Serve application deployed, the OpenMP
worker burning up to 1.5 CPU-seconds a call. So a served benchmark's driver keeps the served candidates, and a
child started with `spawn` (nothing of the driver's Ray inherited), with the host allocator the engine replica sets
(`radix_core.host_memory`), runs the in-process ones when asked, one round at a time, so that they still
interleave with the served rounds.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from radix_core.host_memory import keep_freed_memory

Setup = Callable[..., dict[str, Callable[..., Any]]]


class ChildProcess:
    """The named callables `setup(*args)` returns, built and called in the child; `setup` must be importable
    (a module-level function) and its arguments and the callables' answers picklable. A callable named `close`
    also runs when the driver closes the child, before it exits."""

    def __init__(self, setup: Setup, *args: Any):
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, setup, args), daemon=True)
        self._process.start()
        self._answer()  # built (and warmed up)

    @property
    def pid(self) -> int:
        return self._process.pid

    def call(self, name: str, *args: Any) -> Any:
        self._conn.send((name, args))
        return self._answer()

    def runner(self, name: str, *args: Any) -> Callable[[], Any]:
        return lambda: self.call(name, *args)

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(timeout=60)

    def _answer(self) -> Any:
        answer = self._conn.recv()
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _serve(conn, setup: Setup, args: tuple) -> None:
    keep_freed_memory()
    try:
        calls = setup(*args)
    except Exception as error:  # noqa: BLE001  (sent to the driver, which raises it)
        conn.send(error)
        return
    conn.send(None)
    while (message := conn.recv()) is not None:
        name, call_args = message
        try:
            conn.send(calls[name](*call_args))
        except Exception as error:  # noqa: BLE001
            conn.send(error)
    if "close" in calls:
        calls["close"]()
