"""The vLLM side-by-side benchmark's workloads (`bench/peer_vllm.py`) have the sizes asked for."""

import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from peer_vllm import EMBED_TEXTS, INSTRUCTION, make_workloads  # noqa: E402  (bench/ is not a package)


@pytest.mark.parametrize("requests_8, requests_256, embed_requests", [(32, 2, 16), (48, 4, 96)])
def test_workloads_have_the_sizes_asked_for(requests_8, requests_256, embed_requests):
    """(48, 4, 96): the issue's embedding stream of 96 requests a kind needs more passages than the 8-document
    reranks' queries leave spare (it ran out, StopIteration, before the workloads drew groups for it)."""
    args = Namespace(requests_8=requests_8, requests_256=requests_256, embed_requests=embed_requests)
    workloads, _ = make_workloads(args, np.random.default_rng(0))
    sizes = {w.name: (len(w.requests), w.per_request) for w in workloads}
    assert sizes == {"rerank 8 docs": (requests_8, 8), "rerank 256 docs": (requests_256, 256),
                     "embed, instruction": (embed_requests, EMBED_TEXTS),
                     "embed, no instruction": (embed_requests, EMBED_TEXTS)}
    assert all(all(r["texts"]) for w in workloads[2:] for r in w.requests)
    assert all(INSTRUCTION in t for r in workloads[2].requests for t in r["texts"])
    assert not any(INSTRUCTION in t for r in workloads[3].requests for t in r["texts"])
