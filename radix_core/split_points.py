"""Safe split points: where a prompt can be cut into separately tokenized pieces without changing its ids.

Joining separately tokenized pieces is only exact where the tokenizer can never merge across the join. A
byte-level BPE pre-tokenizer (Qwen2, Llama 3, GPT-2 regexes) glues a leading space to the next word (`": " + "d"`
encodes as `":"`, `" d"`), a newline to a following newline, punctuation to following newlines; a normalizer
(NFC) may compose a base letter with a combining mark that follows. So text is split only at *safe points*:

* before or after a special token of the template: the tokenizer cuts these out before it normalizes or
  pre-tokenizes, so nothing merges across them;
* after a newline whose next character is not whitespace (`"\\n<Document>"`): no pre-token continues past a
  newline into a non-space character, and nothing composes with a newline.

Each rule is used only where `radix_core.tokenizer_probe` found it to hold for the tokenizer: `clean_specials` are
the special tokens that split cleanly, `newline_safe` says whether the newline rule does.
"""

from __future__ import annotations

import re

from radix_core.special_tokens import MarkedText

_SAFE_NEWLINE = re.compile(r"\n(?=\S)")


def last_safe_point(text: MarkedText, clean_specials: frozenset[str], newline_safe: bool) -> int:
    """The last position of `text` where splitting cannot change its encoding, whatever follows; 0 if none."""
    points = safe_points(text, clean_specials, newline_safe)
    return points[-1] if points else 0


def first_safe_point(text: MarkedText, clean_specials: frozenset[str], newline_safe: bool) -> int:
    """The first position of `text` where splitting is safe whatever precedes it; `len(text)` if none."""
    points = safe_points(text, clean_specials, newline_safe)
    return points[0] if points else len(text.text)


def safe_points(text: MarkedText, clean_specials: frozenset[str], newline_safe: bool) -> list[int]:
    """Sorted safe split positions: both ends of each marked special token in `clean_specials`, and after each
    newline followed by a non-space character when `newline_safe`."""
    points = [p for a, b in text.specials if text.text[a:b] in clean_specials for p in (a, b)]
    if newline_safe:
        points += [match.end() for match in _SAFE_NEWLINE.finditer(text.text)]
    return sorted(points)
