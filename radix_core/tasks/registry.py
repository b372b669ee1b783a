"""`TASKS`: every task by name, the one place the engine, the ingress and the transports look tasks up.

Adding a task is one module defining a `Task` (and its job), one line here, and its messages and rpc in the gRPC
contract (`proto/radixserve/v1/scoring.proto`, named after `Task.rpc`).
"""

from __future__ import annotations

from radix_core.errors import RequestError
from radix_core.tasks.base import Task
from radix_core.tasks.embed import EmbedTask
from radix_core.tasks.predict import PredictTask
from radix_core.tasks.rerank import RerankTask
from radix_core.tasks.scoring import ClassifyTask, ScoreTask

TASKS: dict[str, Task] = {task.name: task for task in (RerankTask(), EmbedTask(), ClassifyTask(), ScoreTask(),
                                                       PredictTask())}


def task_of(name: str) -> Task:
    """The task called `name`, or a RequestError listing the known ones."""
    if not isinstance(name, str) or name not in TASKS:
        raise RequestError(f"unknown task {name!r}", f"choose one of {', '.join(TASKS)}", field="task")
    return TASKS[name]
