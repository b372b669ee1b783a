"""Long documents as chunks: a document's tokens cut into overlapping windows, each scored as a document of its own.

A document is tokenized alone (user text, as the tasks encode it) and cut at token boundaries into windows of at
most `ChunkSpec.tokens` tokens, neighbours sharing `overlap` tokens: window k covers tokens `[a_k, b_k)` and window
k + 1 starts at the last boundary at or before `b_k - overlap`. A boundary lies between two tokens that share no
character (the tokenizer's offset mapping), so a character that byte-level BPE splits over several tokens (an
emoji) is never cut, and each window is the text between two character offsets: `spans[c] = [start, end)`,
`document[start:end]` is chunk c's text. A boundary's offset is the end of the text before it; the first window
starts at the document's start and the last ends at its end, so a document of one window is itself, exactly. A run
of tokens without a boundary longer than a window (a window of fewer tokens than a character has bytes) makes one
longer window rather than a cut.

The task encodes every chunk's text as a document of its own (same template, same query or instruction): a chunk's
score is that of its text alone, and every chunk of every document starts with the request's shared ids, which
the radix engine computes once for all of them. Windows hold at most what fits the per-sequence limit beside the
prompt (the overlap keeping its share of a smaller window); a window cut inside a word can re-tokenize in its
prompt to a few more tokens, and a document with such a chunk is laid again with smaller windows (at most
`SHRINK_ROUNDS` times, by a step that starts at 1/32 of the window and doubles).

Windows are laid from the document's start (`direction` "right") or from its end ("left"). A document that needs
more than `max_chunks` windows keeps the first (or last) `max_chunks` with `truncate`, else it is refused;
`max_document_tokens` first keeps that many of its own tokens, on the same side. A text too long for the windows
it may have is cut (or refused) by its length in characters before it is tokenized (`radix_core.truncation`), so
a huge document costs no more than the longest one that fits.

A document's answer comes back from its chunks': a score pooled as `pool` says (`POOLS`, `pool_scores`, which also
finds the best chunk), an embedding as the token-weighted mean of its chunks' (`token_weighted_means`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from radix_core.chunk_spec import POOLS, ChunkSpec
from radix_core.errors import Items, RequestError
from radix_core.prompt_encoding import EncodedBatch, PromptTokenizer
from radix_core.tokens import TokenSequences
from radix_core.truncation import SHORTEN_SHARED, char_bound, keep_chars, tokens_at_least

_POOL = dict(zip(POOLS, (  # (scores (C,), each document's first chunk (D,)) -> (D,) scores
    lambda scores, firsts: np.maximum.reduceat(scores, firsts),
    lambda scores, firsts: np.add.reduceat(scores, firsts) / np.diff(np.r_[firsts, len(scores)]),
    lambda scores, firsts: scores[firsts],
)))
SHRINK_ROUNDS = 8  # layings of a document whose chunks re-tokenize past the limit, each with smaller windows

Encode = Callable[[list[str]], EncodedBatch]  # the task's sequences of these documents, cut to the limit


@dataclass(frozen=True)
class Chunks:
    """A request's chunks, document after document, windows in document order."""

    owners: np.ndarray  # (C,) int64 the document of each chunk, non-decreasing
    spans: np.ndarray  # (C, 2) int64 [start, end) character offsets of each chunk in its document
    tokens: np.ndarray  # (C,) int64 tokens of each chunk in its document's own encoding

    @property
    def firsts(self) -> np.ndarray:
        """(D,) int64 index of each document's first chunk (every document has at least one)."""
        return np.flatnonzero(np.r_[True, np.diff(self.owners) != 0])

    def texts(self, documents: Sequence[str]) -> list[str]:
        return [documents[d][s:e] for d, (s, e) in zip(self.owners.tolist(), self.spans.tolist())]


@dataclass(frozen=True)
class _Cuts:
    """Where one document may be cut: token boundaries in order, the first and last included."""

    tokens: np.ndarray  # (K,) int64 token index of each boundary
    chars: np.ndarray  # (K,) int64 its character offset in the document


def chunk_documents(prompts: PromptTokenizer, documents: Sequence[str], spec: ChunkSpec, encode: Encode, limit: int,
                    max_items: int, items: Items, trust: bool = False) -> tuple[Chunks, EncodedBatch]:
    """The chunks of `documents` and their sequences (`encode` of their texts), each within `limit` tokens; at
    most `max_items` chunks in all; errors name document d as item d of `items`. `trust`: special-token literals
    in the documents are special (the task config's `special_tokens_in_user_text`)."""
    empty = encode([""])
    fixed = empty.sequences.num_tokens  # the prompt's own tokens
    window = min(spec.tokens, limit - fixed)
    if window < 1:
        raise RequestError(f"the prompt without a {items.noun} already has {fixed} tokens; the limit is {limit}",
                           SHORTEN_SHARED, limit=limit)
    cuts = _document_cuts(prompts, documents, spec, window, items, trust)
    sizes = [window] * len(documents)
    laid: dict[int, list[tuple[int, int]]] = {}
    sequences: dict[int, TokenSequences] = {}
    pending = list(range(len(documents)))
    for attempt in range(SHRINK_ROUNDS):
        laid.update({d: _windows_of(cuts[d], sizes[d], spec, d, items) for d in pending})
        _check_total(sum(len(w) for w in laid.values()), max_items, items)
        texts = [documents[d][cuts[d].chars[i]:cuts[d].chars[j]] for d in pending for i, j in laid[d]]
        batch, first = encode(texts), 0
        for d in list(pending):
            count = len(laid[d])
            if not batch.truncated[first:first + count].any():
                sequences[d] = batch.sequences.select(first, first + count)
                pending.remove(d)
            elif sizes[d] == 1:
                raise _unfit(items, d, limit)
            else:  # a chunk re-tokenized past the limit: smaller windows, by a step that doubles each round
                sizes[d] = max(1, sizes[d] - (max(1, sizes[d] // 32) << attempt))
            first += count
        if not pending:
            break
    if pending:
        raise _unfit(items, pending[0], limit)
    ordered = TokenSequences.concat([sequences[d] for d in range(len(documents))])
    return _chunks(cuts, laid), EncodedBatch(empty.shared_ids, ordered, np.zeros(len(ordered), dtype=bool))


def lay_windows(cuts: np.ndarray, size: int, overlap: int) -> list[tuple[int, int]]:
    """Windows `(i, j)`, from `cuts[i]` to `cuts[j]`, covering `cuts[0]..cuts[-1]` (sorted token boundaries) in
    order: each ends at the last cut within `size` tokens of its start, or at the first cut past the previous
    window's end when that is later; the next starts at the last cut at least `overlap` tokens before that end, or
    at the first after the previous start when that is later."""
    last = len(cuts) - 1
    out, i, j = [], 0, 0
    while True:
        j = min(last, max(i + 1, j + 1, int(np.searchsorted(cuts, cuts[i] + size, side="right")) - 1))
        out.append((i, j))
        if j >= last:
            return out
        i = max(i + 1, int(np.searchsorted(cuts, cuts[j] - overlap, side="right")) - 1)


def pool_scores(scores: np.ndarray, chunks: Chunks, how: str) -> tuple[np.ndarray, np.ndarray]:
    """(D,) each document's score from its chunks' `scores` (C,) as `how` says (`POOLS`), and (D,) int64 the
    index of its best chunk (the first of equals)."""
    firsts = chunks.firsts
    best = np.array([f + int(np.argmax(part)) for f, part in zip(firsts, np.split(scores, firsts[1:]))])
    return _POOL[how](scores, firsts), best


def token_weighted_means(vectors: np.ndarray, chunks: Chunks) -> np.ndarray:
    """(D, d) each document's mean of its chunks' `vectors` (C, d), weighted by the chunks' tokens."""
    weights = np.maximum(chunks.tokens, 1).astype(np.float64)[:, None]  # (C, 1) an empty chunk still counts
    sums = np.add.reduceat(vectors * weights, chunks.firsts)  # (D, d)
    return (sums / np.add.reduceat(weights, chunks.firsts)).astype(vectors.dtype)


def _document_cuts(prompts: PromptTokenizer, documents: Sequence[str], spec: ChunkSpec, window: int, items: Items,
                   trust: bool) -> list[_Cuts]:
    """Each document's cuts, within `max_document_tokens` and the tokens its `max_chunks` windows can cover. Text
    beyond the character bound of those tokens is cut before tokenizing; without `truncate` a document over the
    bound of the windows' tokens is refused instead."""
    reach = window + (spec.max_chunks - 1) * (window - spec.overlap_at(window))  # tokens max_chunks cover
    cap = spec.max_document_tokens
    bound = char_bound(prompts.chars_per_token, reach if cap is None else min(cap, reach))
    kept = []
    for d, document in enumerate(documents):
        at_least = tokens_at_least(len(document), prompts.chars_per_token, reach)
        if at_least and not spec.truncate and (cap is None or cap > reach):
            raise _too_many_chunks(spec, d, items, f"has at least {at_least} tokens, more than {spec.max_chunks} "
                                   f"chunks of {window} tokens cover")
        kept.append(keep_chars(document, bound, spec.direction))
    encodings = prompts.encodings(kept, add_special_tokens=False, trust=trust)
    return [_cuts(e.offsets, len(text), len(document) - len(text), cap, spec.direction)
            for e, text, document in zip(encodings, kept, documents)]


def _cuts(offsets: list[tuple[int, int]], length: int, shift: int, cap: int | None, direction: str) -> _Cuts:
    """The boundaries of a text of `length` characters whose tokens span `offsets`, `shift` characters into its
    document, within its first (or last) `cap` tokens."""
    if not offsets:
        return _Cuts(np.array([0, 0]), np.array([shift, shift + length]))
    spans = np.asarray(offsets, dtype=np.int64)  # (n, 2)
    n = len(spans)
    before = np.maximum.accumulate(spans[:, 1])  # (n,) end of the text up to each token
    free = np.r_[True, spans[1:, 0] >= before[:-1], True]  # (n+1,) no character shared across the boundary
    tokens = np.flatnonzero(free)  # (K,)
    chars = np.r_[0, before[:-1], length][tokens]  # (K,)
    if cap is not None and cap < n:
        keep = tokens <= cap if direction == "right" else tokens >= n - cap
        tokens, chars = tokens[keep], chars[keep]
    return _Cuts(tokens, chars + shift)


def _windows_of(cuts: _Cuts, size: int, spec: ChunkSpec, index: int, items: Items) -> list[tuple[int, int]]:
    """The windows of one document as index pairs into its cuts, in document order, from its start (or end), at
    most `max_chunks` of them with `truncate`."""
    overlap = spec.overlap_at(size)
    if spec.direction == "right":
        windows = lay_windows(cuts.tokens, size, overlap)
    else:
        last = len(cuts.tokens) - 1
        mirrored = cuts.tokens[-1] + cuts.tokens[0] - cuts.tokens[::-1]  # (K,) the boundaries counted from the end
        windows = [(last - j, last - i) for i, j in lay_windows(mirrored, size, overlap)]
    if len(windows) > spec.max_chunks:
        if not spec.truncate:
            raise _too_many_chunks(spec, index, items, f"needs {len(windows)} chunks of at most {size} tokens")
        windows = windows[:spec.max_chunks]
    return sorted(windows)


def _chunks(cuts: list[_Cuts], laid: dict[int, list[tuple[int, int]]]) -> Chunks:
    owners = [d for d in range(len(cuts)) for _ in laid[d]]
    spans = [(cuts[d].chars[i], cuts[d].chars[j]) for d in range(len(cuts)) for i, j in laid[d]]
    tokens = [cuts[d].tokens[j] - cuts[d].tokens[i] for d in range(len(cuts)) for i, j in laid[d]]
    return Chunks(np.array(owners, dtype=np.int64), np.array(spans, dtype=np.int64).reshape(-1, 2),
                  np.array(tokens, dtype=np.int64))


def _check_total(total: int, max_items: int, items: Items) -> None:
    if total > max_items:
        raise RequestError.about("max_chunks_per_document", f"lets the {items.noun}s make {total} chunks in all, "
                                 f"more than the limit of {max_items} sequences per call", f"lower it, send fewer "
                                 f"or shorter {items.noun}s, or raise max_items in the task config", limit=max_items)


def _unfit(items: Items, index: int, limit: int) -> RequestError:
    return items.error(index, f" cannot be cut into chunks that fit the limit of {limit} tokens beside the prompt: "
                       "its chunks re-tokenize to more, or one character takes more tokens than fit",
                       "raise the per-item limit or shorten the shared part (query, instruction)", limit=limit)


def _too_many_chunks(spec: ChunkSpec, index: int, items: Items, how: str) -> RequestError:
    side = "first" if spec.direction == "right" else "last"
    return RequestError.about("max_chunks_per_document", f"is {spec.max_chunks}, but {items.noun} {index} {how}",
                              f"raise it, or allow truncate to score its {side} {spec.max_chunks} chunks",
                              limit=spec.max_chunks)
