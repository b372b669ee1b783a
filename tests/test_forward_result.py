"""The head read off a forward result: rows computed on the host, only the asked columns, log-probabilities by
vocabulary chunks; each equal to the plain computation over the full head."""

import numpy as np
import pytest
import torch

from radix_core.engine import Engine

BATCH = [[5, 6, 7, 8, 9], [5, 6, 7, 10], [5, 6, 11], [12]]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Engine.from_pretrained(str(tiny_model_dir("qwen3", "causal_lm")), device="cpu")


@pytest.mark.parametrize("mode", ["off", "mlp", "full"])
def test_host_rows_are_the_device_mapping(engine, mode):
    result = engine.forward(BATCH, mode=mode)
    np.testing.assert_array_equal(result.row_of_token, result.plan.row_of_token.numpy())
    sequences, positions = np.array([0, 1, 2, 3, 1]), np.array([-1, 0, 2, 0, -2])
    np.testing.assert_array_equal(result.rows(sequences, positions),
                                  result.plan.row_of_token[[4, 5, 11, 12, 7]].numpy())


def test_columns_equal_those_of_the_full_head(engine):
    result = engine.forward(BATCH, mode="full")
    rows = result.rows(np.arange(4), np.full(4, -1))
    full = engine.arch.head_module(result.hidden[torch.from_numpy(rows)]).float().numpy()  # (4, vocab)
    np.testing.assert_allclose(result.head_outputs(rows), full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.head_outputs(rows, (7, 3)), full[:, [7, 3]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 100, 1 << 20])
def test_chunked_logprobs_equal_log_softmax(engine, chunk):
    result = engine.forward(BATCH, mode="full")
    rows = result.rows(np.array([0, 0, 1, 2, 3]), np.array([0, 3, 2, 1, 0]))
    targets = np.array([6, 9, 10, 11, 0])
    logits = engine.arch.head_module(result.hidden[torch.from_numpy(rows)]).float()  # (5, vocab)
    want = logits.log_softmax(-1)[torch.arange(5), torch.from_numpy(targets)].numpy()
    np.testing.assert_allclose(result.token_logprobs(rows, targets, chunk=chunk), want, rtol=1e-5, atol=1e-5)
