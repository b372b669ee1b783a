"""The scoring tasks users call (rerank, embed, classify, score, predict), one `Task` object each
(`radix_core.tasks.registry`), each with its typed request (`TaskRequest`).

A request is served in halves so it can be encoded in another process and batched with requests of any task:
`Task.encode` checks and tokenizes it into a `TaskJob` (CPU, from a picklable `TaskContext`), `Task.split` cuts
it into token-bounded parts, `Engine.run_jobs` runs the parts of many requests as one forward batch and
finishes each from its `BatchView` (`radix_core.finish`), and `Task.merge` joins a request's parts into its typed
result with `Usage`. `Engine` exposes each task as a method that runs one request alone.
"""

from radix_core.tasks.base import HeadQuery, Task, TaskJob
from radix_core.tasks.config import TaskConfig
from radix_core.tasks.context import TaskContext, load_task_context
from radix_core.tasks.embed import EmbedJob, EmbedRequest, EmbedResult
from radix_core.tasks.predict import LabelScore, PredictJob, PredictRequest, PredictResult
from radix_core.tasks.registry import ALL_TASKS, TASKS, task_for, task_of
from radix_core.tasks.request import TaskRequest
from radix_core.tasks.rerank import RerankHit, RerankJob, RerankRequest, RerankResult
from radix_core.tasks.scoring import (
    ClassifyJob,
    ClassifyRequest,
    ClassifyResult,
    ContinuationScore,
    ScoreJob,
    ScoreRequest,
    ScoreResult,
)
from radix_core.tasks.usage import Usage
from radix_core.tasks.view import BatchView

__all__ = [
    "ALL_TASKS", "TASKS", "BatchView", "ClassifyJob", "ClassifyRequest", "ClassifyResult", "ContinuationScore",
    "EmbedJob", "EmbedRequest", "EmbedResult", "HeadQuery", "LabelScore", "PredictJob", "PredictRequest",
    "PredictResult", "RerankHit", "RerankJob", "RerankRequest", "RerankResult", "ScoreJob", "ScoreRequest",
    "ScoreResult", "Task", "TaskConfig", "TaskContext", "TaskJob", "TaskRequest", "Usage", "load_task_context",
    "task_for", "task_of",
]
