"""The `radixserve` command line: one subcommand per small `_add_<name>` / `_run_<name>` pair.

To add a subcommand, write `_add_<name>(subparsers)`, which registers the parser and its arguments
and sets `func=_run_<name>`, write the runner, and list the adder in `_SUBCOMMANDS`. Runners import
what they need (torch, radix_core, grpc) inside, so `import radixserve.cli` and `radixserve --help`
stay fast; the choices below are therefore spelled out here and a test checks them against
radix_core.tiny_models.

The client subcommands (rerank, embed, classify, score, info) call the gRPC API through
`radixserve.client.ScoringClient` and print its answer as JSON; they send what they are given, so the
server's validation speaks, as `CODE: message` on stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from radixserve.launcher import add_subcommand as _add_serve

TINY_ARCHS = ("qwen3", "qwen2", "llama", "mistral")
TINY_HEADS = ("causal_lm", "seq_cls", "base")
TINY_PRESETS = ("tiny", "small", "bench")
API_KEY_ENV = "RADIXSERVE_API_KEY"


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the chosen subcommand, return its exit status."""
    args = _build_parser().parse_args(argv)
    return args.func(args)


def _build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand in `_SUBCOMMANDS` registered."""
    parser = argparse.ArgumentParser(
        prog="radixserve", description="Scoring server for causal transformers: client and tools."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_subcommand in _SUBCOMMANDS:
        add_subcommand(subparsers)
    return parser


def _add_make_tiny_model(subparsers: argparse._SubParsersAction) -> None:
    """`make-tiny-model DIR`: a random-weight model plus tokenizer for tests and smoke runs."""
    parser = subparsers.add_parser(
        "make-tiny-model",
        help="write a random-weight model and tokenizer to DIR",
        description="Write a random-weight transformers model and a small trained tokenizer to DIR, "
        "loadable offline with AutoModel*/AutoTokenizer.from_pretrained(DIR).",
    )
    parser.add_argument("dir", metavar="DIR", help="output directory (created if missing)")
    parser.add_argument("--arch", choices=TINY_ARCHS, default="qwen3", help="model family (default: qwen3)")
    parser.add_argument("--head", choices=TINY_HEADS, default="causal_lm", help="model head (default: causal_lm)")
    parser.add_argument(
        "--preset", choices=TINY_PRESETS, default="tiny",
        help="sizes: tiny (hidden 64, 2 layers), small (128, 4), bench (512, 8) (default: tiny)",
    )
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    parser.set_defaults(func=_run_make_tiny_model)


def _run_make_tiny_model(args: argparse.Namespace) -> int:
    """Write the model and print the directory it went to."""
    from radix_core.tiny_models import PRESETS, make_tiny_model

    out_dir = make_tiny_model(args.dir, args.arch, args.head, seed=args.seed, **PRESETS[args.preset])
    print(out_dir.resolve())
    return 0


def _add_rerank(subparsers: argparse._SubParsersAction) -> None:
    """`rerank --query Q --document D [--document D ...]`: documents scored against the query, best first."""
    parser = _add_client_command(subparsers, "rerank", "score documents against a query", _run_rerank)
    parser.add_argument("--query", default="", help="the query")
    parser.add_argument("--document", action="append", default=[], help="a document (repeat for more)")
    parser.add_argument("--top-n", type=int, help="return only the best N documents")
    parser.add_argument("--instruction", help="task instruction (default: the model template's)")


def _run_rerank(args: argparse.Namespace) -> int:
    return _call_server(args, lambda client: client.rerank(args.query, args.document, instruction=args.instruction,
                                                           top_n=args.top_n))


def _add_embed(subparsers: argparse._SubParsersAction) -> None:
    """`embed --text T [--text T ...]`: one vector per text."""
    parser = _add_client_command(subparsers, "embed", "embed texts", _run_embed)
    parser.add_argument("--text", action="append", default=[], help="a text (repeat for more)")
    parser.add_argument("--instruction", help="query instruction shared by the texts (default: none)")
    parser.add_argument("--dimensions", type=int, help="keep the first D components (default: all)")


def _run_embed(args: argparse.Namespace) -> int:
    return _call_server(args, lambda client: client.embed(args.text, instruction=args.instruction,
                                                          dimensions=args.dimensions))


def _add_classify(subparsers: argparse._SubParsersAction) -> None:
    """`classify --input I [...] --label L [...]`: each label's probability after each input."""
    parser = _add_client_command(subparsers, "classify", "classify inputs by label probability", _run_classify)
    parser.add_argument("--input", action="append", default=[], help="an input (repeat for more)")
    parser.add_argument("--label", action="append", default=[], help="a label (repeat for more)")
    parser.add_argument("--prefix", default="", help="few-shot text before every input (default: none)")


def _run_classify(args: argparse.Namespace) -> int:
    return _call_server(args, lambda client: client.classify(args.input, args.label, prefix=args.prefix))


def _add_score(subparsers: argparse._SubParsersAction) -> None:
    """`score --context C --continuation T [...]`: log-probability of each continuation after the context."""
    parser = _add_client_command(subparsers, "score", "score continuations of a context", _run_score)
    parser.add_argument("--context", default="", help="the text every continuation follows")
    parser.add_argument("--continuation", action="append", default=[], help="a continuation (repeat for more)")


def _run_score(args: argparse.Namespace) -> int:
    return _call_server(args, lambda client: client.score(args.context, args.continuation))


def _add_info(subparsers: argparse._SubParsersAction) -> None:
    """`info`: the served model, tasks, limits, radix mode and version."""
    _add_client_command(subparsers, "info", "show the server's model, limits and version", _run_info)


def _run_info(args: argparse.Namespace) -> int:
    return _call_server(args, lambda client: client.info())


def _add_client_command(subparsers: argparse._SubParsersAction, name: str, help_text: str,
                        run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """A subcommand that calls the gRPC API: its parser with the connection options."""
    parser = subparsers.add_parser(
        name, help=help_text,
        description=f"Call the radixserve gRPC API and print the answer as JSON; a server error prints "
                    f"'CODE: message' on stderr and exits with status 1. {help_text[0].upper()}{help_text[1:]}.")
    parser.add_argument("--address", default="localhost:9000", help="HOST:PORT of the server (default: %(default)s)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"API key, sent as 'authorization: Bearer KEY' (default: ${API_KEY_ENV})")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per attempt (default: %(default)s)")
    parser.set_defaults(func=run)
    return parser


def _call_server(args: argparse.Namespace, call: Callable[[Any], Any]) -> int:
    """Run `call(client)`, print its result as JSON; on a gRPC error print `CODE: message` on stderr, return 1."""
    import grpc

    from radixserve.client import ScoringClient

    try:
        with ScoringClient(args.address, api_key=args.api_key, timeout_s=args.timeout) as client:
            result = call(client)
    except grpc.RpcError as err:
        print(f"{err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    print(json.dumps(_plain(result)))
    return 0


def _plain(value: Any) -> Any:
    """JSON-ready: dataclasses as dicts without their None fields (an unrequested document), recursively."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


_SUBCOMMANDS = (_add_make_tiny_model, _add_rerank, _add_embed, _add_classify, _add_score, _add_info, _add_serve)

if __name__ == "__main__":
    sys.exit(main())
