"""Tokenization that keeps the sharing: a request's shared text is tokenized once, and every sequence starts
with exactly those ids, while each sequence still equals the tokenizer's own encoding of its whole string.

Joining separately tokenized pieces is only exact where the tokenizer can never merge across the join. A
byte-level BPE pre-tokenizer (Qwen2, Llama 3, GPT-2 regexes) glues a leading space to the next word (`": " + "d"`
encodes as `":"`, `" d"`), a newline to a following newline, punctuation to following newlines; a normalizer
(NFC) may compose a base letter with a combining mark that follows. So text is split only at *safe points*:

* before or after an added special token (`<|im_end|>`): the tokenizer cuts these out before it normalizes or
  pre-tokenizes, so nothing merges across them;
* after a newline whose next character is not whitespace (`"\\n<Document>"`): no pre-token continues past a
  newline into a non-space character, and nothing composes with a newline.

For a prompt `shared + varying[i] + suffix` the shared ids are those of `shared` up to its last safe point; the
rest of `shared` (the Qwen3-Reranker's `"<Document>: "`) is tokenized together with each varying text and the
start of `suffix` up to its first safe point. Both rules are checked once per tokenizer on adversarial probe
strings (`_probe_*`); a rule that fails (e.g. a SentencePiece tokenizer that prepends "▁" to every piece) is not
used, so such a tokenizer gets fewer shared ids but still exact sequences. Truncation cuts only the varying text,
at a token boundary of its own encoding, and re-tokenizes until the sequence fits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer

from radix_core.architectures import ModelLoadError
from radix_core.templates import CrossEncoderPair, EmbedTemplate, PromptParts, Template

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_NEWLINE_LEFTS = ("x\n", "x?\n", "x \n", "x\n\n", "é\n", "x\r\n", "1\n", " \n", ":\n")
_NEWLINE_RIGHTS = ("<D y", "Query: x", "a b", "\u0301x", "中文", "12", "'s x", "?\n", "x\n\n")


@dataclass(frozen=True)
class EncodedBatch:
    """One request's sequences; every one starts with `shared_ids` (identical by construction)."""

    shared_ids: list[int]
    sequences: list[list[int]]
    truncated: list[bool]  # per sequence: was its varying text cut to fit the token limit


@dataclass(frozen=True)
class ContinuationIds:
    """A context followed by a continuation; `ids[start:]` are the continuation's tokens (`start >= 1`)."""

    ids: list[int]
    start: int


@dataclass(frozen=True)
class _Layout:
    """Sequence i = `shared_ids + encode(head + varying[i] + tail) + suffix_ids`."""

    shared_ids: list[int]
    head: str
    tail: str
    suffix_ids: list[int]


class PromptTokenizer:
    """A fast transformers tokenizer that encodes `PromptParts` with identical shared ids per request."""

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("radixserve needs a fast tokenizer (a tokenizer.json next to the model), "
                             f"got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self.leading_ids, self.trailing_ids = self._single_affixes()
        self._pair_affixes = self._pair_affixes_of()
        self._safe = self._safe_point_pattern()

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without the tokenizer's special tokens."""
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

    def shared_prefix_ids(self, shared: str) -> list[int]:
        """Ids every sequence of a request with shared text `shared` starts with (for routing keys)."""
        return self.leading_ids + self.encode(shared[:self._last_safe_point(shared)])

    def pair_prefix_ids(self, first: str) -> list[int]:
        """Ids every pair `tokenizer(first, second)` starts with, whatever the second text."""
        lead, mid, _ = self._pair_affixes
        return lead + self.encode(first) + mid

    def routing_prefix_ids(self, template: Template, query: str = "", instruction: str | None = None) -> list[int]:
        """Ids every sequence of a rerank (`query`) or embed request starts with: the source of its routing key."""
        if isinstance(template, CrossEncoderPair):
            template.shared_prefix(query, instruction)  # refuses an instruction
            return self.pair_prefix_ids(query)
        if isinstance(template, EmbedTemplate):
            return self.shared_prefix_ids(template.shared_prefix(instruction))
        return self.shared_prefix_ids(template.shared_prefix(query, instruction))

    def encode_prompts(self, parts: PromptParts, limit: int, truncate: bool, end_ids: Sequence[int] = (),
                       what: str = "item") -> EncodedBatch:
        """`leading + encode(shared + varying[i] + suffix) + end_ids` per item, equal to encoding the whole
        string, with the shared part's ids computed once. See `_encode_layout` for `limit` and `truncate`."""
        k = self._last_safe_point(parts.shared)
        m = self._first_safe_point(parts.suffix)
        layout = _Layout(
            shared_ids=self.leading_ids + self.encode(parts.shared[:k]),
            head=parts.shared[k:],
            tail=parts.suffix[:m],
            suffix_ids=self.encode(parts.suffix[m:]) + list(end_ids),
        )
        return self._encode_layout(layout, parts.varying, limit, truncate, what)

    def encode_pairs(self, first: str, seconds: Sequence[str], limit: int, truncate: bool,
                     what: str = "item") -> EncodedBatch:
        """`tokenizer(first, seconds[i])` per item (the pair's special tokens included); truncation cuts
        `seconds[i]`."""
        lead, mid, tail = self._pair_affixes
        layout = _Layout(lead + self.encode(first) + mid, "", "", tail)
        return self._encode_layout(layout, seconds, limit, truncate, what)

    def encode_continuations(self, parts: PromptParts, continuations: Sequence[str], limit: int,
                             what: str = "continuation", context_what: str | None = None
                             ) -> list[list[ContinuationIds]]:
        """Per item i and continuation j, the ids of `shared + varying[i] + suffix + continuations[j]`, with the
        continuation's tokens marked: those past the longest common prefix with the context's own encoding. A
        token that merges across the join (`"Answer: " + "yes"` -> `" yes"`) counts as continuation, as when
        lm-evaluation-harness moves the context's trailing space into the continuation. Errors name the
        continuation as `what` j, preceded by `context_what` i when given ("input 2 with label 0")."""
        k = self._last_safe_point(parts.shared)
        shared_ids = self.leading_ids + self.encode(parts.shared[:k])
        contexts = [parts.shared[k:] + text + parts.suffix for text in parts.varying]
        context_ids = self.encode_batch(contexts)
        joined = self.encode_batch([c + cont for c in contexts for cont in continuations])
        out = []
        for i, ctx in enumerate(context_ids):
            row = []
            for j in range(len(continuations)):
                tail = joined[i * len(continuations) + j]
                ids = shared_ids + tail
                start = len(shared_ids) + _common_prefix_len(ctx, tail)
                name = f"{context_what} {i} with {what} {j}" if context_what else f"{what} {j}"
                _check_continuation(ids, start, name, limit, what)
                row.append(ContinuationIds(ids, start))
            out.append(row)
        return out

    def _encode_layout(self, layout: _Layout, varying: Sequence[str], limit: int, truncate: bool,
                       what: str) -> EncodedBatch:
        """Sequences of `layout` with at most `limit` tokens each. A longer one raises a ValueError naming the
        item, its length and the limit, unless `truncate`, which cuts its varying text; when the rest of the
        prompt alone exceeds the limit it raises either way."""
        fixed = len(layout.shared_ids) + len(layout.suffix_ids)
        middles = self.encode_batch([layout.head + text + layout.tail for text in varying])
        sequences, truncated = [], []
        for i, (text, middle) in enumerate(zip(varying, middles)):
            too_long = fixed + len(middle) > limit
            if too_long and not truncate:
                raise ValueError(f"{what} {i} gives a sequence of {fixed + len(middle)} tokens; the limit is "
                                 f"{limit}: shorten it or pass truncate=True")
            if too_long:
                middle = self._fit(layout, text, middle, limit, i, what)
            sequences.append(layout.shared_ids + middle + layout.suffix_ids)
            truncated.append(too_long)
        return EncodedBatch(layout.shared_ids, sequences, truncated)

    def _fit(self, layout: _Layout, text: str, middle: list[int], limit: int, index: int, what: str) -> list[int]:
        """The middle ids `encode(head + text[:cut] + tail)` for the longest cut at a token start of `text` that
        keeps the sequence within `limit`; `middle` is the uncut encoding.

        Cutting at a token start and re-tokenizing can give a few more tokens than kept (a word cut short
        splits differently), so cut again by the excess until it fits; the empty cut is checked to fit first.
        """
        fixed = len(layout.shared_ids) + len(layout.suffix_ids)
        budget = limit - fixed
        empty = self.encode(layout.head + layout.tail)
        if len(empty) > budget:
            raise ValueError(f"{what} {index}: the prompt without it already has {fixed + len(empty)} tokens; the "
                             f"limit is {limit}: shorten the shared part (query, instruction) or raise the limit")
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [start for start, _ in encoding["offset_mapping"]] + [len(text)]
        keep, ids = len(starts) - 1, middle
        while len(ids) > budget:
            keep = max(0, keep - (len(ids) - budget))
            ids = self.encode(layout.head + text[:starts[keep]] + layout.tail) if keep else empty
        return ids

    def _last_safe_point(self, text: str) -> int:
        """The last position of `text` where splitting cannot change its encoding, whatever follows; 0 if none."""
        points = self._safe_points(text)
        return points[-1] if points else 0

    def _first_safe_point(self, text: str) -> int:
        """The first position of `text` where splitting is safe whatever precedes it; `len(text)` if none."""
        points = self._safe_points(text)
        return points[0] if points else len(text)

    def _safe_points(self, text: str) -> list[int]:
        """Sorted safe split positions: both ends of each special token, and after each newline followed by a
        non-space character."""
        if self._safe is None:
            return []
        points = []
        for match in self._safe.finditer(text):
            points += [match.start(), match.end()] if match.group("special") is not None else [match.end()]
        return points

    def _single_affixes(self) -> tuple[list[int], list[int]]:
        """Special ids the tokenizer puts before and after one text (a BOS, Qwen3-Embedding's `<|endoftext|>`)."""
        lead, _, tail = _affixes_around(self.tokenizer("x")["input_ids"], [self.encode("x")])
        return lead, tail

    def _pair_affixes_of(self) -> tuple[list[int], list[int], list[int]]:
        """Special ids the tokenizer puts before, between and after a text pair (`[CLS] a [SEP] b [SEP]`)."""
        pair = self.tokenizer("x", "y")["input_ids"]
        lead, (mid,), tail = _affixes_around(pair, [self.encode("x"), self.encode("y")])
        return lead, mid, tail

    def _safe_point_pattern(self) -> re.Pattern | None:
        """A regex matching the special tokens (group "special", longest first) and the newlines that pass the
        probes; None when neither rule holds for this tokenizer."""
        specials = sorted(self._probe_specials(), key=len, reverse=True)
        special_group = f"(?P<special>{'|'.join(map(re.escape, specials))})" if specials else None
        newline = r"\n(?=\S)" if self._probe_newline() else None
        rules = [rule for rule in (special_group, newline) if rule]
        return re.compile("|".join(rules)) if rules else None

    def _probe_specials(self) -> list[str]:
        """Added tokens that split the text cleanly on both sides, checked on adversarial neighbours."""
        added = getattr(self.tokenizer, "added_tokens_decoder", {}).values()
        candidates = [t.content for t in added if not (t.lstrip or t.rstrip or t.single_word) and t.content]
        return [s for s in candidates if self._joins_exactly([
            ("x ", s + "y"), ("x\n", s + "\n"), ("é", s), ("x" + s, " y"), (s, "\n\ny"), (s, "\u0301y"),
            (s, "y"),
        ])]

    def _probe_newline(self) -> bool:
        """Whether splitting after a newline, before a non-space character, is exact for this tokenizer."""
        return self._joins_exactly([(left, right) for left in _NEWLINE_LEFTS for right in _NEWLINE_RIGHTS])

    def _joins_exactly(self, pairs: list[tuple[str, str]]) -> bool:
        lefts = self.encode_batch([a for a, _ in pairs])
        rights = self.encode_batch([b for _, b in pairs])
        joined = self.encode_batch([a + b for a, b in pairs])
        return all(a + b == ab for a, b, ab in zip(lefts, rights, joined))


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


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _check_continuation(ids: list[int], start: int, name: str, limit: int, what: str) -> None:
    if start >= len(ids):
        raise ValueError(f"{name} adds no tokens to the context: give a non-empty {what}")
    if start == 0:
        raise ValueError(f"{name} starts the sequence: the context must give at least one token before it")
    if len(ids) > limit:
        raise ValueError(f"{name} gives a sequence of {len(ids)} tokens; the limit is {limit}: "
                         f"shorten the context or the {what}")


def load_prompt_tokenizer(model: str) -> PromptTokenizer | None:
    """The model's tokenizer (AutoTokenizer from the same path), or None when a local model directory has no
    tokenizer files: such a model still runs `Engine.forward` on token ids, but not the text tasks. (transformers
    would otherwise build an empty tokenizer from the model type.)"""
    path = Path(model)
    if path.is_dir() and not any((path / name).exists() for name in _TOKENIZER_FILES):
        return None
    try:
        return PromptTokenizer(AutoTokenizer.from_pretrained(model))
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not load the tokenizer of model {model!r}: {err}") from err
