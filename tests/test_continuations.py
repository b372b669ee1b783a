"""The continuation checks the scoring tasks run on encoded rows (`radix_core.tasks.base.check_continuations`): a
continuation must add tokens after at least one context token, within the limit, and errors name it as the
character pre-check does (`radix_core.continuations.continuation_name`)."""

import pytest

from radix_core.continuations import ContinuationIds, EncodedContinuations, continuation_name
from radix_core.errors import RequestError
from radix_core.tasks.base import check_continuations


def rows(*items: tuple[list[int], int]) -> EncodedContinuations:
    """One context whose continuations are `(ids, start)`."""
    return EncodedContinuations([1], [[ContinuationIds(ids, start) for ids, start in items]])


def test_names_with_and_without_the_context():
    assert continuation_name(2, 0, "continuation", None) == "continuation 0"
    assert continuation_name(2, 1, "label", "input") == "input 2 with label 1"


def test_a_good_row_passes():
    check_continuations(rows(([1, 2, 3], 2), ([1, 4], 1)), limit=3)


@pytest.mark.parametrize("item, message, fix", [
    (([1, 2], 2), "continuation 0 adds no tokens to the context", "give a non-empty continuation"),
    (([5, 6], 0), "continuation 0 starts the sequence", "the context must give at least one token before it"),
    (([1, 2, 3, 4], 2), "continuation 0 gives a sequence of 4 tokens; the limit is 3",
     "shorten the context or the continuation"),
])
def test_each_refusal_names_the_continuation_and_the_fix(item, message, fix):
    with pytest.raises(RequestError) as err:
        check_continuations(rows(item), limit=3)
    assert str(err.value) == f"{message}: {fix}"


def test_the_first_bad_row_in_order_is_named_with_its_input():
    encoded = EncodedContinuations([1], [[ContinuationIds([1, 2], 1)], [ContinuationIds([1, 3], 2)]])
    with pytest.raises(RequestError, match="input 1 with label 0 adds no tokens to the context: give a non-empty "
                                           "label"):
        check_continuations(encoded, limit=8, what="label", context_what="input")
