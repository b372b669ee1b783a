"""The scoring tasks users call (rerank, embed, classify, score), on top of `Engine.run`.

Each task is split in two halves so requests can be encoded in another process and batched across tasks:
`encode_task` checks and tokenizes a request into a `TaskJob` (CPU, from a picklable `TaskContext`), and
`run_jobs` runs several jobs as one forward batch, finishing each into its typed result carrying `Usage`.
`Engine` exposes each task as a method that runs one request alone.
"""

from radix_core.tasks.common import TaskContext, TaskJob, Usage
from radix_core.tasks.config import TaskConfig
from radix_core.tasks.embed import EmbedJob, EmbedResult
from radix_core.tasks.jobs import TASKS, BatchView, encode_task, run_jobs
from radix_core.tasks.requests import load_task_context, merge_results, routing_prefix, split_request
from radix_core.tasks.rerank import RerankHit, RerankJob, RerankResult
from radix_core.tasks.scoring import ClassifyJob, ClassifyResult, ContinuationScore, ScoreJob, ScoreResult

__all__ = [
    "TASKS", "BatchView", "ClassifyJob", "ClassifyResult", "ContinuationScore", "EmbedJob", "EmbedResult",
    "RerankHit", "RerankJob", "RerankResult", "ScoreJob", "ScoreResult", "TaskConfig", "TaskContext", "TaskJob",
    "Usage", "encode_task", "load_task_context", "merge_results", "routing_prefix", "run_jobs", "split_request",
]
