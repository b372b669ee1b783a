"""The `radixserve` command line: one subcommand per small `_add_<name>` / `_run_<name>` pair.

To add a subcommand, write `_add_<name>(subparsers)`, which registers the parser and its arguments
and sets `func=_run_<name>`, write the runner, and list the adder in `_SUBCOMMANDS`. Runners import
what they need (torch, radix_core, grpc) inside, so `import radixserve.cli` and `radixserve --help`
stay fast; the choices below are therefore spelled out here and a test checks them against
radix_core.tiny_models.
"""

from __future__ import annotations

import argparse
import sys

TINY_ARCHS = ("qwen3", "qwen2", "llama", "mistral")
TINY_HEADS = ("causal_lm", "seq_cls", "base")
TINY_PRESETS = ("tiny", "small", "bench")


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


_SUBCOMMANDS = (_add_make_tiny_model,)

if __name__ == "__main__":
    sys.exit(main())
