"""Protobuf <-> library values for radixserve.v1, in one place and with no table per task: a request message becomes
its task's typed request (`from_pb`: the message's fields are the request's, in the same order, a test checks
it); a task's response fields (`Task.to_dict`) become the `{rpc}Response` message of its rpc (`to_pb`), and the
info dict an `InfoResponse`. No validation here: the tasks check the values and say what is wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from radix_core.tasks import ALL_TASKS, Task, TaskRequest
from radixserve.v1 import scoring_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["Scoring"]
SERVER_FIELDS = ("priority",)  # the last fields of every task request: for the server (`EngineRequest`), not the task


def request_type(task: Task) -> type[Message]:
    """The message class `task.rpc` takes."""
    return message_factory.GetMessageClass(SERVICE.methods_by_name[task.rpc].input_type)


_TASK_OF_MESSAGE = {request_type(task): task for task in ALL_TASKS}


def from_pb(request: Message) -> TaskRequest:
    """The task's request: each field under its own name (the proto names them after the request's fields),
    repeated fields as lists; an unset `optional` field is left out so the request's default applies.
    `SERVER_FIELDS` are not the task's."""
    fields = {}
    for field in request.DESCRIPTOR.fields:
        if field.name in SERVER_FIELDS or (field.has_presence and not request.HasField(field.name)):
            continue
        value = getattr(request, field.name)
        fields[field.name] = list(value) if field.is_repeated else value
    return _TASK_OF_MESSAGE[type(request)].request_type(**fields)


def priority_of(request: Message) -> str | None:
    """The request's `priority` field, None when unset."""
    return request.priority if request.HasField("priority") else None


def response_type(task: Task) -> type[Message]:
    """The message class `task.rpc` answers with."""
    return message_factory.GetMessageClass(SERVICE.methods_by_name[task.rpc].output_type)


def to_pb(task: Task, result: Any) -> Message:
    """The response message of `task` for its result (`RerankResult`, `EmbedResult`, ...)."""
    return message_from_dict(response_type(task), task.to_dict(result))


def message_from_dict(message: type[Message], fields: dict[str, Any]) -> Message:
    """`message(**fields)` with nested dicts (and lists of dicts) built as their field's message type; numpy arrays
    pass as lists (protobuf copies a list of floats in C, 1024 x 4096 floats in tens of milliseconds)."""
    descriptor: Descriptor = message.DESCRIPTOR
    values = {}
    for name, value in fields.items():
        field = descriptor.fields_by_name[name]
        if field.message_type is not None:
            nested = message_factory.GetMessageClass(field.message_type)
            value = [message_from_dict(nested, v) for v in value] if field.is_repeated else \
                message_from_dict(nested, value)
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        values[name] = value
    return message(**values)


def info_to_pb(info: dict[str, Any]) -> pb.InfoResponse:
    """`Ingress.info()` as an `InfoResponse`; keys the message has no field for (e.g. index_builder) stay out."""
    limits = pb.Limits(**{name: info[name] for name in pb.Limits.DESCRIPTOR.fields_by_name})
    fields = {name: info[name] for name in pb.InfoResponse.DESCRIPTOR.fields_by_name if name != "limits"}
    return pb.InfoResponse(**fields, limits=limits)
