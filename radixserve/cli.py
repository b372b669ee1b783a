"""The `radixserve` command line: one subcommand per small `_add_<name>` / `_run_<name>` pair.

To add a subcommand, write `_add_<name>(subparsers)`, which registers the parser and its arguments
and sets `func=_run_<name>`, write the runner, and list the adder in `_SUBCOMMANDS`. Runners import
what they need (torch, radix_core, grpc) inside, so `import radixserve.cli` and `radixserve --help`
stay fast; the choices below are therefore spelled out here and a test checks them against
radix_core.tiny_models.

The client subcommands (one per rpc of the gRPC API: rerank, embed, classify, score, predict, info) are made
from the proto's descriptor, call it through `radixserve.client.ScoringClient` and print its answer as JSON;
they send what they are given, so the server's validation speaks, as `CODE: message` on stderr with exit status
1. Their options are the request message's fields, which are the task's request fields
(`radix_core.tasks.*Request`, in the same order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from radixserve.batch_jobs import add_subcommand as _add_batch_jobs

TINY_ARCHS = ("qwen3", "qwen2", "llama", "mistral", "qwen3_5", "qwen3_next")
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


def _add_client_commands(subparsers: argparse._SubParsersAction) -> None:
    """One subcommand per rpc of radixserve.v1.Scoring (`rerank`, `embed`, ..., `info`), with one option per
    request field, made from the proto's descriptor: a repeated field takes its option once per value and may be
    spelled singular (`--document A --document B`), a bool field is `--flag`/`--no-flag`; an option left out
    leaves the field unset, so the server's default applies."""
    from radixserve.client import SERVICE

    for method in SERVICE.methods:
        _add_client_command(subparsers, method)


def _add_client_command(subparsers: argparse._SubParsersAction, method) -> None:
    """The subcommand of one rpc: its connection options and the request message's fields."""
    name = method.name.lower()
    parser = subparsers.add_parser(
        name, help=f"call {method.name}",
        description=f"Call radixserve.v1.Scoring/{method.name} and print the answer ({method.output_type.name}) as "
                    "JSON; a server error prints 'CODE: message' on stderr and exits with status 1.")
    parser.add_argument("--address", default="localhost:9000", help="HOST:PORT of the server (default: %(default)s)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"API key, sent as 'authorization: Bearer KEY' (default: ${API_KEY_ENV})")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="deadline of the call, retries included, in seconds (default: %(default)s)")
    fields = parser.add_argument_group("request fields")
    for field in method.input_type.fields:
        _add_field_option(fields, field)
    parser.set_defaults(func=_run_client_command, rpc=method.name, fields=[f.name for f in method.input_type.fields])


def _add_field_option(group: argparse._ArgumentGroup, field) -> None:
    option = "--" + field.name.replace("_", "-")
    kind = {field.TYPE_BOOL: None, field.TYPE_INT32: int, field.TYPE_INT64: int, field.TYPE_DOUBLE: float,
            field.TYPE_FLOAT: float}.get(field.type, str)
    if field.is_repeated:
        names = [option] + ([option[:-1]] if option.endswith("s") else [])
        group.add_argument(*names, dest=field.name, action="append", type=kind, help=f"one of {field.name}")
    elif field.type == field.TYPE_BOOL:
        group.add_argument(option, dest=field.name, action=argparse.BooleanOptionalAction, default=None)
    else:
        group.add_argument(option, dest=field.name, type=kind, metavar=field.name.upper())


def _run_client_command(args: argparse.Namespace) -> int:
    """Call the rpc, print its answer as JSON; on a gRPC error print `CODE: message` on stderr, return 1."""
    import grpc

    from radixserve.client import ScoringClient, to_dict

    request = {name: getattr(args, name) for name in args.fields if getattr(args, name) is not None}
    try:
        with ScoringClient(args.address, api_key=args.api_key, timeout_s=args.timeout) as client:
            reply = client.call(args.rpc, **request)
    except grpc.RpcError as err:
        print(f"{err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    print(json.dumps(to_dict(reply)))
    return 0


def _add_serve(subparsers: argparse._SubParsersAction) -> None:
    """`serve [CONFIG]`: the server's launcher, which lives with the server (`deployments.launcher`). This is the
    one place the client package reaches into the server's, lazily, so `import radixserve.cli` imports no
    `deployments` module and the dependency between the two packages runs one way."""
    from deployments.launcher import add_subcommand

    add_subcommand(subparsers)


_SUBCOMMANDS = (_add_make_tiny_model, _add_client_commands, _add_batch_jobs, _add_serve)

if __name__ == "__main__":
    sys.exit(main())
