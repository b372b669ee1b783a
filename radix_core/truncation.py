"""Truncation: the longest piece of a varying text whose prompt fits the token limit, and the character bound that
keeps a huge text from costing more than a maximum-length one.

Truncation cuts only the varying text, at a token boundary of its own encoding, keeping its start
(`direction="right"`, the default) or its end (`"left"`), and re-tokenizes the kept text in its prompt until the
sequence fits; `max_item_tokens` cuts a varying text to that many tokens of its own the same way. The result is
always the tokenizer's encoding of the prompt holding the kept text.

An item's cost is bounded by the token limit: no token covers more than `chars_per_token` characters (the longest
vocabulary entry, `radix_core.tokenizer_probe.chars_per_token`), so a text of more than
`chars_per_token * (limit + 1)` characters cannot fit. Such a text is cut to that many characters (on the side
truncation cuts) before it is tokenized (truncation then proceeds as for any long text) or refused without
tokenizing it whole; a text that fits is never cut. `chars_per_token` None: the tokenizer has no such bound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from radix_core.errors import Items

SHORTEN_SHARED = "shorten the shared part (query, instruction) or raise the limit"

Encode = Callable[[str], list[int]]  # the ids of a prompt holding this piece of the varying text
Offsets = Callable[[str], list[tuple[int, int]]]  # character spans of the tokens of a text alone


def char_bound(chars_per_token: int | None, limit: int) -> int | None:
    """Characters beyond which no text fits in `limit` tokens; None when the tokenizer has no such bound."""
    return None if chars_per_token is None else chars_per_token * (limit + 1)


def tokens_at_least(chars: int, chars_per_token: int | None, limit: int) -> int:
    """A lower bound of the tokens of a text of `chars` characters when that is over `limit`, else 0."""
    bound = char_bound(chars_per_token, limit)
    return -(-chars // chars_per_token) if bound is not None and chars > bound else 0


def keep_all_chars(texts: Sequence[str], bound: int | None, direction: str) -> list[str]:
    """`keep_chars` of each text, visiting only those over `bound` (found by their lengths as one array)."""
    kept = list(texts)
    if bound is not None:
        for i in np.flatnonzero(np.fromiter(map(len, kept), dtype=np.int64, count=len(kept)) > bound).tolist():
            kept[i] = keep_chars(kept[i], bound, direction)
    return kept


def keep_chars(text: str, bound: int | None, direction: str) -> str:
    """`text` cut to `bound` characters (None: no bound), keeping its start ("right") or its end ("left")."""
    if bound is None or len(text) <= bound:
        return text
    return text[:bound] if direction == "right" else text[len(text) - bound:]


def check_shared_chars(chars: int, chars_per_token: int | None, limit: int, items: Items) -> None:
    """Refuse, before tokenizing it, a shared part (query, instruction) of `chars` characters too long for any
    item to fit."""
    at_least = tokens_at_least(chars, chars_per_token, limit)
    if at_least:
        raise items.error(0, f": the prompt without it already has at least {at_least} tokens; the limit is "
                          f"{limit}", SHORTEN_SHARED, limit=limit)


def fit(text: str, middle: list[int], limit: int, fixed: int, encode: Encode, offsets: Offsets, direction: str,
        index: int, items: Items) -> list[int]:
    """`encode(piece)` for the longest `piece` of `text` (`cut`) that keeps the sequence, with its `fixed` ids
    around the middle, within `limit`; `middle` is `encode(text)`. The empty piece is checked to fit first: when
    the prompt without the text is over the limit, its error names item `index` of `items`."""
    budget = limit - fixed
    empty = encode("")
    if len(empty) > budget:
        raise items.error(index, f": the prompt without it already has {fixed + len(empty)} tokens; the limit "
                          f"is {limit}", SHORTEN_SHARED, limit=limit)
    return cut(text, middle, budget, encode, offsets, direction)[1]


def cut(text: str, ids: list[int], budget: int, encode: Encode, offsets: Offsets,
        direction: str) -> tuple[str, list[int]]:
    """The longest piece of user text `text` cut at a token start of its own encoding, keeping its start
    (`direction` "right") or its end ("left"), whose `encode(piece)` has at most `budget` ids, and those ids;
    `ids` is `encode(text)` and `encode("")` must fit.

    Cutting at a token start and re-tokenizing can give a few more tokens than kept (a word cut short splits
    differently), so cut again by the excess until it fits.
    """
    starts = [start for start, _ in offsets(text)] + [len(text)]  # (n+1,)
    n = len(starts) - 1
    keep, piece = n, text
    while len(ids) > budget:
        keep = max(0, keep - (len(ids) - budget))
        piece = "" if not keep else text[:starts[keep]] if direction == "right" else text[starts[n - keep]:]
        ids = encode(piece)
    return piece, ids
