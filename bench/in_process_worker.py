"""The served benchmarks' in-process candidates, built in a child process (`bench/child_process.py` says why).

`host_path_candidates` (`bench/host_path.py`) returns, per candidate, a call that runs the next round of one
workload: the served path's stages (`bench/host_stages.py`), `Engine.rerank` (one batch per request) and plain
transformers in padded batches; `clocks` returns and clears the stage clocks of the stages rounds run so far.
`serve_bench_candidate` (`bench/serve_bench.py`) returns `in-process`: a round (by its index) of the engine alone;
`peer_candidate` (`bench/peer_vllm.py`) returns `round`: every workload once on a freshly loaded engine;
`presence_candidate` (`bench/ray_presence.py`) returns `forward`: the same batches every call.
"""

from __future__ import annotations

import functools
import time

from host_stages import HostPath, StageClock
from padded_baseline import padded_rerank
from transformers import AutoModelForCausalLM, AutoTokenizer

from deployments.config import AppArgs
from radix_core.engine import Engine
from radix_core.tasks import TASKS

CANDIDATES = ("in-process stages", "in-process engine", "plain transformers")


def host_path_candidates(model_dir: str, app_args: dict, padded_batch: int, rounds: dict[int, list[list[dict]]]):
    """The candidates over `rounds[key]` (what each sends on its k-th call of workload `key`), and `clocks`."""
    settings = AppArgs.model_validate(app_args)
    engines = []
    for _ in range(2):  # one each for the stages and the library: a prefix cache shared by the two would see every
        # request twice, the second time admitting all its documents (a cost neither pays alone)
        engines.append(Engine.from_pretrained(model_dir, settings.engine, tasks=settings.tasks))
        engines[-1].warm_up()  # as the replica does: kernels, and auto's cost model
    path, engine = HostPath(engines[0], settings.batching, settings.limits.max_request_tokens), engines[1]
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=engine.dtype).to(engine.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    clocks: list[dict[str, float]] = []
    pending = {(candidate, key): iter(sets) for candidate in CANDIDATES for key, sets in rounds.items()}
    calls = {"in-process stages": path.answer, "in-process engine": lambda r: engine.rerank(**r),
             "plain transformers": lambda r: padded_rerank(plain, tokenizer, r["query"], r["documents"], padded_batch)}

    def run(candidate: str, key: int) -> None:
        if candidate == "in-process stages":
            path.clock = StageClock()
        for request in next(pending[(candidate, key)]):
            calls[candidate](request)
        if candidate == "in-process stages":
            clocks.append(path.clock.seconds)

    def taken() -> list[dict[str, float]]:
        out = clocks[:]
        clocks.clear()
        return out

    return {**{candidate: functools.partial(run, candidate) for candidate in CANDIDATES}, "clocks": taken,
            "close": path.close}  # the batcher's loops end before the interpreter does


def serve_bench_candidate(model_dir: str, cache_bytes: int | str, rounds: list[list[tuple[str, dict]]],
                          clients: int):
    """`in-process`, given a round's index: the engine with the prefix cache budget `cache_bytes`, warmed up as
    the replica is (radix `auto`'s cost model measured on this machine), on that round's requests; see
    `in_process`."""
    engine = Engine.from_pretrained(model_dir, device="cpu", radix="auto", prefix_cache_bytes=cache_bytes)
    engine.warm_up()
    jobs = [[(TASKS[task], TASKS[task].encode(engine.context, request)) for task, request in requests]
            for requests in rounds]
    return {"in-process": lambda r: in_process(engine, jobs[r], clients)}


def peer_candidate(model_dir: str, app_args: dict, warm_up: list[tuple[str, dict]],
                   workloads: list[tuple[str, str, int, list[dict]]]):
    """`round`: the engine as a freshly started replica has it (the application's `app_args`, warmed up, its prefix
    cache empty), answering the `warm_up` (task, request) pairs, then each (name, task, clients, requests) workload
    `clients` requests a batch, each workload's requests tokenized before its clock starts; returns `in_process`'s
    figures per workload name."""
    settings = AppArgs.model_validate(app_args)

    def encoded(engine: Engine, task: str, requests: list[dict]) -> list:
        return [(TASKS[task], TASKS[task].encode(engine.context, request)) for request in requests]

    def round_() -> dict[str, dict]:
        engine = Engine.from_pretrained(model_dir, settings.engine, tasks=settings.tasks)
        engine.warm_up()
        for task, request in warm_up:
            in_process(engine, encoded(engine, task, [request]), 1)
        return {name: in_process(engine, encoded(engine, task, requests), clients)
                for name, task, clients, requests in workloads}

    return {"round": round_}


def presence_candidate(model_dir: str, requests: list[tuple[str, dict]], per_batch: int):
    """`forward` (`bench/ray_presence.py`): the engine (radix `auto`, warmed up as the replica is, no prefix cache,
    so every pass computes the same rows) on `requests`, `per_batch` a batch; returns its seconds."""
    engine = Engine.from_pretrained(model_dir, device="cpu", radix="auto", prefix_cache_bytes=0)
    engine.warm_up()
    jobs = [TASKS[task].encode(engine.context, request) for task, request in requests]

    def forward() -> float:
        start = time.perf_counter()
        for i in range(0, len(jobs), per_batch):
            engine.run_jobs(jobs[i:i + per_batch])
        return time.perf_counter() - start

    return {"forward": forward}


def in_process(engine: Engine, jobs: list, clients: int) -> dict:
    """The engine alone: `clients` consecutive requests per batch; every request's latency is its batch's, and
    `answers` every request's result in order."""
    latencies, answers = [], []
    start = time.perf_counter()
    for i in range(0, len(jobs), clients):
        began = time.perf_counter()
        chunk = jobs[i:i + clients]
        answers += [task.merge(job, [p]) for (task, job), p in zip(chunk, engine.run_jobs([j for _, j in chunk]))]
        latencies += [time.perf_counter() - began] * len(chunk)
    seconds = time.perf_counter() - start
    tokens = sum(r.usage.input_tokens for r in answers)
    return {"seconds": seconds, "latencies": latencies, "tokens": tokens, "answers": answers,
            "compression": sum(r.usage.computed_tokens for r in answers) / tokens}
