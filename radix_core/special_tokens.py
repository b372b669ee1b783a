"""Special tokens come only from the template: a tokenizer that makes special-token literals control tokens only
where the prompt marks them.

Prompt text arrives as `Segment`s (`radix_core.templates`) that say which text is the user's: a special-token
literal (`<|im_end|>`) in a query, document, instruction, classify prefix, score context or label is plain text,
so a document cannot close its turn and write the answer a reranker scores. `MarkedText` is prompt text with the
spans of the literals that are special. A text whose only special-token literals are marked is encoded whole, as
the tokenizer does; one holding a literal elsewhere is cut at its marked spans, and the text between them is
encoded with the tokenizer's `encode_special_tokens` (transformers' `split_special_tokens=True`). `trust=True`
(`special_tokens_in_user_text`) restores the tokenizer's plain behaviour (every literal is a control token) for
callers who trust all their text. The tokenizer's own affixes (BOS, Qwen3-Embedding's `<|endoftext|>`, pair
separators) are ids and stay special.

Every text is encoded by two private copies of the Rust `tokenizers.Tokenizer` (`_backend_copy`), never through
transformers' Python wrapper: `encode_special_tokens`, truncation and padding are state the wrapper sets per call on
its shared tokenizer, which races across threads; and `encode_batch_fast` encodes a whole batch in Rust threads with
the GIL released, ids only (no offsets). On 1,000 MS MARCO-shaped rerank documents (the tiny tokenizer, ~130 tokens
each; best of 9 on a shared 2-core machine) the wrapper took 0.093 s, the copy's `encode_batch` 0.080 s and
`encode_batch_fast` 0.075 s, about 0.015 s of it reading the ids into Python lists.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Encoding, Tokenizer

from radix_core.templates import Text, joined


@dataclass(frozen=True)
class MarkedText:
    """Prompt text and the (start, end) spans of the special-token literals in it that are special."""

    text: str
    specials: tuple[tuple[int, int], ...] = ()

    def __add__(self, other: MarkedText) -> MarkedText:
        n = len(self.text)
        return MarkedText(self.text + other.text, self.specials + tuple((a + n, b + n) for a, b in other.specials))

    def cut(self, start: int, end: int | None = None) -> MarkedText:
        """`text[start:end]` with the spans inside it."""
        end = len(self.text) if end is None else end
        inside = tuple((a - start, b - start) for a, b in self.specials if start <= a and b <= end)
        return MarkedText(self.text[start:end], inside)


class MarkedTokenizer:
    """A fast transformers tokenizer that encodes `MarkedText` with special tokens only at its marked spans."""

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("radixserve needs a fast tokenizer (a tokenizer.json next to the model), "
                             f"got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self._copy_backends()
        self._specials = _special_pattern(tokenizer)
        self._special_ids = {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.special}

    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key not in ("_trusted", "_plain")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._copy_backends()  # the Rust flag `encode_special_tokens` does not pickle

    def _copy_backends(self) -> None:
        """`_trusted` encodes as `tokenizer(text)` does (special-token literals special, unless the tokenizer's own
        `split_special_tokens` says otherwise); `_plain` encodes every literal as plain text."""
        self._trusted = _backend_copy(self.tokenizer, getattr(self.tokenizer, "split_special_tokens", False))
        self._plain = _backend_copy(self.tokenizer, True)

    def encode(self, text: str) -> list[int]:
        """Ids of trusted `text` without the tokenizer's affixes; its special-token literals are special."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of trusted `texts` without the tokenizer's affixes: `tokenizer(texts, add_special_tokens=False)`."""
        return _batch_ids(self._trusted, texts)

    def token_id(self, token: str) -> int:
        """The id of a single vocabulary token, or a ValueError saying it is not one."""
        ids = self.encode(token)
        if len(ids) != 1:
            raise ValueError(f"{token!r} is {len(ids)} tokens for this tokenizer; it must be exactly one")
        return ids[0]

    def mark(self, text: Text, trust: bool) -> MarkedText:
        """`text` with the spans of its special-token literals that are special: those in the template's
        segments, or every one when user text is trusted."""
        if trust:
            return self._marked_all(joined(text))
        out = MarkedText("")
        for segment in text:
            out = out + (MarkedText(segment.text) if segment.user else self._marked_all(segment.text))
        return out

    def encode_between(self, head: MarkedText, texts: Sequence[str], tail: MarkedText, trust: bool) -> list[list[int]]:
        """Ids of `head + text + tail` for each user text (`encode_marked` of the texts marked as the user's).
        When `head` and `tail` mark no span (the Qwen3 prompts' varying parts) the strings go to Rust as they are,
        with no `MarkedText` and no search for literals per text: the plain copy encodes user literals as text."""
        strings = [head.text + text + tail.text for text in texts]
        if trust:
            return self.encode_batch(strings)
        if not head.specials and not tail.specials:
            return self._encode_plain(strings)
        return self.encode_marked([head + MarkedText(text) + tail for text in texts], trust)

    def encode_marked(self, texts: Sequence[MarkedText], trust: bool) -> list[list[int]]:
        """Ids of each text with special tokens only at its marked spans (anywhere, when `trust`). A text with
        marked spans and no other literal is encoded whole; any other is cut at its marked spans (none: it is
        one piece) and the text between them is encoded with special tokens as plain text."""
        if trust:
            return self.encode_batch([t.text for t in texts])
        out: list[list[int]] = [[] for _ in texts]
        whole = [i for i, t in enumerate(texts) if t.specials and self._only_marked_specials(t)]
        for i, ids in zip(whole, self.encode_batch([texts[i].text for i in whole])):
            out[i] = ids
        split = sorted(set(range(len(texts))) - set(whole))
        gaps = [_gaps(texts[i]) for i in split]
        gap_ids = iter(self._encode_plain([gap for text_gaps in gaps for gap in text_gaps]))
        for i, text_gaps in zip(split, gaps):
            ids = next(gap_ids)
            for a, b in texts[i].specials:
                ids = ids + [self._special_ids[texts[i].text[a:b]]] + next(gap_ids)
            out[i] = ids
        return out

    def encodings(self, texts: Sequence[str], add_special_tokens: bool, trust: bool) -> list[Encoding]:
        """Encodings (ids, tokens, offsets) of user texts: special-token literals as plain text unless `trust`; the
        tokenizer's own affixes with `add_special_tokens`."""
        backend = self._trusted if trust else self._plain
        return backend.encode_batch(list(texts), add_special_tokens=add_special_tokens) if texts else []

    def offsets(self, text: str, trust: bool) -> list[tuple[int, int]]:
        """Character spans of the tokens of user text `text` alone."""
        return (self._trusted if trust else self._plain).encode(text, add_special_tokens=False).offsets

    def _encode_plain(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of `texts` with special-token literals as plain text."""
        return _batch_ids(self._plain, texts)

    def _marked_all(self, text: str) -> MarkedText:
        if self._specials is None:
            return MarkedText(text)
        return MarkedText(text, tuple(match.span() for match in self._specials.finditer(text)))

    def _only_marked_specials(self, text: MarkedText) -> bool:
        return self._specials is None or {m.span() for m in self._specials.finditer(text.text)} <= set(text.specials)


def _backend_copy(tokenizer, encode_special_tokens: bool) -> Tokenizer:
    """A private copy of the Rust tokenizer without truncation or padding, with its own `encode_special_tokens`
    (transformers sets these on the shared tokenizer per call, which races across threads)."""
    copy = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    copy.encode_special_tokens = encode_special_tokens
    return copy


def _batch_ids(backend: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Ids of `texts` without the tokenizer's affixes, encoded in one call (Rust threads, the GIL released)."""
    return [e.ids for e in backend.encode_batch_fast(list(texts), add_special_tokens=False)] if texts else []


def _special_pattern(tokenizer) -> re.Pattern | None:
    """A regex matching the tokenizer's special tokens, longest first; None when it has none."""
    specials = sorted((t.content for t in tokenizer.added_tokens_decoder.values() if t.special and t.content),
                      key=len, reverse=True)
    return re.compile("|".join(map(re.escape, specials))) if specials else None


def _gaps(text: MarkedText) -> list[str]:
    """The text before, between and after the marked spans."""
    cuts = [0] + [p for span in text.specials for p in span] + [len(text.text)]
    return [text.text[a:b] for a, b in zip(cuts[::2], cuts[1::2])]
