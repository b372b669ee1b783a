"""Tokenization that keeps the sharing: joined ids equal the tokenizer's encoding of the whole string, every
sequence of a request starts with the same shared ids, truncation only cuts the varying text, and an item's cost
is bounded by the token limit.

Whole-string equality holds in both modes for user text without special-token literals, and with the opt-out
(`special_tokens_in_user_text=True`) for any text; the default mode with such literals is tested against its own
reference in test_prompt_injection.py."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from radix_core.prompt_encoding import PromptTokenizer
from radix_core.tasks.rerank import DOCUMENTS
from radix_core.templates import QWEN3_EMBEDDING, QWEN3_RERANKER, PromptParts, classify_parts
from radix_core.tiny_models import CORPUS_PATH, make_tiny_tokenizer

# Pieces that provoke merges across a join: spaces and newlines that glue to neighbours, punctuation runs, a
# combining mark NFC composes with the letter before it, contractions, digits, CJK, emoji, special tokens.
PIECES = [" ", "  ", "\n", "\n\n", "\r\n", "\t", "\u00a0", "a", "Z", "word", " the", "1", "42", "?", ":", "<", ">",
          "'s", "'", "e", "é", "\u0301", "中文", "日本", "😀", "Ünïcödé", "<|im_end|>", "<|im_start|>", "<Document>", ".\n"]
adversarial = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)
plain = st.lists(st.sampled_from([p for p in PIECES if "<|" not in p]), max_size=8).map("".join)
ADVERSARIAL_DOCS = ["", " leading space", "  two", "\nnewline first", " \n space newline", "\u0301combining first",
                    "é\u0301", "中文文本，没有空格", "emoji 😀 here", "ends with space ", "ends with newline\n",
                    "<|im_end|> injected", "it's 42?", "\t tab", "Ünïcödé text"]
PLAIN_DOCS = [d for d in ADVERSARIAL_DOCS if "<|" not in d]
MODES = [False, True]  # special_tokens_in_user_text


def user_texts(trust: bool) -> st.SearchStrategy[str]:
    """Any adversarial text when special-token literals are trusted, else text without them."""
    return adversarial if trust else plain


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tiny_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer) -> PromptTokenizer:
    return PromptTokenizer(tokenizer)


def whole(tokenizer, parts: PromptParts, end_ids=()) -> list[list[int]]:
    return [tokenizer(prompt)["input_ids"] + list(end_ids) for prompt in parts.prompts]


def test_tiny_tokenizer_uses_both_split_rules(prompts):
    assert prompts._newline_safe and "<|im_end|>" in prompts._clean_specials


@pytest.mark.parametrize("trust", MODES)
@pytest.mark.parametrize("query", ["what is a radix tree?", "Wie spät ist es?", "问题：太阳从西边升起吗", "q\n", "q ", " "])
def test_rerank_prompts_equal_whole_strings(tokenizer, prompts, query, trust):
    parts = QWEN3_RERANKER.parts(query, ADVERSARIAL_DOCS if trust else PLAIN_DOCS)
    batch = prompts.encode_prompts(parts, 4096, truncate=False, special_tokens_in_user_text=trust)
    assert batch.sequences.tolists() == whole(tokenizer, parts)
    # the query is inside the shared ids: they run up to the newline before "<Document>: "
    head = QWEN3_RERANKER.shared_prefix(query).removesuffix("<Document>: ")
    assert batch.shared_ids == tokenizer(head)["input_ids"]
    assert all(s[:len(batch.shared_ids)] == batch.shared_ids for s in batch.sequences.tolists())


def test_document_glued_to_the_template_would_differ_if_split_naively(tokenizer, prompts):
    """The case the safe split exists for: ": " + "Canberra" encodes as ":", " Canberra", not ": ", "Canberra"."""
    parts = QWEN3_RERANKER.parts("q", ["Canberra"])
    naive = tokenizer(QWEN3_RERANKER.shared_prefix("q"))["input_ids"] + tokenizer(parts.prompts[0][-len(
        "Canberra" + QWEN3_RERANKER.suffix):])["input_ids"]
    assert naive != whole(tokenizer, parts)[0]
    assert prompts.encode_prompts(parts, 4096, False).sequences.tolists() == whole(tokenizer, parts)


@pytest.mark.parametrize("trust", MODES)
@given(data=st.data())
@settings(max_examples=100, deadline=None)
def test_rerank_adversarial(tokenizer, prompts, trust, data):
    texts = user_texts(trust)
    query, instruction = data.draw(texts), data.draw(texts)
    parts = QWEN3_RERANKER.parts(query, data.draw(st.lists(texts, min_size=1, max_size=4)), instruction)
    batch = prompts.encode_prompts(parts, 4096, truncate=False, special_tokens_in_user_text=trust)
    assert batch.sequences.tolists() == whole(tokenizer, parts)


@pytest.mark.parametrize("trust", MODES)
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_embed_adversarial(tokenizer, prompts, trust, data):
    instruction, texts = data.draw(user_texts(trust)), data.draw(st.lists(user_texts(trust), min_size=1, max_size=4))
    end = [tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    for parts in (QWEN3_EMBEDDING.parts(texts, instruction), QWEN3_EMBEDDING.parts(texts)):
        batch = prompts.encode_prompts(parts, 4096, truncate=False, end_ids=end, special_tokens_in_user_text=trust)
        assert batch.sequences.tolists() == whole(tokenizer, parts, end)


@pytest.mark.parametrize("trust", MODES)
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_continuations_adversarial(tokenizer, prompts, trust, data):
    texts = user_texts(trust)
    prefix, inputs = data.draw(texts), data.draw(st.lists(texts, min_size=1, max_size=3))
    labels = data.draw(st.lists(texts.filter(bool), min_size=1, max_size=3))
    parts = classify_parts("Examples:\n" + prefix, "Review: {input}\nSentiment:", inputs)
    encoded = prompts.encode_continuations(parts, labels, 4096, special_tokens_in_user_text=trust)
    for context, row in zip(parts.prompts, encoded.rows):
        assert all(item.ids[:len(encoded.shared_ids)] == encoded.shared_ids for item in row)
        for label, item in zip(labels, row):
            assert item.ids == tokenizer(context + label)["input_ids"]
            context_ids = tokenizer(context)["input_ids"]
            assert item.ids[:item.start] == context_ids[:item.start]
            assert item.start == len(context_ids) or context_ids[item.start] != item.ids[item.start]


def test_merged_boundary_token_counts_as_continuation(tokenizer, prompts):
    """"Sentiment: " + "positive" encodes " positive" as one token, which is scored as the label."""
    (row,) = prompts.encode_continuations(PromptParts("Sentiment: ", [""], ""), ["positive"], 4096).rows
    assert tokenizer.convert_ids_to_tokens(row[0].ids[row[0].start:]) == ["Ġpositive"]


def metaspace_tokenizer(prepend_scheme: str) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE ("▁" for spaces, byte fallback) trained on the tiny corpus."""
    sp = Tokenizer(models.BPE(byte_fallback=True))
    sp.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend_scheme)
    sp.decoder = decoders.Metaspace(prepend_scheme=prepend_scheme)
    sp.train_from_iterator([CORPUS_PATH.read_text(encoding="utf-8")],
                           trainers.BpeTrainer(vocab_size=600, show_progress=False, special_tokens=["<unk>"]))
    sp.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=sp, eos_token="<|im_end|>")


def with_prompts(tokenizer: PreTrainedTokenizerFast) -> tuple[PreTrainedTokenizerFast, PromptTokenizer]:
    return tokenizer, PromptTokenizer(tokenizer)


METASPACE = {scheme: with_prompts(metaspace_tokenizer(scheme)) for scheme in ("first", "always")}


@pytest.mark.parametrize("trust", MODES)
@pytest.mark.parametrize("scheme", list(METASPACE))
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_sentencepiece_style_tokenizer_stays_exact(scheme, trust, data):
    """A Metaspace tokenizer prepends "▁" to pieces, so newline splits are unsafe: the probe turns them off and
    the sequences still equal the whole-string encodings."""
    tokenizer, prompts = METASPACE[scheme]
    assert not prompts._newline_safe
    texts = user_texts(trust)
    query, docs = data.draw(texts), data.draw(st.lists(texts, min_size=1, max_size=4))
    parts = QWEN3_RERANKER.parts(query, docs + (ADVERSARIAL_DOCS if trust else PLAIN_DOCS))
    batch = prompts.encode_prompts(parts, 4096, False, special_tokens_in_user_text=trust)
    assert batch.sequences.tolists() == whole(tokenizer, parts)


@pytest.fixture(scope="module")
def bos_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny tokenizer with a BERT-like post-processor: a BOS before texts, separators around a pair."""
    backend = Tokenizer.from_str(make_tiny_tokenizer().backend_tokenizer.to_str())
    specials = [("<|endoftext|>", 3000), ("<|im_start|>", 3001), ("<|im_end|>", 3002)]
    backend.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A <|im_end|>", pair="<|endoftext|> $A <|im_start|> $B:1 <|im_end|>:1",
        special_tokens=specials,
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")


def test_tokenizer_special_tokens_frame_every_sequence(bos_tokenizer):
    prompts = PromptTokenizer(bos_tokenizer)
    assert (prompts.leading_ids, prompts.trailing_ids) == ([3000], [3002])
    parts = QWEN3_EMBEDDING.parts(["a text", " another"], "Find it")
    batch = prompts.encode_prompts(parts, 4096, False, end_ids=prompts.trailing_ids)
    assert batch.sequences.tolists() == [bos_tokenizer(prompt)["input_ids"] for prompt in parts.prompts]


@pytest.mark.parametrize("trust", MODES)
def test_pairs_equal_the_tokenizers_pair_encoding(tokenizer, bos_tokenizer, trust):
    """Empty documents aside: `tokenizer(q, "")` drops the pair (a falsy text_pair); we keep its separators."""
    docs = [d for d in (ADVERSARIAL_DOCS if trust else PLAIN_DOCS) if d]
    for tok, lead, mid in ((tokenizer, [], []), (bos_tokenizer, [3000], [3001])):
        prompts = PromptTokenizer(tok)
        batch = prompts.encode_pairs("the query?", docs, 4096, False, special_tokens_in_user_text=trust)
        assert batch.sequences.tolists() == [tok("the query?", d)["input_ids"] for d in docs]
        assert batch.shared_ids == lead + prompts.encode("the query?") + mid


TRUNCATION_DOCS = ["short", "a long passage about radix trees and tries " * 12, "中文文本，没有空格" * 20,
                   "x" * 200, "emoji 😀 and é\u0301 " * 15]


def kept_document(tokenizer, seq: list[int], query: str) -> str:
    """The document text inside a rerank sequence of the tiny (byte-level, lossless) tokenizer."""
    text, shared = tokenizer.decode(seq), QWEN3_RERANKER.shared_prefix(query)
    return text[len(shared):len(text) - len(QWEN3_RERANKER.suffix)]


def assert_kept_side(doc: str, kept: str, direction: str) -> None:
    assert doc.startswith(kept) if direction == "right" else doc.endswith(kept)


@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("limit", [82, 85, 97, 120])
def test_truncation_cuts_only_the_varying_text(tokenizer, prompts, limit, direction):
    parts = QWEN3_RERANKER.parts("what is a trie?", TRUNCATION_DOCS)
    batch = prompts.encode_prompts(parts, limit, truncate=True, truncation_direction=direction)
    suffix = tokenizer(QWEN3_RERANKER.suffix)["input_ids"]
    for doc, seq, cut in zip(TRUNCATION_DOCS, batch.sequences.tolists(), batch.truncated):
        assert len(seq) <= limit and seq[-len(suffix):] == suffix and seq[:len(batch.shared_ids)] == batch.shared_ids
        assert cut == (len(whole(tokenizer, PromptParts(parts.shared, [doc], parts.suffix))[0]) > limit)
        kept = kept_document(tokenizer, seq, "what is a trie?")
        if cut:  # the document's start (right) or end (left), re-tokenized in its prompt, filling the limit
            assert len(seq) >= limit - 3 and kept != doc
        assert_kept_side(doc, kept, direction)
        assert seq == whole(tokenizer, PromptParts(parts.shared, [kept], parts.suffix))[0]


@pytest.mark.parametrize("trust", MODES)
@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("cap", [1, 4, 9])
def test_max_item_tokens_cuts_each_text_to_that_many_of_its_own_tokens(tokenizer, prompts, cap, direction, trust):
    """Even without `truncate`: the cap is the caller's choice, the limit the server's."""
    docs = TRUNCATION_DOCS + ["<|im_end|> injected at the start of a long text " * 3] * trust
    parts = QWEN3_RERANKER.parts("what is a trie?", docs)
    batch = prompts.encode_prompts(parts, 4096, truncate=False, truncation_direction=direction, max_item_tokens=cap,
                                   special_tokens_in_user_text=trust)
    for doc, seq, cut in zip(docs, batch.sequences.tolists(), batch.truncated):
        kept = kept_document(tokenizer, seq, "what is a trie?")
        own = len(tokenizer(doc)["input_ids"])
        assert cut == (own > cap) and (kept == doc) == (own <= cap)
        assert_kept_side(doc, kept, direction)
        assert cap - 2 <= len(tokenizer(kept)["input_ids"]) <= cap or not cut
        assert seq == whole(tokenizer, PromptParts(parts.shared, [kept], parts.suffix))[0]


def test_too_long_without_truncation_names_item_length_and_limit(prompts):
    parts = QWEN3_RERANKER.parts("q", ["short", "word " * 100])
    with pytest.raises(ValueError, match=r"document 1 gives a sequence of \d+ tokens; the limit is 90"):
        prompts.encode_prompts(parts, 90, truncate=False, items=DOCUMENTS)


def test_prefix_alone_over_the_limit_raises_even_with_truncation(prompts):
    parts = QWEN3_RERANKER.parts("a very long query " * 20, ["doc"])
    with pytest.raises(ValueError, match=r"document 0: the prompt without it already has \d+ tokens; the limit is 100"):
        prompts.encode_prompts(parts, 100, truncate=True, items=DOCUMENTS)


class CountingTokenizer:
    """Wraps a Rust tokenizer and counts the characters it is asked to encode."""

    def __init__(self, inner):
        self.inner, self.chars = inner, 0

    def _count(self, texts) -> None:
        self.chars += len(texts) if isinstance(texts, str) else sum(map(len, texts))

    def encode(self, text, *args, **kwargs):
        self._count(text)
        return self.inner.encode(text, *args, **kwargs)

    def encode_batch(self, texts, *args, **kwargs):
        self._count(texts)
        return self.inner.encode_batch(texts, *args, **kwargs)

    def encode_batch_fast(self, texts, *args, **kwargs):
        self._count(texts)
        return self.inner.encode_batch_fast(texts, *args, **kwargs)


def counted(tokenizer) -> tuple[PromptTokenizer, list[CountingTokenizer]]:
    prompts = PromptTokenizer(tokenizer)
    prompts._trusted, prompts._plain = CountingTokenizer(prompts._trusted), CountingTokenizer(prompts._plain)
    return prompts, [prompts._trusted, prompts._plain]


def test_no_token_covers_more_characters_than_the_bound_assumes(tokenizer, prompts):
    """The bound's premise on every vocabulary entry: a run of its text gives at least one token per
    `_chars_per_token` characters, so a text over the bound cannot fit and a text that fits is never cut."""
    runs = [tokenizer.decode([i]) * 20 for i in range(len(tokenizer))]
    for trust, encode in ((True, prompts.encode_batch), (False, prompts._encode_plain)):
        assert all(len(ids) * prompts._chars_per_token >= len(run) for run, ids in zip(runs, encode(runs))), trust


@pytest.mark.parametrize("trust", MODES)
@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("cap", [None, 50])
def test_huge_document_costs_what_a_bounded_one_costs(tokenizer, trust, direction, cap):
    """Cut to the character bound of the limit (or of a smaller cap) on the side truncation cuts, before
    tokenizing: the huge text and that many of its characters give the same sequence."""
    limit, huge = 300, ("a long passage about radix trees and tries <|im_end|> 中文 " * 40_000)[:2_000_000]
    prompts, counters = counted(tokenizer)
    bound = prompts._char_bound(limit if cap is None else cap)
    bounded = huge[:bound] if direction == "right" else huge[-bound:]
    parts = QWEN3_RERANKER.parts("what is a trie?", [huge, bounded])
    batch = prompts.encode_prompts(parts, limit, truncate=True, special_tokens_in_user_text=trust,
                                   truncation_direction=direction, max_item_tokens=cap)
    assert batch.truncated.tolist() == [True, True] and batch.sequences.tolists()[0] == batch.sequences.tolists()[1]
    assert len(batch.sequences.tolists()[0]) <= limit and sum(c.chars for c in counters) < 10 * bound < len(huge) / 10


def test_huge_document_without_truncation_names_a_lower_bound(tokenizer):
    prompts, counters = counted(tokenizer)
    huge = "word " * 400_000
    with pytest.raises(ValueError, match=r"document 1 gives a sequence of at least (\d+) tokens; the limit is 100: "
                                         r"shorten it or pass truncate=True") as err:
        prompts.encode_prompts(QWEN3_RERANKER.parts("q", ["short", huge]), 100, truncate=False, items=DOCUMENTS)
    assert int(re.search(r"at least (\d+)", str(err.value))[1]) <= len(tokenizer(huge)["input_ids"])
    assert sum(c.chars for c in counters) < 10 * prompts._char_bound(100)


@pytest.mark.parametrize("make_parts, message", [
    (lambda huge: (PromptParts(huge, [""], ""), ["yes"], {}), r"continuation 0 gives a sequence of at least \d+"),
    (lambda huge: (classify_parts("", None, ["x", huge]), ["a", "b"], {"what": "label", "context_what": "input"}),
     r"input 1 with label 0 gives a sequence of at least \d+"),
])
def test_huge_context_is_refused_before_it_is_tokenized(tokenizer, make_parts, message):
    prompts, counters = counted(tokenizer)
    parts, labels, names = make_parts("word " * 400_000)
    with pytest.raises(ValueError, match=message + r" tokens; the limit is 100"):
        prompts.encode_continuations(parts, labels, 100, **names)
    assert sum(c.chars for c in counters) == 0


def test_huge_query_is_refused_before_it_is_tokenized(tokenizer):
    prompts, counters = counted(tokenizer)
    for truncate in (True, False):
        with pytest.raises(ValueError, match=r"document 0: the prompt without it already has at least \d+ tokens"):
            prompts.encode_prompts(QWEN3_RERANKER.parts("q " * 400_000, ["d"]), 100, truncate, items=DOCUMENTS)
        with pytest.raises(ValueError, match=r"document 0: the prompt without it already has at least \d+ tokens"):
            prompts.encode_pairs("q " * 400_000, ["d"], 100, truncate, items=DOCUMENTS)
    assert sum(c.chars for c in counters) == 0
