"""The load driver of the served benchmarks: requests sent through a call, closed-loop or open-loop, each answer
recorded as an `Outcome`.

* closed loop (`closed_loop`): a fixed number of clients, each sending its next request when its last one is
  answered, until a time is up or the requests run out; what a server sustains (`serve_bench.py` sends every
  request of its stream once, `load_bench.py` measures capacity);
* open loop (`open_loop`): Poisson arrivals at a fixed rate whatever the answers, as independent users send them;
  what a server does under a load it did not choose (`load_bench.py`'s sustained and overload phases).

`call(request)` sends one request and returns the tokens the benchmark accounts for its answer (`serve_bench.py`:
input tokens; `load_bench.py`: rows the engine computed). An exception is the answer's code: a gRPC error's status
name (`RESOURCE_EXHAUSTED`), else the exception's type name.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from tqdm import tqdm


@dataclass(frozen=True)
class Outcome:
    """One request's answer as its client saw it."""

    code: str  # "OK", or the error's status or type name
    latency_s: float
    sent: float  # time.perf_counter() when it was sent
    tokens: int  # what the call returned (0 unless OK)
    error: str = ""  # the exception's repr, unless OK


class LoadDriver:
    """Sends `requests` (an iterator: `itertools.cycle` never runs out) through `call`, from `threads` threads at
    most in the open loop."""

    def __init__(self, call: Callable[[Any], int], requests: Iterator[Any], threads: int = 64):
        self.call = call
        self.requests = requests
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(threads)

    def one(self) -> Outcome:
        """Send the next request and wait for its answer (the requests must not have run out)."""
        return self._send(self._next())

    def closed_loop(self, clients: int, seconds: float = math.inf, label: str = "",
                    total: int | None = None) -> list[Outcome]:
        """`clients` threads each sending one request at a time, until `seconds` pass or the requests run out
        (`total`, when known, sizes the progress bar)."""
        end = time.perf_counter() + seconds
        results, bar = [], tqdm(total=total, desc=label, unit="req")

        def client():
            while time.perf_counter() < end:
                request = self._next()
                if request is None:
                    return
                outcome = self._send(request)
                with self.lock:
                    results.append(outcome)
                    bar.update()

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bar.close()
        return results

    def open_loop(self, rate: float, seconds: float, label: str, rng: np.random.Generator) -> list[Outcome]:
        """Poisson arrivals at `rate` per second for `seconds`; waits for every answer."""
        futures, start = [], time.perf_counter()
        at = start
        with tqdm(total=round(rate * seconds), desc=label, unit="req") as bar:
            while at - start < seconds:
                at += rng.exponential(1 / rate)
                time.sleep(max(0.0, at - time.perf_counter()))
                futures.append(self.pool.submit(self.one))
                bar.update()
            return [f.result() for f in futures]

    def _next(self) -> Any:
        """The next request, or None when they ran out."""
        with self.lock:
            return next(self.requests, None)

    def _send(self, request: Any) -> Outcome:
        sent = time.perf_counter()
        try:
            tokens = self.call(request)
        except Exception as err:  # the answer's code; the benchmark decides what a failure means
            code = err.code().name if isinstance(err, grpc.RpcError) else type(err).__name__
            return Outcome(code, time.perf_counter() - sent, sent, 0, repr(err))
        return Outcome("OK", time.perf_counter() - sent, sent, tokens)
