"""The HTTP routes' JSON encoder (`deployments.http.service.FastJSONResponse`): the standard library's JSON, number
for number, and its refusal of non-finite numbers; only faster."""

import json

import numpy as np
import pytest
from fastapi.responses import JSONResponse

from deployments.http.service import FastJSONResponse

BODIES = [
    {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": row}
                                for i, row in enumerate(np.random.default_rng(0).standard_normal((4, 64),
                                                                                                dtype=np.float32).tolist())]},
    {"results": [{"index": 3, "relevance_score": 0.12345678901234568}, {"index": 0, "relevance_score": 1e-5}]},
    {1: (1, 2.5), "text": "é\u2028<|im_end|>\"\\ \x00", "big": 123456789012345678901234567890, "none": None,
     "flags": [True, False], "tiny": 5e-324, "huge": 1.7976931348623157e308, "zero": -0.0},
    [],
]


@pytest.mark.parametrize("body", BODIES)
def test_the_json_is_the_standard_librarys(body):
    fast, plain = FastJSONResponse(body), JSONResponse(body)
    assert json.loads(fast.body) == json.loads(plain.body)
    assert fast.headers["content-type"] == plain.headers["content-type"]
    assert fast.headers["content-length"] == str(len(fast.body))


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_number_is_refused_as_the_standard_library_refuses_it(number):
    with pytest.raises(ValueError, match="not JSON compliant"):
        JSONResponse({"scores": [0.5, number]})
    with pytest.raises(ValueError, match="not JSON compliant"):
        FastJSONResponse({"scores": [0.5, number]})


def test_text_that_spells_nan_or_infinity_is_written():
    body = {"text": "NaN Infinity -Infinity", "NaN": 1.0}
    assert json.loads(FastJSONResponse(body).body) == body
