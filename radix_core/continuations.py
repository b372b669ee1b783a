"""Continuation encoding: each context followed by each continuation, with the continuation's tokens marked.

The continuation's tokens are those of `context + continuation` past the longest common prefix with the context's
own encoding. A token that merges across the join (`"Answer: " + "yes"` -> `" yes"`) counts as continuation, as
when lm-evaluation-harness moves the context's trailing space into the continuation. The scoring tasks read the
log-probability of each of those tokens (`radix_core.tasks.scoring`), after `check_continuations`
(`radix_core.tasks.base`) refused rows that give none, or leave no context token before them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radix_core.errors import RequestError
from radix_core.special_tokens import MarkedText, MarkedTokenizer
from radix_core.templates import user_text
from radix_core.truncation import tokens_at_least


@dataclass(frozen=True)
class ContinuationIds:
    """A context followed by a continuation; `ids[start:]` are the continuation's tokens."""

    ids: list[int]
    start: int


@dataclass(frozen=True)
class EncodedContinuations:
    """Per context i and continuation j, `rows[i][j]`; every `ids` starts with `shared_ids`."""

    shared_ids: list[int]
    rows: list[list[ContinuationIds]]


def continuation_name(i: int, j: int, what: str, context_what: str | None) -> str:
    """How errors name continuation j of context i: "continuation 2", or "input 1 with label 2"."""
    return f"{context_what} {i} with {what} {j}" if context_what else f"{what} {j}"


def check_pair_chars(fixed_chars: int, contexts: Sequence[str], continuations: Sequence[str],
                     chars_per_token: int | None, limit: int, what: str, context_what: str | None) -> None:
    """Refuse, before anything is tokenized, a (context, continuation) pair over the character bound of `limit`
    (`radix_core.truncation`); `fixed_chars` are the prompt's characters around the context."""
    for i, text in enumerate(contexts):
        for j, continuation in enumerate(continuations):
            at_least = tokens_at_least(fixed_chars + len(text) + len(continuation), chars_per_token, limit)
            if at_least:
                raise RequestError(f"{continuation_name(i, j, what, context_what)} gives a sequence of at least "
                                   f"{at_least} tokens; the limit is {limit}", f"shorten the context or the {what}",
                                   limit=limit)


def encode_rows(tokenizer: MarkedTokenizer, shared_ids: list[int], contexts: Sequence[MarkedText],
                continuations: Sequence[str], trust: bool) -> EncodedContinuations:
    """`shared_ids + encode(contexts[i] + continuations[j])` per (i, j), each with the start of its continuation's
    tokens; the contexts are the prompt's text after the shared ids."""
    context_ids = tokenizer.encode_marked(contexts, trust)
    joined_ids = tokenizer.encode_marked([c + tokenizer.mark(user_text(cont), trust)
                                          for c in contexts for cont in continuations], trust)
    rows = []
    for i, ctx in enumerate(context_ids):
        row = []
        for j in range(len(continuations)):
            tail = joined_ids[i * len(continuations) + j]
            row.append(ContinuationIds(shared_ids + tail, len(shared_ids) + _common_prefix_len(ctx, tail)))
        rows.append(row)
    return EncodedContinuations(shared_ids, rows)


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
