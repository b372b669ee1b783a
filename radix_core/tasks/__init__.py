"""The scoring tasks users call (rerank, embed, classify, score, predict), one `Task` object each
(`radix_core.tasks.registry`), each with its typed request (`TaskRequest`).

A request is served in halves so it can be encoded in another process and batched with requests of any task:
`Task.encode` checks and tokenizes it into a `TaskJob` (CPU, from a picklable `TaskContext`), `Task.split` cuts
it into token-bounded parts, `Engine.run_jobs` runs the parts of many requests as one forward batch and
finishes each from its `BatchView` (`radix_core.finish`), and `Task.merge` joins a request's parts into its typed
result with `Usage`. `Engine` exposes each task as a method that runs one request alone.

The names below load their module when first used (PEP 562): `radix_core.tasks.config` is read by the
server's configuration check without the tokenizer's imports.
"""

from __future__ import annotations

import importlib

_HOMES = {
    **dict.fromkeys(("HeadQuery", "Task", "TaskJob"), "base"), "TaskConfig": "config",
    **dict.fromkeys(("TaskContext", "load_task_context"), "context"),
    **dict.fromkeys(("EmbedJob", "EmbedRequest", "EmbedResult"), "embed"),
    **dict.fromkeys(("LabelScore", "PredictJob", "PredictRequest", "PredictResult"), "predict"),
    **dict.fromkeys(("ALL_TASKS", "TASKS", "task_for", "task_of"), "registry"), "TaskRequest": "request",
    **dict.fromkeys(("RerankHit", "RerankJob", "RerankRequest", "RerankResult"), "rerank"),
    **dict.fromkeys(("ClassifyJob", "ClassifyRequest", "ClassifyResult", "ContinuationScore", "ScoreJob",
                     "ScoreRequest", "ScoreResult"), "scoring"),
    "Usage": "usage", "BatchView": "view",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'radix_core.tasks' has no attribute {name!r}")
    return getattr(importlib.import_module(f"radix_core.tasks.{_HOMES[name]}"), name)
