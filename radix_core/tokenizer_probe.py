"""What a tokenizer does at the joins radixserve makes, measured once per tokenizer on probe strings.

* its affixes: the special ids it puts around one text (a BOS, Qwen3-Embedding's `<|endoftext|>`) and around a
  text pair (`[CLS] a [SEP] b [SEP]`), which a prompt gets as ids, outside any text;
* which of the two split rules of `radix_core.split_points` hold: the special tokens that split text cleanly, and
  whether a newline before a non-space character does, each checked on adversarial neighbours (the newline rule
  with special-token literals as control tokens and as plain text). A rule that fails (e.g. a SentencePiece
  tokenizer that prepends "▁" to every piece) is not used, so such a tokenizer gets fewer shared ids but still
  exact sequences;
* the most characters one token covers (`radix_core.truncation`'s character bound), or None when a probe run of
  characters gives fewer tokens than that allows: the tokenizer deletes or collapses characters.

`encode` arguments take a list of texts and return their ids without the tokenizer's affixes: `encode` with
special-token literals as control tokens, `encode_plain` with them as plain text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Encode = Callable[[Sequence[str]], list[list[int]]]

_NEWLINE_LEFTS = ("x\n", "x?\n", "x \n", "x\n\n", "é\n", "x\r\n", "1\n", " \n", ":\n")
_NEWLINE_RIGHTS = ("<D y", "Query: x", "a b", "\u0301x", "中文", "12", "'s x", "?\n", "x\n\n", "<|im_end|>")
# Runs a normalizer or pre-tokenizer might delete or collapse (whitespace, controls, marks, Hangul jamo).
_DENSITY_PROBES = (" ", "\n", "\t", "\r\n", "\x00", "\u200b", "\u00ad", "\ufeff", "\u0301", "e\u0301",
                   "\u1100\u1161\u11a8", "a", "-", "中", "😀")


def single_affixes(tokenizer, encode: Encode) -> tuple[list[int], list[int]]:
    """Special ids the tokenizer puts before and after one text (a BOS, Qwen3-Embedding's `<|endoftext|>`)."""
    lead, _, tail = _affixes_around(tokenizer("x")["input_ids"], encode(["x"]))
    return lead, tail


def pair_affixes(tokenizer, encode: Encode) -> tuple[list[int], list[int], list[int]]:
    """Special ids the tokenizer puts before, between and after a text pair (`[CLS] a [SEP] b [SEP]`)."""
    lead, (mid,), tail = _affixes_around(tokenizer("x", "y")["input_ids"], encode(["x", "y"]))
    return lead, mid, tail


def clean_specials(tokenizer, encode: Encode) -> frozenset[str]:
    """Special tokens that split the text cleanly on both sides, checked on adversarial neighbours."""
    candidates = [t.content for t in tokenizer.added_tokens_decoder.values()
                  if t.special and t.content and not (t.lstrip or t.rstrip or t.single_word)]
    return frozenset(s for s in candidates if _joins_exactly([
        ("x ", s + "y"), ("x\n", s + "\n"), ("é", s), ("x" + s, " y"), (s, "\n\ny"), (s, "\u0301y"), (s, "y"),
    ], encode))


def newline_is_safe(encode: Encode, encode_plain: Encode) -> bool:
    """Whether splitting after a newline, before a non-space character, is exact for this tokenizer, with
    special-token literals as control tokens and as plain text."""
    pairs = [(left, right) for left in _NEWLINE_LEFTS for right in _NEWLINE_RIGHTS]
    return _joins_exactly(pairs, encode) and _joins_exactly(pairs, encode_plain)


def chars_per_token(tokenizer, encode: Encode, encode_plain: Encode) -> int | None:
    """The most characters one token covers: the longest vocabulary entry (byte-level entries spell one
    character per byte, so this over-counts). None when a probe run of characters gives fewer tokens than
    that allows, i.e. the tokenizer deletes or collapses characters (a whitespace-splitting pre-tokenizer)."""
    longest = max(map(len, tokenizer.get_vocab()))
    probes = [piece * (2 * longest) for piece in _DENSITY_PROBES]
    counts = [min(len(a), len(b)) for a, b in zip(encode(probes), encode_plain(probes))]
    return longest if all(n * longest >= len(p) for p, n in zip(probes, counts)) else None


def _joins_exactly(pairs: list[tuple[str, str]], encode: Encode) -> bool:
    lefts = encode([a for a, _ in pairs])
    rights = encode([b for _, b in pairs])
    whole = encode([a + b for a, b in pairs])
    return all(a + b == ab for a, b, ab in zip(lefts, rights, whole))


def _affixes_around(ids: list[int], pieces: list[list[int]]) -> tuple[list[int], list[list[int]], list[int]]:
    """Split `ids` = lead + pieces[0] + gap[0] + pieces[1] + ... + tail; return (lead, gaps, tail)."""
    cursor, lead, gaps = 0, None, []
    for piece in pieces:
        at = _find(ids, piece, cursor)
        if lead is None:
            lead = ids[:at]
        else:
            gaps.append(ids[cursor:at])
        cursor = at + len(piece)
    return lead, gaps, ids[cursor:]


def _find(ids: list[int], piece: list[int], start: int) -> int:
    for at in range(start, len(ids) - len(piece) + 1):
        if ids[at:at + len(piece)] == piece:
            return at
    raise ValueError(f"the tokenizer's post-processor changes the text's own ids ({piece} not in {ids}); "
                     f"radixserve cannot split its prompts")
