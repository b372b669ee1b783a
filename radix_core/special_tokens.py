"""Special tokens come only from the template: a tokenizer that makes special-token literals control tokens only
where the prompt marks them.

Prompt text arrives as `Segment`s (`radix_core.templates`) that say which text is the user's: a special-token
literal (`<|im_end|>`) in a query, document, instruction, classify prefix, score context or label is plain text,
so a document cannot close its turn and write the answer a reranker scores. `MarkedText` is prompt text with the
spans of the literals that are special. A text whose only special-token literals are marked is encoded whole, as
the tokenizer does; one holding a literal elsewhere is cut at its marked spans, and the text between them is
encoded with the tokenizer's `encode_special_tokens` (transformers' `split_special_tokens=True`), on a private copy
of the Rust tokenizer because that flag is shared state. `trust=True` (`special_tokens_in_user_text`) restores the
tokenizer's plain behaviour (every literal is a control token) for callers who trust all their text. The
tokenizer's own affixes (BOS, Qwen3-Embedding's `<|endoftext|>`, pair separators) are ids and stay special.
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
        self._plain = _plain_copy(tokenizer)
        self._specials = _special_pattern(tokenizer)
        self._special_ids = {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.special}

    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key != "_plain"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._plain = _plain_copy(self.tokenizer)  # the Rust flag `encode_special_tokens` does not pickle

    def encode(self, text: str) -> list[int]:
        """Ids of trusted `text` without the tokenizer's affixes; its special-token literals are special."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False)["input_ids"]

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

    def encode_marked(self, texts: Sequence[MarkedText], trust: bool) -> list[list[int]]:
        """Ids of each text with special tokens only at its marked spans (anywhere, when `trust`). A text whose
        literals are all marked is encoded whole; any other is cut at its marked spans and the text between
        them is encoded with special tokens as plain text."""
        if trust:
            return self.encode_batch([t.text for t in texts])
        out: list[list[int]] = [[] for _ in texts]
        whole = [i for i, t in enumerate(texts) if self._only_marked_specials(t)]
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
        backend = self.tokenizer.backend_tokenizer if trust else self._plain
        return backend.encode_batch(list(texts), add_special_tokens=add_special_tokens) if texts else []

    def offsets(self, text: str, trust: bool) -> list[tuple[int, int]]:
        """Character spans of the tokens of user text `text` alone."""
        if trust:
            return self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return self._plain.encode(text, add_special_tokens=False).offsets

    def _encode_plain(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of `texts` with special-token literals as plain text."""
        return [e.ids for e in self._plain.encode_batch(list(texts), add_special_tokens=False)] if texts else []

    def _marked_all(self, text: str) -> MarkedText:
        if self._specials is None:
            return MarkedText(text)
        return MarkedText(text, tuple(match.span() for match in self._specials.finditer(text)))

    def _only_marked_specials(self, text: MarkedText) -> bool:
        return self._specials is None or {m.span() for m in self._specials.finditer(text.text)} <= set(text.specials)


def _plain_copy(tokenizer) -> Tokenizer:
    """A copy of the Rust tokenizer that encodes special-token literals as plain text (transformers'
    `split_special_tokens=True` toggles this flag on the shared tokenizer per call, which races across threads)."""
    plain = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    plain.no_truncation()
    plain.no_padding()
    plain.encode_special_tokens = True
    return plain


def _special_pattern(tokenizer) -> re.Pattern | None:
    """A regex matching the tokenizer's special tokens, longest first; None when it has none."""
    specials = sorted((t.content for t in tokenizer.added_tokens_decoder.values() if t.special and t.content),
                      key=len, reverse=True)
    return re.compile("|".join(map(re.escape, specials))) if specials else None


def _gaps(text: MarkedText) -> list[str]:
    """The text before, between and after the marked spans."""
    cuts = [0] + [p for span in text.specials for p in span] + [len(text.text)]
    return [text.text[a:b] for a, b in zip(cuts[::2], cuts[1::2])]
