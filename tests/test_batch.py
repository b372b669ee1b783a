"""`prepare_batch`: the CPU half of a forward (checks, index, mode choice), picklable for another process."""

import pickle

import numpy as np
import pytest

from radix_core.batch import BatchLimits, prepare_batch

LIMITS = BatchLimits(vocab_size=100, max_seq_len=8, radix_threshold=0.9)


def test_auto_runs_the_mode_its_cost_model_predicts_fastest_and_off_without_sharing():
    """The limits' default costs (a 0.6B model's FLOP count): full's merge of 2 rows beats mlp's scatter of 13."""
    shared = prepare_batch([[1, 2, 3, 4], [1, 2, 3, 5]], "auto", LIMITS)
    assert shared.mode == "full" and shared.index.compression == pytest.approx(5 / 8)
    assert shared.cascade is not None
    plain = prepare_batch([[1, 2], [3, 4]], "auto", LIMITS)
    assert plain.mode == "off" and plain.index is None and plain.cascade is None


@pytest.mark.parametrize("mode", ["mlp", "full"])
def test_explicit_modes_keep_their_index(mode):
    prepared = prepare_batch([[1, 2], [3, 4]], mode, LIMITS)
    assert prepared.mode == mode and prepared.index.num_compact == 4


def test_prepared_batches_survive_pickling():
    prepared = pickle.loads(pickle.dumps(prepare_batch([[1, 2, 3], [1, 2]], "full", LIMITS)))
    np.testing.assert_array_equal(prepared.index.scatter, [0, 1, 2, 0, 1])
    assert prepared.num_tokens == 5 and prepared.num_sequences == 2


@pytest.mark.parametrize(
    "sequences, mode, message",
    [
        ([[1, 2], [3, 100]], "auto", r"sequence 1 has token id 100 outside the vocabulary \[0, 100\)"),
        ([[1] * 9], "off", "sequence 0 has 9 tokens; the limit is 8"),
        ([[1], []], "auto", "sequence 1 is empty"),
        ([[1]], "fast", "unknown radix mode 'fast': choose one of auto, off, mlp, full"),
    ],
)
def test_bad_batches_say_what_is_wrong(sequences, mode, message):
    with pytest.raises(ValueError, match=message):
        prepare_batch(sequences, mode, LIMITS)
