"""Offline batch jobs against a running server: `radixserve embed --input` and `radixserve rerank --input`.

    radixserve embed --input texts.jsonl --output embeddings.npy --batch-size 64 --concurrency 8 --dimensions 256
    radixserve rerank --input queries.jsonl --output ranked.jsonl --top-n 10

`embed` reads one text per line (a JSON string, or an object with `text`) and writes a float32 `.npy` of shape
(rows, dimensions), row i the embedding of line i; texts travel `--batch-size` per Embed call. `rerank` reads one
object per line with `query` and `documents` (and any other RerankRequest field) and writes one JSON object per
line, the RerankResponse of that line (`to_dict`) with its `row`. Request options given on the command line
(`--dimensions`, `--top-n`, ...) apply to every call; a line's own fields win for rerank. Calls are sent with
`priority` batch (`--priority interactive` to change it): the server runs them after interactive requests.

Calls stream with at most `--concurrency` in flight, each retried by `ScoringClient` (UNAVAILABLE and
RESOURCE_EXHAUSTED, jittered backoff, the server's retry hint, `--timeout` per call). Results are written in input
order as soon as every earlier one is in, so the output always holds a prefix of the input: a rerun with the same
arguments skips the rows already written (embed keeps them in `OUTPUT.part` until the last row, then writes the
`.npy`). The first call that fails for good stops new calls; the rows before it are kept, the summary on stderr
names the failed rows with the server's `CODE: message`, and the exit status is 1 (0 when every row is written).
Progress goes to stderr (tqdm).

The adder extends the `embed` and `rerank` subcommands `radixserve.cli` generates from the proto, so it must be
registered after them in `cli._SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PART_SUFFIX = ".part"  # embed's rows written so far: raw float32, row after row
META_SUFFIX = ".part.json"  # {"dimensions": D}: the width of those rows
BATCH_PRIORITY = "batch"  # the class of every call a job makes, unless --priority says otherwise


@dataclass
class Chunk:
    """Rows `start .. start + len(rows)` of the input and the call that answers them."""

    start: int
    rows: list[Any]


@dataclass
class Outcome:
    written: int = 0  # rows written by this run
    skipped: int = 0  # rows already in the output from an earlier run
    failures: list[str] = field(default_factory=list)  # "rows a-b: CODE: message"


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """`--input`/`--output` and the job options on the generated `embed` and `rerank` subcommands."""
    for name, run in (("embed", run_embed), ("rerank", run_rerank)):
        parser = subparsers.choices[name]
        job = parser.add_argument_group("batch job (instead of one call)")
        job.add_argument("--input", type=Path, help="JSONL file of rows: " + (
            "texts (JSON strings or {\"text\": ...})" if name == "embed" else "{\"query\", \"documents\", ...}"))
        job.add_argument("--output", type=Path, help="where the results go: " + (
            ".npy (float32, one row per text)" if name == "embed" else "JSONL, one response per row"))
        job.add_argument("--concurrency", type=int, default=4, help="calls in flight (default: %(default)s)")
        job.add_argument("--retries", type=int, default=5,
                         help="retries of a call answered UNAVAILABLE or RESOURCE_EXHAUSTED (default: %(default)s)")
        if name == "embed":
            job.add_argument("--batch-size", type=int, default=32, help="texts per Embed call (default: %(default)s)")
        parser.set_defaults(func=_dispatch(run, parser.get_default("func")))


def _dispatch(run: Callable[[argparse.Namespace], int], single: Callable[[argparse.Namespace], int]):
    def func(args: argparse.Namespace) -> int:
        if args.input is None:
            return single(args)
        if args.output is None:
            print("--input needs --output: the file the results go to", file=sys.stderr)
            return 2
        if args.concurrency < 1 or getattr(args, "batch_size", 1) < 1:
            print("--concurrency and --batch-size must be at least 1", file=sys.stderr)
            return 2
        return run(args)
    return func


def run_embed(args: argparse.Namespace) -> int:
    import numpy as np

    if args.chunks == "each":
        print("--chunks each gives one embedding per chunk; an embed job writes one row per text: use --chunks "
              "pooled (or leave it to the server's default)", file=sys.stderr)
        return 2
    texts = [_text(row, i) for i, row in enumerate(_rows(args.input))]
    part, meta = Path(f"{args.output}{PART_SUFFIX}"), Path(f"{args.output}{META_SUFFIX}")
    dims = json.loads(meta.read_text())["dimensions"] if meta.exists() else None
    done = part.stat().st_size // (4 * dims) if dims else 0
    if dims:  # drop a row cut short by an interrupted write
        with part.open("r+b") as f:
            f.truncate(done * 4 * dims)
    chunks = (Chunk(s, texts[s:s + args.batch_size]) for s in range(done, len(texts), args.batch_size))
    options = {"chunks": "pooled", **_options(args, exclude={"texts"})}  # one row per text, whatever the default

    def call(client, chunk: Chunk):
        reply = client.embed(texts=chunk.rows, **options)
        return np.asarray([e.values for e in reply.embeddings], dtype=np.float32)  # (rows, D)

    def write(chunk: Chunk, vectors) -> None:
        nonlocal dims
        if dims is None:
            dims = vectors.shape[1]
            meta.write_text(json.dumps({"dimensions": dims}))
        if vectors.shape[1] != dims:
            raise ValueError(f"rows {chunk.start}..: {vectors.shape[1]} dimensions, but {args.output}{PART_SUFFIX} "
                             f"holds rows of {dims}: rerun with the same --dimensions, or delete the .part files")
        with part.open("ab") as f:
            f.write(vectors.tobytes())

    outcome = _stream(args, chunks, call, write, total=len(texts), done=done, unit="text")
    if not outcome.failures:
        rows = np.fromfile(part, dtype=np.float32).reshape(len(texts), dims or 0)  # (N, D)
        np.save(args.output, rows)
        part.unlink()
        meta.unlink()
    return _summary(outcome, args.output)


def run_rerank(args: argparse.Namespace) -> int:
    rows = list(_rows(args.input))
    done = _complete_lines(args.output)
    options = _options(args, exclude={"query", "documents"})

    def call(client, chunk: Chunk) -> dict[str, Any]:
        from radixserve.client import to_dict

        (row,) = chunk.rows
        if not isinstance(row, dict):
            raise ValueError(f"line {chunk.start + 1}: expected an object with query and documents")
        return to_dict(client.rerank(**{**options, **row}))

    def write(chunk: Chunk, reply: dict[str, Any]) -> None:
        with args.output.open("a") as f:
            f.write(json.dumps({"row": chunk.start, **reply}) + "\n")

    chunks = (Chunk(i, [rows[i]]) for i in range(done, len(rows)))
    return _summary(_stream(args, chunks, call, write, total=len(rows), done=done, unit="query"), args.output)


def _stream(args: argparse.Namespace, chunks: Iterator[Chunk], call: Callable, write: Callable, total: int,
            done: int, unit: str) -> Outcome:
    """Run `call(client, chunk)` for every chunk, at most `args.concurrency` at once, and `write` the answers in
    chunk order; stop submitting at the first failure."""
    import grpc
    from tqdm import tqdm

    from radixserve.client import ScoringClient

    outcome, ready, pending = Outcome(skipped=done), {}, {}  # pending: future -> its chunk
    next_start = done
    with ScoringClient(args.address, api_key=args.api_key, timeout_s=args.timeout, retries=args.retries) as client, \
            ThreadPoolExecutor(args.concurrency) as pool, \
            tqdm(total=total, initial=done, unit=unit, file=sys.stderr, desc=args.rpc.lower()) as bar:
        chunks = iter(chunks)
        while True:
            while not outcome.failures and len(pending) < args.concurrency:
                chunk = next(chunks, None)
                if chunk is None:
                    break
                pending[pool.submit(call, client, chunk)] = chunk
            if not pending:
                return outcome
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                chunk = pending.pop(future)
                try:
                    ready[chunk.start] = (chunk, future.result())
                except (grpc.RpcError, ValueError) as err:
                    outcome.failures.append(_failure(chunk, err))
            while next_start in ready:  # write the answered prefix, in input order
                chunk, answer = ready.pop(next_start)
                write(chunk, answer)
                outcome.written += len(chunk.rows)
                next_start += len(chunk.rows)
                bar.update(len(chunk.rows))


def _failure(chunk: Chunk, err: Exception) -> str:
    where = f"row {chunk.start}" if len(chunk.rows) == 1 else f"rows {chunk.start}-{chunk.start + len(chunk.rows) - 1}"
    what = f"{err.code().name}: {err.details()}" if hasattr(err, "code") else str(err)
    return f"{where}: {what}"


def _summary(outcome: Outcome, output: Path) -> int:
    print(f"{outcome.written} rows written to {output} ({outcome.skipped} already there)", file=sys.stderr)
    for failure in outcome.failures:
        print(f"failed: {failure}", file=sys.stderr)
    if outcome.failures:
        print("the rows before the first failure are kept: fix the failed rows and rerun the same command to "
              "resume", file=sys.stderr)
    return 1 if outcome.failures else 0


def _rows(path: Path) -> Iterator[Any]:
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise SystemExit(f"{path}:{number}: not JSON ({err.msg}): one JSON value per line") from None


def _text(row: Any, index: int) -> str:
    text = row.get("text") if isinstance(row, dict) else row
    if not isinstance(text, str):
        raise SystemExit(f"row {index}: expected a JSON string or an object with a \"text\" string, got {row!r:.80}")
    return text


def _options(args: argparse.Namespace, exclude: set[str]) -> dict[str, Any]:
    """The request fields given on the command line, for every call; `priority` is batch unless given, so a job
    never delays a server's interactive traffic by more than a batch."""
    given = {name: getattr(args, name) for name in args.fields
             if name not in exclude and getattr(args, name) is not None}
    return {"priority": BATCH_PRIORITY, **given}


def _complete_lines(path: Path) -> int:
    """Lines of `path` that end in a newline (an interrupted last write is dropped); 0 when it does not exist."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        path.write_bytes(data[:keep])
    return data[:keep].count(b"\n")
