"""The scoring tasks users call (rerank, embed, classify, score, predict), one `Task` object each (`TASKS`).

A request is served in halves so it can be encoded in another process and batched with requests of any task:
`Task.encode` checks and tokenizes it into a `TaskJob` (CPU, from a picklable `TaskContext`), `Task.split` cuts
it into token-bounded parts, `Engine.run_jobs` runs the parts of many requests as one forward batch and
finishes each from its `BatchView`, and `Task.merge` joins a request's parts into its typed result with `Usage`.
`Engine` exposes each task as a method that runs one request alone.
"""

from radix_core.tasks.base import HeadQuery, Task, TaskJob, Usage
from radix_core.tasks.config import TaskConfig
from radix_core.tasks.context import TaskContext, load_task_context
from radix_core.tasks.embed import EmbedJob, EmbedResult
from radix_core.tasks.predict import LabelScore, PredictJob, PredictResult
from radix_core.tasks.registry import TASKS, task_of
from radix_core.tasks.rerank import RerankHit, RerankJob, RerankResult
from radix_core.tasks.scoring import ClassifyJob, ClassifyResult, ContinuationScore, ScoreJob, ScoreResult
from radix_core.tasks.view import BatchView, finish_jobs

__all__ = [
    "TASKS", "BatchView", "ClassifyJob", "ClassifyResult", "ContinuationScore", "EmbedJob", "EmbedResult",
    "HeadQuery", "LabelScore", "PredictJob", "PredictResult", "RerankHit", "RerankJob", "RerankResult", "ScoreJob",
    "ScoreResult", "Task", "TaskConfig", "TaskContext", "TaskJob", "Usage", "finish_jobs", "load_task_context",
    "task_of",
]
