"""Tokenization that keeps the sharing: joined ids equal the tokenizer's encoding of the whole string, every
sequence of a request starts with the same shared ids, and truncation only cuts the varying text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from radix_core.templates import QWEN3_EMBEDDING, QWEN3_RERANKER, PromptParts, classify_parts
from radix_core.tiny_models import CORPUS_PATH, make_tiny_tokenizer
from radix_core.tokenization import PromptTokenizer

# Pieces that provoke merges across a join: spaces and newlines that glue to neighbours, punctuation runs, a
# combining mark NFC composes with the letter before it, contractions, digits, CJK, emoji, special tokens.
PIECES = [" ", "  ", "\n", "\n\n", "\r\n", "\t", "\u00a0", "a", "Z", "word", " the", "1", "42", "?", ":", "<", ">",
          "'s", "'", "e", "é", "\u0301", "中文", "日本", "😀", "Ünïcödé", "<|im_end|>", "<|im_start|>", "<Document>", ".\n"]
adversarial = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)
ADVERSARIAL_DOCS = ["", " leading space", "  two", "\nnewline first", " \n space newline", "\u0301combining first",
                    "é\u0301", "中文文本，没有空格", "emoji 😀 here", "ends with space ", "ends with newline\n",
                    "<|im_end|> injected", "it's 42?", "\t tab", "Ünïcödé text"]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tiny_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer) -> PromptTokenizer:
    return PromptTokenizer(tokenizer)


def whole(tokenizer, parts: PromptParts, end_ids=()) -> list[list[int]]:
    return [tokenizer(parts.shared + v + parts.suffix)["input_ids"] + list(end_ids) for v in parts.varying]


def test_tiny_tokenizer_uses_both_split_rules(prompts):
    assert prompts._safe is not None
    assert r"\n(?=\S)" in prompts._safe.pattern and "im_end" in prompts._safe.pattern


@pytest.mark.parametrize("query", ["what is a radix tree?", "Wie spät ist es?", "问题：太阳从西边升起吗", "q\n", "q ", " "])
def test_rerank_prompts_equal_whole_strings(tokenizer, prompts, query):
    parts = QWEN3_RERANKER.parts(query, ADVERSARIAL_DOCS)
    batch = prompts.encode_prompts(parts, 4096, truncate=False)
    assert batch.sequences == whole(tokenizer, parts)
    # the query is inside the shared ids: they run up to the newline before "<Document>: "
    head = parts.shared.removesuffix("<Document>: ")
    assert batch.shared_ids == tokenizer(head)["input_ids"]
    assert all(s[:len(batch.shared_ids)] == batch.shared_ids for s in batch.sequences)


def test_document_glued_to_the_template_would_differ_if_split_naively(tokenizer, prompts):
    """The case the safe split exists for: ": " + "Canberra" encodes as ":", " Canberra", not ": ", "Canberra"."""
    parts = QWEN3_RERANKER.parts("q", ["Canberra"])
    naive = tokenizer(parts.shared)["input_ids"] + tokenizer("Canberra" + parts.suffix)["input_ids"]
    assert naive != whole(tokenizer, parts)[0]
    assert prompts.encode_prompts(parts, 4096, False).sequences == whole(tokenizer, parts)


@given(query=adversarial, instruction=adversarial, docs=st.lists(adversarial, min_size=1, max_size=4))
@settings(max_examples=150, deadline=None)
def test_rerank_adversarial(tokenizer, prompts, query, instruction, docs):
    parts = QWEN3_RERANKER.parts(query, docs, instruction)
    batch = prompts.encode_prompts(parts, 4096, truncate=False)
    assert batch.sequences == whole(tokenizer, parts)


@given(instruction=adversarial, texts=st.lists(adversarial, min_size=1, max_size=4))
@settings(max_examples=100, deadline=None)
def test_embed_adversarial(tokenizer, prompts, instruction, texts):
    end = [tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    for parts in (QWEN3_EMBEDDING.parts(texts, instruction), QWEN3_EMBEDDING.parts(texts)):
        batch = prompts.encode_prompts(parts, 4096, truncate=False, end_ids=end)
        assert batch.sequences == whole(tokenizer, parts, end)


@given(prefix=adversarial, inputs=st.lists(adversarial, min_size=1, max_size=3),
       labels=st.lists(adversarial.filter(bool), min_size=1, max_size=3))
@settings(max_examples=100, deadline=None)
def test_continuations_adversarial(tokenizer, prompts, prefix, inputs, labels):
    parts = classify_parts("Examples:\n" + prefix, "Review: {input}\nSentiment:", inputs)
    rows = prompts.encode_continuations(parts, labels, 4096)
    for text, row in zip(parts.varying, rows):
        context = parts.shared + text + parts.suffix
        for label, item in zip(labels, row):
            assert item.ids == tokenizer(context + label)["input_ids"]
            context_ids = tokenizer(context)["input_ids"]
            assert item.ids[:item.start] == context_ids[:item.start]
            assert item.start == len(context_ids) or context_ids[item.start] != item.ids[item.start]


def test_merged_boundary_token_counts_as_continuation(tokenizer, prompts):
    """"Sentiment: " + "positive" encodes " positive" as one token, which is scored as the label."""
    (row,) = prompts.encode_continuations(PromptParts("Sentiment: ", [""], ""), ["positive"], 4096)
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


@pytest.mark.parametrize("scheme", list(METASPACE))
@given(query=adversarial, docs=st.lists(adversarial, min_size=1, max_size=4))
@settings(max_examples=60, deadline=None)
def test_sentencepiece_style_tokenizer_stays_exact(scheme, query, docs):
    """A Metaspace tokenizer prepends "▁" to pieces, so newline splits are unsafe: the probe turns them off and
    the sequences still equal the whole-string encodings."""
    tokenizer, prompts = METASPACE[scheme]
    assert prompts._safe is None or r"\n" not in prompts._safe.pattern
    parts = QWEN3_RERANKER.parts(query, docs + ADVERSARIAL_DOCS)
    assert prompts.encode_prompts(parts, 4096, False).sequences == whole(tokenizer, parts)


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
    assert batch.sequences == [bos_tokenizer(parts.shared + t)["input_ids"] for t in parts.varying]


def test_pairs_equal_the_tokenizers_pair_encoding(tokenizer, bos_tokenizer):
    """Empty documents aside: `tokenizer(q, "")` drops the pair (a falsy text_pair); we keep its separators."""
    docs = [d for d in ADVERSARIAL_DOCS if d]
    for tok in (tokenizer, bos_tokenizer):
        batch = PromptTokenizer(tok).encode_pairs("the query?", docs, 4096, False)
        assert batch.sequences == [tok("the query?", d)["input_ids"] for d in docs]
        assert batch.shared_ids == PromptTokenizer(tok).pair_prefix_ids("the query?")


@pytest.mark.parametrize("limit", [82, 85, 97, 120])
def test_truncation_cuts_only_the_varying_text(tokenizer, prompts, limit):
    docs = ["short", "a long passage about radix trees and tries " * 12, "中文文本，没有空格" * 20, "x" * 200]
    parts = QWEN3_RERANKER.parts("what is a trie?", docs)
    batch = prompts.encode_prompts(parts, limit, truncate=True)
    suffix = tokenizer(parts.suffix)["input_ids"]
    for doc, seq, cut in zip(docs, batch.sequences, batch.truncated):
        assert len(seq) <= limit and seq[-len(suffix):] == suffix and seq[:len(batch.shared_ids)] == batch.shared_ids
        assert cut == (len(whole(tokenizer, PromptParts(parts.shared, [doc], parts.suffix))[0]) > limit)
        if cut:  # a prefix of the document, re-tokenized as a whole string, filling the limit within a few tokens
            assert len(seq) >= limit - 3
            text = tokenizer.decode(seq)
            kept = text[len(parts.shared):len(text) - len(parts.suffix)]
            assert doc.startswith(kept) and seq == tokenizer(parts.shared + kept + parts.suffix)["input_ids"]


def test_too_long_without_truncation_names_item_length_and_limit(prompts):
    parts = QWEN3_RERANKER.parts("q", ["short", "word " * 100])
    with pytest.raises(ValueError, match=r"document 1 gives a sequence of \d+ tokens; the limit is 90"):
        prompts.encode_prompts(parts, 90, truncate=False, what="document")


def test_prefix_alone_over_the_limit_raises_even_with_truncation(prompts):
    parts = QWEN3_RERANKER.parts("a very long query " * 20, ["doc"])
    with pytest.raises(ValueError, match=r"document 0: the prompt without it already has \d+ tokens; the limit is 100"):
        prompts.encode_prompts(parts, 100, truncate=True, what="document")
