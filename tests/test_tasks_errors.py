"""Template registry, config overrides, limits and bad input of the text tasks: each error says what to do."""

from __future__ import annotations

import pytest

from radix_core.engine import Engine
from radix_core.errors import RequestError
from radix_core.tasks import TASKS, TaskConfig
from radix_core.templates import (
    QWEN3_EMBEDDING,
    QWEN3_RERANKER,
    CrossEncoderPair,
    EmbedTemplate,
    RerankTemplate,
    Segment,
    TemplateNotFound,
    classify_parts,
    resolve_template,
    template_from_dict,
)
from radix_core.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    cache = {}

    def get(family: str = "qwen3", head: str = "causal_lm", **tasks) -> Engine:
        key = (family, head, repr(sorted(tasks.items())))
        if key not in cache:
            cache[key] = Engine.from_pretrained(str(tiny_model_dir(family, head)), device="cpu", tasks=tasks or None)
        return cache[key]

    return get


def test_registry_defaults():
    assert resolve_template("rerank", "qwen3", "causal_lm") is QWEN3_RERANKER
    assert resolve_template("rerank", "qwen3", "seq_cls") is QWEN3_RERANKER
    assert isinstance(resolve_template("rerank", "mistral", "seq_cls"), CrossEncoderPair)
    assert resolve_template("embed", "qwen3", "base") is QWEN3_EMBEDDING
    assert resolve_template("embed", "llama", "base").query is None


def test_unknown_template_says_how_to_supply_one(engine):
    with pytest.raises(TemplateNotFound, match=r"no rerank prompt template is known for llama causal_lm models.*"
                                               r"TaskConfig\(templates="):
        engine("llama", "causal_lm").rerank("q", ["d"])
    with pytest.raises(TemplateNotFound, match=r"EmbedTemplate\(query="):
        engine("llama", "base").embed(["t"], instruction="Find it")


def test_shared_prefix_for_routing():
    """What the ingress hashes: everything before the document, query included; the default instruction fills in."""
    shared = QWEN3_RERANKER.shared_prefix("my query")
    assert shared.startswith(QWEN3_RERANKER.prefix) and shared.endswith("<Query>: my query\n<Document>: ")
    assert QWEN3_RERANKER.default_instruction in shared
    assert "Instruct: Find it\nQuery:" == QWEN3_EMBEDDING.shared_prefix("Find it")
    assert QWEN3_EMBEDDING.shared_prefix() == ""
    assert CrossEncoderPair().shared_prefix("my query") == "my query"
    with pytest.raises(ValueError, match="takes no instruction"):
        CrossEncoderPair().shared_prefix("q", "an instruction")


def test_templates_from_config_dicts(engine):
    config = TaskConfig.from_dict({"max_items": 3, "templates": {
        "rerank": {"prefix": "Q: ", "body": "{query}\nD: {document}", "suffix": "\nRelevant:", "yes_token": "yes"},
        "embed": {"query": "{instruction}: {text}", "end_token": "<|im_end|>"},
    }})
    assert config.templates["rerank"] == RerankTemplate("Q: ", "{query}\nD: {document}", "\nRelevant:")
    assert config.templates["embed"] == EmbedTemplate("{instruction}: {text}", "<|im_end|>")
    assert isinstance(template_from_dict("rerank", {"kind": "pair"}), CrossEncoderPair)
    llama = engine("llama", "causal_lm", templates=config.templates)
    assert len(llama.rerank("q", ["a", "b"]).results) == 2


@pytest.mark.parametrize("bad, message", [
    ({"body": "{query}", "prefix": "", "suffix": ""}, r"must contain \{document\} exactly once"),
    ({"body": "{document}", "prefix": "", "suffix": "", "colour": 1}, r"unknown rerank template fields \['colour'\]"),
])
def test_bad_template_dicts(bad, message):
    with pytest.raises(ValueError, match=message):
        template_from_dict("rerank", bad)


def test_bad_config():
    with pytest.raises(ValueError, match=r"unknown task config keys \['max_item'\]"):
        TaskConfig.from_dict({"max_item": 3})
    with pytest.raises(ValueError, match="must be a EmbedTemplate or a dict"):
        TaskConfig(templates={"embed": QWEN3_RERANKER})
    with pytest.raises(ValueError, match=r"unknown field .*\{document\}, \{query\}, \{instruction\}"):
        QWEN3_RERANKER.__class__("", "{document} {colour}", "").parts("q", ["d"])


def test_classify_template_shares_its_head():
    parts = classify_parts("shots\n", "Review: {input}\nSentiment:", ["a", "b"])
    assert parts.shared == (Segment("shots\n", user=True), Segment("Review: ", user=False))
    assert (parts.varying, parts.suffix) == (["a", "b"], (Segment("\nSentiment:", user=False),))


@pytest.mark.parametrize("call, message", [
    (lambda e: e.rerank("", ["d"]), "query is empty"),
    (lambda e: e.rerank("q", []), "documents is empty"),
    (lambda e: e.rerank("q", "a document"), "documents must be a list of strings, got str"),
    (lambda e: e.rerank("q", ["d"] * 5), "5 documents are more than the limit of 4 per call"),
    (lambda e: e.rerank("q", ["d", 3]), r"documents\[1\] must be a string"),
    (lambda e: e.rerank("q", ["d"], top_n=0), "top_n must be at least 1"),
    (lambda e: e.embed([]), "texts is empty"),
    (lambda e: e.embed(["t"] * 5), "5 texts are more than the limit of 4"),
    (lambda e: e.embed(["t"], dimensions=65), "dimensions must be between 1 and the model's hidden size 64"),
    (lambda e: e.embed(["t"], pooling="cls"), "unknown pooling 'cls'"),
    (lambda e: e.rerank("q", ["d"], truncation_direction="up"), "unknown truncation_direction 'up': choose one of "
                                                                 "right, left"),
    (lambda e: e.embed(["t"], truncation_direction="Left"), "unknown truncation_direction 'Left'"),
    (lambda e: e.rerank("q", ["d"], max_document_tokens=0), "max_document_tokens must be a whole number of tokens, "
                                                            "at least 1, got 0"),
    (lambda e: e.embed(["t"], max_text_tokens=2.5), "max_text_tokens must be an integer, got float"),
    (lambda e: e.classify(["x"], []), "labels is empty"),
    (lambda e: e.classify(["x"], [" a", " a"]), "labels must be distinct"),
    (lambda e: e.classify(["x"], [" a", ""]), r"labels\[1\] is empty"),
    (lambda e: e.classify(["x"] * 5, [" a"]), "5 inputs are more than the limit of 4"),
    (lambda e: e.classify(["x"], [" a"], template="no field"), r"must contain \{input\} exactly once"),
    (lambda e: e.classify(["x"], [" a"], template="Review: {input"), "template is not a format string holding"),
    (lambda e: e.classify(["x"], [" a"], template="{input} {x}"), r"template is not a format string .*unknown field"),
    (lambda e: e.classify(["x", ""], ["a"]), r"inputs\[1\] is empty"),
    (lambda e: e.score("", [" a"]), "context is empty"),
    (lambda e: e.score("c", []), "continuations is empty"),
    (lambda e: e.score("c", [" a", ""]), r"continuations\[1\] is empty"),
])
def test_bad_input(engine, call, message):
    with pytest.raises(RequestError, match=message):
        call(engine(max_items=4))


def test_an_empty_input_is_refused_alone_or_in_a_list(engine):
    e = engine(max_items=4)
    for inputs in ([""], ["x", ""]):
        with pytest.raises(ValueError, match=rf"texts\[{len(inputs) - 1}\] is empty"):
            e.embed(inputs)
        with pytest.raises(ValueError, match=rf"inputs\[{len(inputs) - 1}\] is empty"):
            e.classify(inputs, ["a"])


def test_token_limit_truncates_documents_or_names_the_item(engine):
    limited = engine(max_tokens=100)
    long_doc = "a passage about tries and radix trees " * 20
    assert len(limited.rerank("q", ["short", long_doc]).results) == 2
    with pytest.raises(ValueError, match=r"document 1 gives a sequence of \d+ tokens; the limit is 100"):
        limited.rerank("q", ["short", long_doc], truncate=False)
    with pytest.raises(ValueError, match=r"document 0: the prompt without it already has \d+ tokens; the limit is 100"):
        limited.rerank("a long query " * 30, ["short"])
    with pytest.raises(ValueError, match=r"text 1 gives a sequence of \d+ tokens; the limit is 100"):
        limited.embed(["short", long_doc], truncate=False)
    assert limited.embed(["short", long_doc]).usage.input_tokens <= 200
    with pytest.raises(ValueError, match=r"continuation 0 gives a sequence of \d+ tokens; the limit is 100"):
        limited.score("c", [" " + long_doc])


@pytest.mark.parametrize("direction", ["right", "left"])
def test_cut_items_are_the_tokenizers_encoding_of_the_kept_text_in_its_prompt(engine, direction):
    """max_document_tokens / max_text_tokens and the token limit cut at a token boundary on the chosen side; the
    sequence is what the tokenizer makes of the prompt holding the kept text, and scores as that text does."""
    e, limited = engine(), engine(max_tokens=100)
    tokenizer, keeps = e.prompts.tokenizer, str.startswith if direction == "right" else str.endswith
    doc = "a passage about tries and radix trees, " * 20 + "ending here"
    for model, cap in ((e, 7), (limited, None)):
        job = TASKS["rerank"].encode(model.context, {"query": "q", "documents": [doc], "max_document_tokens": cap,
                                                      "truncation_direction": direction})
        (ids,) = job.sequences.tolists()
        shared, text = QWEN3_RERANKER.shared_prefix("q"), tokenizer.decode(ids)
        kept = text[len(shared):len(text) - len(QWEN3_RERANKER.suffix)]
        assert keeps(doc, kept) and kept != doc and len(ids) <= 100
        assert ids == tokenizer(shared + kept + QWEN3_RERANKER.suffix)["input_ids"]
        assert cap is None or len(tokenizer(kept)["input_ids"]) <= cap
        cut = model.rerank("q", [doc], max_document_tokens=cap, truncation_direction=direction).results[0].score
        assert cut == pytest.approx(model.rerank("q", [kept]).results[0].score, abs=1e-6)
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    job = TASKS["embed"].encode(e.context, {"texts": [doc], "max_text_tokens": 5, "truncation_direction": direction})
    (ids,) = job.sequences.tolists()
    kept = tokenizer.decode(ids[:-1])
    assert keeps(doc, kept) and ids == tokenizer(kept)["input_ids"] + [end] and len(ids) <= 6


def test_continuation_needs_a_context_token_before_it(engine):
    """"c" + "a..." encodes as one token "ca": nothing of the context is left to condition on."""
    with pytest.raises(ValueError, match="continuation 0 starts the sequence: the context must give at least one"):
        engine().score("c", ["a passage"])


def test_heads_that_cannot_do_a_task(engine):
    with pytest.raises(ValueError, match="has no LM or score head, so it cannot rerank"):
        engine("qwen3", "base").rerank("q", ["d"])
    with pytest.raises(ValueError, match="scoring continuations needs a causal LM"):
        engine("qwen3", "seq_cls").score("c", [" a"])


def test_model_without_tokenizer_runs_ids_but_not_text(tmp_path):
    path = make_tiny_model(tmp_path / "m", "qwen3", "causal_lm")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink()
    engine = Engine.from_pretrained(str(path), device="cpu")
    assert engine.prompts is None and len(engine.lm_logits([[1, 2, 3]])) == 1
    with pytest.raises(ValueError, match="has no tokenizer, which the text tasks need"):
        engine.rerank("q", ["d"])
