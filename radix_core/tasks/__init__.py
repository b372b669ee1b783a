"""The scoring tasks users call (rerank, embed, classify, score), on top of `Engine.forward`.

Each is a function of the engine with a typed result carrying `Usage`; `Engine` exposes them as methods.
"""

from radix_core.tasks.common import Usage
from radix_core.tasks.config import TaskConfig
from radix_core.tasks.embed import EmbedResult, embed
from radix_core.tasks.rerank import RerankHit, RerankResult, rerank
from radix_core.tasks.scoring import ClassifyResult, ContinuationScore, ScoreResult, classify, score

__all__ = [
    "ClassifyResult", "ContinuationScore", "EmbedResult", "RerankHit", "RerankResult", "ScoreResult",
    "TaskConfig", "Usage", "classify", "embed", "rerank", "score",
]
