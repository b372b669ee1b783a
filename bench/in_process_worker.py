"""The host-path benchmark's in-process candidates in a process of their own, without Ray.

A Ray driver is no place to time an engine: Serve's handle keeps threads of its own there (its router's event loop
and long-poll client) that take the GIL between the forward's kernels, and while the engine's thread waits for it
torch's OpenMP worker spins. Measured on 2 CPUs with the `tiny` preset: the same 1,000-document `Engine.rerank`
took 0.54-0.71 s in a plain process and 0.63-1.70 s in a driver with one Serve application deployed, the OpenMP
worker burning up to 1.5 CPU-seconds a call. So the benchmark's driver keeps the served candidates and this child
(started with `spawn`: nothing of the driver's Ray is inherited) runs the in-process ones when asked, one round at a
time, so that they still interleave with the served rounds.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

from host_stages import HostPath, StageClock
from padded_baseline import padded_rerank
from transformers import AutoModelForCausalLM, AutoTokenizer

from deployments.config import AppArgs
from radix_core.engine import Engine
from radix_core.host_memory import keep_freed_memory

CANDIDATES = ("in-process stages", "in-process engine", "plain transformers")


class InProcess:
    """The child: `run(candidate, key)` sends it the next round of the workload `key` for `candidate` and waits
    for it to finish; `stage_seconds()` returns and clears the stage clocks of the stages rounds run so far."""

    def __init__(self, model_dir: str, app_args: dict, padded_batch: int, rounds: dict[int, list[list[dict]]]):
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, model_dir, app_args, padded_batch, rounds),
                                        daemon=True)
        self._process.start()
        self._conn.recv()  # loaded and warmed up

    def runner(self, candidate: str, key: int) -> Callable[[], None]:
        return lambda: self._ask((candidate, key))

    def stage_seconds(self) -> list[dict[str, float]]:
        return self._ask(("clocks", None))

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(timeout=60)

    def _ask(self, message):
        self._conn.send(message)
        answer = self._conn.recv()
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _serve(conn, model_dir: str, app_args: dict, padded_batch: int, rounds: dict[int, list[list[dict]]]) -> None:
    keep_freed_memory()  # the host allocator the engine replica runs with
    settings = AppArgs.model_validate(app_args)
    engine = Engine.from_pretrained(model_dir, settings.engine, tasks=settings.tasks)
    engine.warm_up()  # as the replica does: kernels, and auto's cost model
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=engine.dtype).to(engine.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    path = HostPath(engine, settings.batching, settings.limits.max_request_tokens)
    clocks: list[dict[str, float]] = []
    calls = {"in-process stages": path.answer, "in-process engine": lambda r: engine.rerank(**r),
             "plain transformers": lambda r: padded_rerank(plain, tokenizer, r["query"], r["documents"], padded_batch)}
    pending = {(candidate, key): iter(sets) for candidate in CANDIDATES for key, sets in rounds.items()}
    conn.send("ready")
    try:
        while (message := conn.recv()) is not None:
            candidate, key = message
            if candidate == "clocks":
                conn.send(clocks[:])
                clocks.clear()
                continue
            try:
                if candidate == "in-process stages":
                    path.clock = StageClock()
                for request in next(pending[(candidate, key)]):
                    calls[candidate](request)
                if candidate == "in-process stages":
                    clocks.append(path.clock.seconds)
                conn.send(None)
            except Exception as error:  # noqa: BLE001  (sent to the driver, which raises it)
                conn.send(error)
    finally:
        path.close()
