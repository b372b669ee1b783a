"""Golden tests for the text tasks: each equals transformers run the plain way (whole strings through the
tokenizer, one sequence at a time, `AutoModelFor*`), on three families (Qwen3.5: the hybrid one); a batch equals
its items one by one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from radix_core.engine import Engine
from radix_core.tasks import TaskConfig
from radix_core.templates import QWEN3_EMBEDDING, QWEN3_RERANKER

FAMILIES = ["qwen3", "llama", "qwen3_5"]
QWEN3_FORMAT = ("qwen3", "qwen3_5")  # the Qwen3-Reranker and Qwen3-Embedding templates by default
TOL = dict(atol=1e-4, rtol=1e-4)
QUERY = "what is the capital of australia"
DOCS = ["Canberra is the capital city of Australia.", " Sydney is the largest city.", "\nBread is baked.",
        "中文文本，没有空格", "Wie spät ist es? Es ist schon halb acht."]
TEXTS = ["how do vaccines work", " leading space", "Ünïcödé and 😀", "a\n\nb", "x"]
FEW_SHOT = "Review: a wonderful film\nSentiment: positive\n\nReview: dull and slow\nSentiment: negative\n\n"
REVIEWS = ["great acting", "I fell asleep", "中文评论"]
LABELS = [" positive", " negative", " not sure at all"]  # the last one is several tokens
CONTEXT = "The capital of France is"
CONTINUATIONS = [" Paris", " Berlin, of course.", "Paris", " Paris"]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """`engine(family, head, radix="full")`; llama gets the Qwen3-Reranker template through the config."""
    cache = {}

    def get(family: str, head: str, radix: str = "full") -> Engine:
        if (family, head, radix) not in cache:
            llama_lm = (family, head) == ("llama", "causal_lm")
            tasks = TaskConfig(templates={"rerank": QWEN3_RERANKER}) if llama_lm else None
            cache[family, head, radix] = Engine.from_pretrained(str(tiny_model_dir(family, head)), device="cpu",
                                                                radix=radix, tasks=tasks)
        return cache[family, head, radix]

    return get


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    """`hf(family, head) -> (model, tokenizer)` loaded with transformers, float32."""
    classes = {"causal_lm": AutoModelForCausalLM, "seq_cls": AutoModelForSequenceClassification, "base": AutoModel}
    cache = {}

    def get(family: str, head: str):
        if (family, head) not in cache:
            path = tiny_model_dir(family, head)
            model = classes[head].from_pretrained(path, dtype=torch.float32).eval()
            cache[family, head] = model, AutoTokenizer.from_pretrained(path)
        return cache[family, head]

    return get


def run(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return out.logits[0] if hasattr(out, "logits") else out.last_hidden_state[0]


def rerank_prompt(doc: str) -> str:
    parts = QWEN3_RERANKER.parts(QUERY, [doc])
    return parts.prompts[0]


def continuation_logprob(model, tokenizer, context: str, continuation: str) -> float:
    """Sum of log-probs of the continuation's tokens: those of `context + continuation` past its common prefix
    with `context`'s own encoding (the lm-evaluation-harness split)."""
    ids = tokenizer(context + continuation)["input_ids"]
    ctx = tokenizer(context)["input_ids"]
    start = next(i for i, (a, b) in enumerate(zip(ctx + [-1], ids)) if a != b)
    logprobs = run(model, ids).log_softmax(-1)
    return sum(float(logprobs[i - 1, ids[i]]) for i in range(start, len(ids)))


@pytest.mark.parametrize("family", FAMILIES)
def test_rerank_causal_lm_is_p_yes(engine, hf, family):
    model, tok = hf(family, "causal_lm")
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    logits = torch.stack([run(model, tok(rerank_prompt(d))["input_ids"])[-1, [no, yes]] for d in DOCS])  # (n, 2)
    got = engine(family, "causal_lm").rerank(QUERY, DOCS)
    by_index = {hit.index: hit.score for hit in got.results}
    torch.testing.assert_close(torch.tensor([by_index[i] for i in range(len(DOCS))]), logits.softmax(-1)[:, 1], **TOL)
    raw = engine(family, "causal_lm").rerank(QUERY, DOCS, raw_scores=True)
    torch.testing.assert_close(torch.tensor([h.score for h in sorted(raw.results, key=lambda h: h.index)]),
                               logits[:, 1] - logits[:, 0], **TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_rerank_seq_cls(engine, hf, family):
    """qwen3 and qwen3_5 keep the Qwen3-Reranker prompt; llama uses the tokenizer's (query, document) pair."""
    model, tok = hf(family, "seq_cls")
    prompts = [tok(rerank_prompt(d))["input_ids"] if family in QWEN3_FORMAT else tok(QUERY, d)["input_ids"]
               for d in DOCS]
    want = torch.stack([run(model, ids)[0] for ids in prompts])  # (n,): the score at the last token
    got = engine(family, "seq_cls").rerank(QUERY, DOCS, raw_scores=True)
    torch.testing.assert_close(torch.tensor([h.score for h in sorted(got.results, key=lambda h: h.index)]), want, **TOL)
    probs = engine(family, "seq_cls").rerank(QUERY, DOCS)
    torch.testing.assert_close(torch.tensor([h.score for h in sorted(probs.results, key=lambda h: h.index)]),
                               want.sigmoid(), **TOL)


def test_rerank_sorts_and_cuts(engine):
    got = engine("qwen3", "causal_lm").rerank(QUERY, DOCS, top_n=3, return_documents=True)
    assert len(got.results) == 3
    assert [h.score for h in got.results] == sorted((h.score for h in got.results), reverse=True)
    assert all(h.document == DOCS[h.index] for h in got.results)
    full = engine("qwen3", "causal_lm").rerank(QUERY, DOCS)
    assert [h.index for h in full.results[:3]] == [h.index for h in got.results]
    assert full.results[0].document is None


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embed(engine, hf, family, pooling):
    """qwen3, qwen3_5: Qwen3-Embedding query format plus <|endoftext|>; llama: plain text, no instruction."""
    model, tok = hf(family, "base")
    instruction = "Given a question, retrieve passages" if family in QWEN3_FORMAT else None
    end = [tok.convert_tokens_to_ids("<|endoftext|>")] if family in QWEN3_FORMAT else []
    prompts = [QWEN3_EMBEDDING.query.format(instruction=instruction, text=t) if instruction else t for t in TEXTS]
    states = [run(model, tok(p)["input_ids"] + end) for p in prompts]
    pooled = torch.stack([s[-1] if pooling == "last" else s.mean(0) for s in states])
    got = engine(family, "base").embed(TEXTS, instruction=instruction, pooling=pooling)
    torch.testing.assert_close(torch.from_numpy(got.embeddings), torch.nn.functional.normalize(pooled, dim=-1), **TOL)
    short = engine(family, "base").embed(TEXTS, instruction=instruction, pooling=pooling, dimensions=16)
    torch.testing.assert_close(torch.from_numpy(short.embeddings),
                               torch.nn.functional.normalize(pooled[:, :16], dim=-1), **TOL)
    raw = engine(family, "base").embed(TEXTS, instruction=instruction, pooling=pooling, normalize=False)
    torch.testing.assert_close(torch.from_numpy(raw.embeddings), pooled, **TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_classify(engine, hf, family):
    model, tok = hf(family, "causal_lm")
    template = "Review: {input}\nSentiment:"
    want = torch.tensor([[continuation_logprob(model, tok, FEW_SHOT + template.format(input=r), label)
                          for label in LABELS] for r in REVIEWS], dtype=torch.float64).softmax(-1)
    got = engine(family, "causal_lm").classify(REVIEWS, LABELS, prefix=FEW_SHOT, template=template)
    torch.testing.assert_close(torch.from_numpy(got.probabilities), want, **TOL)
    assert got.labels == LABELS and len(got.predictions) == len(REVIEWS)
    called = engine(family, "causal_lm").classify(REVIEWS, LABELS, prefix=FEW_SHOT,
                                                  template=lambda r: template.format(input=r))
    np.testing.assert_allclose(called.probabilities, got.probabilities, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_score(engine, hf, family):
    model, tok = hf(family, "causal_lm")
    got = engine(family, "causal_lm").score(CONTEXT, CONTINUATIONS)
    for j, (cont, s) in enumerate(zip(CONTINUATIONS, got.scores)):
        ids = tok(CONTEXT + cont)["input_ids"]
        assert s.index == j and s.num_tokens == len(ids) - len(tok(CONTEXT)["input_ids"])
        assert s.logprob == pytest.approx(continuation_logprob(model, tok, CONTEXT, cont), abs=1e-4)
        assert s.mean_logprob == pytest.approx(s.logprob / s.num_tokens, abs=1e-6)


@pytest.mark.parametrize("family", QWEN3_FORMAT)
def test_batch_equals_items_one_by_one(engine, family):
    causal, base = engine(family, "causal_lm"), engine(family, "base")
    batch = {h.index: h.score for h in causal.rerank(QUERY, DOCS).results}
    alone = [causal.rerank(QUERY, [d]).results[0].score for d in DOCS]
    np.testing.assert_allclose([batch[i] for i in range(len(DOCS))], alone, atol=1e-5)
    together = base.embed(TEXTS, instruction="Find it").embeddings
    np.testing.assert_allclose(together, np.concatenate([base.embed([t], instruction="Find it").embeddings
                                                         for t in TEXTS]), atol=1e-5)
    probs = causal.classify(REVIEWS, LABELS, prefix=FEW_SHOT).probabilities
    np.testing.assert_allclose(probs, np.concatenate([causal.classify([r], LABELS, prefix=FEW_SHOT).probabilities
                                                      for r in REVIEWS]), atol=1e-5)
    scores = [s.logprob for s in causal.score(CONTEXT, CONTINUATIONS).scores]
    np.testing.assert_allclose(scores, [causal.score(CONTEXT, [c]).scores[0].logprob for c in CONTINUATIONS], atol=1e-4)


@pytest.mark.parametrize("family", QWEN3_FORMAT)
def test_every_mode_gives_the_same_scores(engine, family):
    want = engine(family, "causal_lm", "off").rerank(QUERY, DOCS)
    for radix in ("mlp", "full", "auto"):
        got = engine(family, "causal_lm", radix).rerank(QUERY, DOCS)
        assert [h.index for h in got.results] == [h.index for h in want.results]
        np.testing.assert_allclose([h.score for h in got.results], [h.score for h in want.results], atol=1e-5)


def test_usage_counts_shared_prefixes_once(engine):
    """The query and template are shared by all documents: computed rows = the shared prefix once + the rest."""
    causal = engine("qwen3", "causal_lm")
    causal.prefix_cache.clear()  # usage here counts what one request shares: a cold prefix cache
    engine("qwen3", "causal_lm", "off").prefix_cache.clear()
    prompts = causal.prompts
    batch_ids = [prompts.encode(rerank_prompt(d)) for d in DOCS]
    got = causal.rerank(QUERY, DOCS).usage
    assert got.input_tokens == sum(map(len, batch_ids))
    shared = len(prompts.encode_prompts(QWEN3_RERANKER.parts(QUERY, DOCS), 4096, False).shared_ids)
    assert shared > 50 and got.computed_tokens <= got.input_tokens - shared * (len(DOCS) - 1)
    assert engine("qwen3", "causal_lm", "off").rerank(QUERY, DOCS).usage.computed_tokens == got.input_tokens
