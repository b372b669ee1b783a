"""The tasks, the one place the engine, the ingress and the transports look them up: by the type of a request or a
job (`task_for`), or, where a caller names a task in text (a handle's `call("rerank", ...)`, a config), by its name
(`task_of`).

Adding a task is one module (its `TaskRequest`, `TaskJob`, result and `Task`; see docs/ARCHITECTURE.md section 4),
one entry in `ALL_TASKS`, its `Engine` method, and its rpc and messages in `proto/radixserve/v1/scoring.proto`.
"""

from __future__ import annotations

from typing import Any

from radix_core.errors import RequestError
from radix_core.tasks.base import Task
from radix_core.tasks.embed import EmbedTask
from radix_core.tasks.predict import PredictTask
from radix_core.tasks.rerank import RerankTask
from radix_core.tasks.scoring import ClassifyTask, ScoreTask

ALL_TASKS: tuple[Task, ...] = (RerankTask(), EmbedTask(), ClassifyTask(), ScoreTask(), PredictTask())

_BY_TYPE: dict[type, Task] = {kind: task for task in ALL_TASKS for kind in (task.request_type, task.job_type)}
TASKS: dict[str, Task] = {task.name: task for task in ALL_TASKS}  # by `Task.name`, in `ALL_TASKS` order


def task_for(value: Any) -> Task:
    """The task of a request (`RerankRequest`, ...) or a job (`RerankJob`, ...), by its type."""
    try:
        return _BY_TYPE[type(value)]
    except KeyError:
        raise TypeError(f"{type(value).__name__} is no task's request or job") from None


def task_of(name: str) -> Task:
    """The task called `name`, or a RequestError listing the known ones."""
    if not isinstance(name, str) or name not in TASKS:
        raise RequestError(f"unknown task {name!r}", f"choose one of {', '.join(TASKS)}", field="task")
    return TASKS[name]
