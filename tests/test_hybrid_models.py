"""Hybrid models (Qwen3.5: Gated DeltaNet + gated attention) in the engine: every mode and head equals transformers
run one sequence at a time, on random tries too, and a batch equals its sequences run alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
)

from radix_core.architectures import ModelLoadError
from radix_core.engine import Engine
from radix_core.gated_delta import recurrence_plan
from radix_core.prefix_cache import MIN_LEAF_ROWS
from radix_core.tiny_models import make_tiny_model

MODES = ["off", "mlp", "full", "auto"]
VOCAB = 400
LINEAR, FULL = "linear_attention", "full_attention"
# name -> (arch, make_tiny_model settings): Qwen3.5's 3:1 pattern, each kind of layer alone, one key head (for
# both the attention's K/V and the DeltaNet's q/k) shared by four query/value heads, and Qwen3-Next's 3:1
CONFIGS = {
    "3:1": ("qwen3_5", dict(num_layers=4)),
    "linear-only": ("qwen3_5", dict(num_layers=2, layer_types=[LINEAR, LINEAR])),
    "attention-only": ("qwen3_5", dict(num_layers=2, layer_types=[FULL, FULL])),
    "gqa": ("qwen3_5", dict(num_layers=4, num_kv_heads=1, layer_types=[LINEAR, FULL, LINEAR, FULL])),
    "qwen3-next": ("qwen3_next", dict(num_layers=4)),
}


def trie_batch() -> list[list[int]]:
    """Branching at several depths, a sequence ending inside another's prefix, duplicates, one-token segments
    (shorter than the convolution's kernel) and a chain longer than the rule's 64-row chunks."""
    rng = np.random.default_rng(0)
    tokens = lambda n: rng.integers(0, VOCAB, n).tolist()  # noqa: E731
    system, query, other = tokens(70), tokens(9), tokens(5)
    return [system + query + tokens(20), system + query + tokens(3), system, system + query + tokens(20)[:1],
            system[:2], [system[0]], other + [1], other + [2], other + [1, 3], other, tokens(130),
            system + tokens(1) + [7], system + query + tokens(20)]


BATCH = trie_batch()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    built = {}

    def get(config: str, head: str = "base"):
        if (config, head) not in built:
            path = tmp_path_factory.mktemp("hybrid") / f"{config.replace(':', '-')}-{head}"
            arch, settings = CONFIGS[config]
            built[config, head] = make_tiny_model(path, arch, head, **settings)
        return built[config, head]

    return get


@pytest.fixture(scope="module")
def engine(model_dir):
    built = {}

    def get(config: str, head: str = "base") -> Engine:
        if (config, head) not in built:
            built[config, head] = Engine.from_pretrained(str(model_dir(config, head)), device="cpu",
                                                         prefix_cache_bytes=0)
        return built[config, head]

    return get


@pytest.fixture(scope="module")
def reference(model_dir):
    """Per (config, head): transformers' outputs for `BATCH`, one sequence at a time: final-normed hidden states
    (base), logits (L, vocab) (causal_lm) or (1, labels) (seq_cls)."""
    cache = {}
    classes = {"base": AutoModel, "causal_lm": AutoModelForCausalLM, "seq_cls": AutoModelForSequenceClassification}

    def get(config: str, head: str = "base") -> list[torch.Tensor]:
        if (config, head) not in cache:
            model = classes[head].from_pretrained(model_dir(config, head), dtype=torch.float32).eval()
            with torch.no_grad():
                outputs = [model(torch.tensor([s]), use_cache=False) for s in BATCH]
            cache[config, head] = [out.last_hidden_state[0] if head == "base" else out.logits[0] for out in outputs]
        return cache[config, head]

    return get


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("mode", MODES)
def test_hidden_states_equal_transformers(engine, reference, config, mode):
    got = engine(config).hidden_states(BATCH, mode=mode)
    for g, w in zip(got, reference(config), strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_lm_logits_equal_transformers(engine, reference, mode):
    positions = [[0, 75, -1], [-1], [-1, 3], [-1], [0, -1], [-1], [-1], [2, -1], [-1], [-1], [64, -1], [-1], [-1]]
    got = engine("3:1", "causal_lm").lm_logits(BATCH, positions, mode=mode)
    for pos, g, logits in zip(positions, got, reference("3:1", "causal_lm"), strict=True):
        torch.testing.assert_close(g, logits[pos], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_classification_scores_equal_transformers(engine, reference, mode):
    got = engine("gqa", "seq_cls").classification_scores(BATCH, mode=mode)
    torch.testing.assert_close(got, torch.stack(reference("gqa", "seq_cls")), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_batch_equals_per_sequence(engine, mode):
    """Within float reassociation: in a batch the rule's chunks start at the trie's branches, alone at 0."""
    model = engine("3:1", "causal_lm")
    together = model.last_hidden_states(BATCH, mode=mode)
    alone = torch.cat([model.last_hidden_states([s], mode=mode) for s in BATCH])
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=1e-4)


@st.composite
def random_tries(draw) -> list[list[int]]:
    """Sequences down a random trie over a 3-token alphabet (so paths share, part and repeat): deep branching,
    sequences ending inside others, duplicates and one-token segments."""
    count = draw(st.integers(1, 8))
    paths = []
    for _ in range(count):
        if paths and draw(st.booleans()):  # continue, cut or repeat an earlier path
            base = draw(st.sampled_from(paths))
            keep = draw(st.integers(1, len(base)))
            paths.append(base[:keep] + draw(st.lists(st.integers(1, 3), max_size=12)))
        else:
            paths.append(draw(st.lists(st.integers(1, 3), min_size=1, max_size=30)))
    return paths


@settings(max_examples=12, deadline=None)
@given(batch=random_tries(), mode=st.sampled_from(["mlp", "full"]))
def test_random_tries_equal_transformers(engine, reference_model, batch, mode):
    got = engine("3:1").hidden_states(batch, mode=mode)
    for seq, g in zip(batch, got, strict=True):
        with torch.no_grad():
            want = reference_model(torch.tensor([seq]), use_cache=False).last_hidden_state[0]
        torch.testing.assert_close(g, want, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def reference_model(model_dir):
    return AutoModel.from_pretrained(model_dir("3:1"), dtype=torch.float32).eval()


def test_chains_start_from_their_parents_state():
    """Rows 0-1-2, then 3 and 5 below row 2, then 4 and 6 below row 3: chains [0 1 2] | [3] [5] | [4] [6] by
    depth, each level's chains starting from their parent chain's state; windows reach up the path (7: zeros)."""
    parent = np.array([-1, 0, 1, 2, 3, 2, 3])
    plan = recurrence_plan(parent, kernel=4, device=torch.device("cpu"))
    assert [level.rows.tolist() for level in plan.levels] == [[[0, 1, 2]], [[3], [5]], [[4], [6]]]
    assert plan.num_slots == 2 and plan.levels[0].slots.tolist() == [0] and plan.levels[1].slots.tolist() == [1]
    assert plan.levels[1].parent_slots.tolist() == [0, 0] and plan.levels[2].parent_slots.tolist() == [1, 1]
    assert plan.window[6].tolist() == [1, 2, 3, 6] and plan.window[1].tolist() == [7, 7, 0, 1]
    long = recurrence_plan(np.array([-1, *range(69), -1, 70]), kernel=4, device=torch.device("cpu"))
    assert [level.valid.sum(1).tolist() for level in long.levels] == [[2], [70]]  # one call per number of chunks


@pytest.mark.parametrize("mode", ["off", "full"])
def test_a_multimodal_checkpoint_runs_as_its_text_model(model_dir, tmp_path, mode):
    """A Qwen3.5 checkpoint as published (`Qwen3_5ForConditionalGeneration`, vision tower included) is read as its
    text causal LM, equal to transformers' `AutoModelForCausalLM` of the same directory."""
    text = AutoConfig.from_pretrained(model_dir("3:1", "causal_lm")).to_dict()
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"])
    with torch.random.fork_rng(devices=[]):
        Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision)).save_pretrained(tmp_path)
    engine = Engine.from_pretrained(str(tmp_path), device="cpu", radix=mode, prefix_cache_bytes=0)
    assert (engine.arch.family, engine.arch.head) == ("qwen3_5_text", "causal_lm")
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    got = engine.lm_logits(BATCH[:6])
    for seq, g in zip(BATCH[:6], got, strict=True):
        with torch.no_grad():
            want = model(torch.tensor([seq]), use_cache=False).logits[0, -1:]  # (1, vocab)
        torch.testing.assert_close(g, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("config", ["3:1", "linear-only"])
def test_warm_up_calibrates_auto(model_dir, config):
    """The warm-up's attention kernels and auto's calibration run for a model with and without attention layers
    (a machine too busy to measure in the budget keeps the static costs, and says so)."""
    hybrid = Engine.from_pretrained(str(model_dir(config)), device="cpu", radix="auto", prefix_cache_bytes=0)
    hybrid.warm_up()
    assert "calibrat" in hybrid.mode_costs.source and hybrid.mode_costs.rows > 0
    assert hybrid.prepare(BATCH).mode in ("off", "mlp", "full")



def test_batch_invariant_mode_is_refused_for_hybrid_models(model_dir):
    """The recurrence's chunks start where the batch's trie branches, so the mode could not keep its promise."""
    with pytest.raises(ModelLoadError, match="batch_invariant does not cover hybrid models"):
        Engine.from_pretrained(str(model_dir("3:1")), device="cpu", batch_invariant=True)

@pytest.fixture(scope="module")
def cached(model_dir):
    """`cached(mode, budget)`: a 3:1 engine with a cold prefix cache of `budget` bytes ("auto": 256 MiB)."""
    built = {}

    def get(mode: str, budget="auto") -> Engine:
        if (mode, budget) not in built:
            built[mode, budget] = Engine.from_pretrained(str(model_dir("3:1")), device="cpu", radix=mode,
                                                         prefix_cache_bytes=budget)
        built[mode, budget].prefix_cache.clear()
        return built[mode, budget]

    return get


def assert_alone(engine: Engine, reference: Engine, batch: list[list[int]], **run) -> np.ndarray:
    """`batch` through `engine` (cache on) equals each sequence alone through `reference` (cache off); returns
    the cached lengths."""
    result = engine.run(engine.prepare(batch), **run)
    per_token = result.hidden.index_select(0, result.plan.row_of_token)  # (N, hidden)
    for got, seq in zip(per_token.split(np.diff(result.plan.cu_seqlens).tolist()), batch, strict=True):
        torch.testing.assert_close(got, reference.hidden_states([seq], mode="off")[0], atol=1e-4, rtol=1e-4)
    return result.cached_lengths


@pytest.mark.parametrize("mode", ["off", "mlp", "full"])
def test_the_cache_continues_at_any_segment_end(cached, engine, mode):
    """Batch 1 caches prompt + query 1 as one segment, its recurrent state at its end. Batch 2 leaves it after the
    prompt: the walk splits it, the prompt has no state of its own yet, so batch 2 computes the prompt and keeps
    the state at its end; batch 3 continues from there, and a sequence ending inside the prompt reads it."""
    rng = np.random.default_rng(3)
    tokens = lambda n: rng.integers(0, VOCAB, n).tolist()  # noqa: E731
    prompt, q1, q2, q3 = tokens(37), tokens(5), tokens(MIN_LEAF_ROWS), tokens(1)  # q2 shared enough to be kept
    hybrid, reference = cached(mode), engine("3:1")
    batches = [[prompt + q1 + tokens(4), prompt + q1 + tokens(2)], [prompt + q2 + tokens(6), prompt + q2],
               [prompt + q3 + tokens(5), prompt + q2 + tokens(1)], [prompt + q2 + tokens(2), prompt[:20]]]
    lengths = [assert_alone(hybrid, reference, batch).tolist() for batch in batches]
    assert lengths == [[0, 0], [0, 0], [37, 37 + MIN_LEAF_ROWS], [37 + MIN_LEAF_ROWS, 20]]
    stats, shape = hybrid.prefix_cache.stats(), hybrid.prefix_cache.shape
    ends = sum(segment.end is not None for segment in hybrid.prefix_cache._resident)
    assert ends == stats.segments and stats.bytes == stats.inserted_tokens * shape.bytes + ends * shape.ends.bytes


@pytest.mark.parametrize("mode", ["off", "full"])
def test_scopes_and_evictions_keep_the_cache_exact(cached, engine, mode):
    """Scope a has the prompt cached, scope b not, in one batch; then a budget of a few prompts evicts."""
    rng = np.random.default_rng(4)
    tokens = lambda n: rng.integers(0, VOCAB, n).tolist()  # noqa: E731
    prompt, reference = tokens(30), engine("3:1")
    hybrid = cached(mode)
    assert_alone(hybrid, reference, [prompt + tokens(4), prompt + tokens(5)], scopes=["a", "a"])
    lengths = assert_alone(hybrid, reference, [prompt + tokens(6), prompt + tokens(7), prompt[:10]],
                           scopes=["a", "b", "a"])
    assert lengths.tolist() == ([30, 0, 10] if mode == "off" else [0, 0, 0])
    shape = hybrid.prefix_cache.shape
    small = cached(mode, 60 * shape.bytes + 3 * shape.ends.bytes)
    prompts = [tokens(25) for _ in range(3)]
    for which in (0, 1, 0, 2, 0, 1):
        assert_alone(small, reference, [prompts[which] + tokens(n) for n in (3, 5)])
        assert small.prefix_cache.stats().bytes <= small.prefix_cache.budget_bytes
    assert small.prefix_cache.stats().evictions > 0 and small.prefix_cache.stats().hit_tokens > 0
