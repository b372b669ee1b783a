"""`TaskRequest`: a task's arguments as one typed, frozen value. Each task module declares its request once: the
fields in order, their types, their defaults and how each is checked, one line each:

    @dataclass(frozen=True)
    class RerankRequest(TaskRequest):
        query: str = text()
        documents: Sequence[str] = items()
        top_n: int | None = whole(at_least=1)
        truncation_direction: str = choice(TRUNCATION_DIRECTIONS, "right", " (the side of a text that is cut)")

Everything that speaks a task maps to its request in one place: `Engine.rerank(*args, **kwargs)` is
`RerankRequest(*args, **kwargs)`; gRPC's `RerankRequest` message has the same fields in the same order
(`deployments.grpc_codec.from_pb`; tests/test_grpc_codec.py checks the order); the CLI is made from the proto; each
HTTP dialect builds the request from its body. A mapping of the fields becomes the request through `of`, which
names unknown and missing keys.

`Task.encode` checks a request (`check`) before anything is tokenized: each field by its declared check, in field
order, a `RequestError` naming the field (the `check_*` functions below). A list's count is checked
before its items, so an over-long list is refused without reading it. What depends on the model (a dimension
within its hidden size, the head a task needs) is the task's own check, in `Task.job`.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

import numpy as np

from radix_core.errors import RequestError

TRUNCATION_DIRECTIONS = ("right", "left")  # the side of a varying text truncation cuts: its end, or its start
_SURROGATE = re.compile("[\ud800-\udfff]")  # code points that are halves of UTF-16 pairs, never characters
Check = Callable[[str, Any, int], None]  # (field name, value, max_items): raises a RequestError
R = TypeVar("R", bound="TaskRequest")
_CHECK = "check"


@dataclass(frozen=True)
class TaskRequest:
    """The base of every task's request: checked field by field (`check`), built from a mapping (`of`)."""

    @classmethod
    def of(cls: type[R], request: R | Mapping[str, Any], task: str) -> R:
        """`request` as this type: itself, or built from a mapping of its fields. Unknown and missing keys raise a
        RequestError naming them (`task` names the task)."""
        if isinstance(request, cls):
            return request
        if not isinstance(request, Mapping):
            raise RequestError(f"the {task} request must be a mapping of its arguments, got "
                               f"{type(request).__name__}")
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(request) - set(allowed), key=str)  # a handle's caller may send keys of any type
        if unknown:
            raise RequestError(f"unknown {task} request keys {unknown}", f"allowed are {allowed}")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in request]
        if missing:
            raise RequestError(f"the {task} request lacks {missing}", f"it needs {required}")
        return cls(**request)

    def check(self, max_items: int) -> None:
        """Each field by its declared check, in field order; lists hold at most `max_items` items."""
        for f in fields(self):
            f.metadata[_CHECK](f.name, getattr(self, f.name), max_items)


def _arg(check: Check, default: Any = MISSING) -> Any:
    return field(default=default, metadata={_CHECK: check})


def text() -> Any:
    """A required non-empty text (a query, a context)."""
    return _arg(lambda name, value, _: check_text(name, value))


def optional_text(default: str | None = None) -> Any:
    """A text that may be None, or empty (an instruction, a prefix)."""
    return _arg(lambda name, value, _: check_optional_text(name, value), default)


def items() -> Any:
    """A required list of 1..max_items non-empty texts (documents, inputs)."""
    return _arg(check_items)


def flag(default: bool) -> Any:
    """A bool."""
    return _arg(lambda name, value, _: check_flag(name, value), default)


def whole(default: int | None = None, at_least: int | None = None) -> Any:
    """An integer or None (unset), at least `at_least` when given and set."""
    def check(name: str, value: Any, _: int) -> None:
        check_optional_int(name, value)
        if at_least is not None and value is not None and value < at_least:
            raise RequestError.about(name, f"must be at least {at_least}, got {value}", limit=at_least)
    return _arg(check, default)


def token_cap() -> Any:
    """A per-item token cap: None (no cap) or a whole number of tokens, at least 1."""
    return _arg(lambda name, value, _: check_token_cap(name, value), None)


def choice(choices: Sequence[str], default: str, meaning: str = "") -> Any:
    """One of `choices` (`meaning` says what they choose, in the error)."""
    return _arg(lambda name, value, _: check_choice(name, value, choices, meaning), default)


def optional_choice(choices: Sequence[str], meaning: str = "") -> Any:
    """One of `choices`, or None: unset, the task config's default applies."""
    return _arg(lambda name, value, _: None if value is None else check_choice(name, value, choices, meaning), None)


def template_or_text(default: str | None = None) -> Any:
    """A format string (or None), or, for library callers, a callable (never sent over a wire)."""
    return _arg(lambda name, value, _: None if callable(value) else check_optional_text(name, value), default)


def check_text(what: str, text: str) -> None:
    """A required text: a non-empty str of valid Unicode."""
    if not isinstance(text, str):
        raise RequestError.about(what, f"must be a string, got {type(text).__name__}")
    if not text:
        raise RequestError.about(what, "is empty")
    check_unicode(what, text)


def check_optional_text(what: str, text: str | None) -> None:
    """An optional text (an instruction, a classify prefix): None, or a str of valid Unicode; empty is a value."""
    if text is None:
        return
    if not isinstance(text, str):
        raise RequestError.about(what, f"must be a string, got {type(text).__name__}")
    check_unicode(what, text)


def check_unicode(what: str, text: str, index: int | None = None) -> None:
    """Text the tokenizer can encode: no lone surrogate. JSON's `"\\ud800"` escape decodes to one (a valid pair of
    escapes decodes to its character), but a surrogate alone is no character and has no UTF-8 encoding. `what`
    names the text, `index` its item when it is one of a list."""
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise RequestError.about(what, f"is not valid Unicode: it holds a lone surrogate U+{ord(bad[0]):04X} at "
                                       f"character {bad.start()}", "send UTF-8 text (in JSON, a \\u escape of a "
                                 "surrogate must be half of a high-low pair)", index=index)


def check_count(what: str, count: int, max_items: int) -> None:
    """At most `max_items` items of `what` in one call."""
    if count > max_items:
        raise RequestError.about(what, f"are more than the limit of {max_items} per call",
                                 "split the request or raise max_items in the task config", lead=f"{count} ",
                                 limit=max_items)


def check_items(what: str, items: Sequence[str], max_items: int) -> None:
    """A list of 1..max_items non-empty strings of valid Unicode (a bare string is refused, not split into
    characters). Every task refuses an empty item: it has nothing to score or embed, and a model kind's prompt
    would make of it what another's does not (a tokenizer drops an empty text_pair)."""
    if isinstance(items, str) or not isinstance(items, Sequence):
        raise RequestError.about(what, f"must be a list of strings, got {type(items).__name__}")
    if not items:
        raise RequestError.about(what, "is empty", "give at least one")
    check_count(what, len(items), max_items)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise RequestError.about(what, f"must be a string, got {type(item).__name__}", index=i)
        if not item:
            raise RequestError.about(what, "is empty", "give every one at least one character, or leave it out",
                                     index=i)
        check_unicode(what, item, i)


def check_flag(what: str, value: Any) -> None:
    """A bool argument: True or False, not a value Python would take as one ("no" is true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise RequestError.about(what, f"must be a boolean, got {type(value).__name__}")


def check_optional_int(what: str, value: Any) -> None:
    """None, or an integer (a bool is no count); its range is the caller's to check."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise RequestError.about(what, f"must be an integer, got {type(value).__name__}")


def check_choice(what: str, value: Any, choices: Sequence[str], meaning: str = "") -> None:
    """One of `choices` (`meaning`, when given, says what they choose)."""
    if not isinstance(value, str):
        raise RequestError.about(what, f"must be a string, got {type(value).__name__}")
    if value not in choices:
        raise RequestError.about(what, repr(value[:40]), f"choose one of {', '.join(choices)}{meaning}",
                                 lead="unknown ")


def check_token_cap(what: str, cap: Any) -> None:
    """A per-item token cap (`max_document_tokens`): None for no cap, else a whole number of at least 1."""
    check_optional_int(what, cap)
    if cap is not None and cap < 1:
        raise RequestError.about(what, f"must be a whole number of tokens, at least 1, got {cap}",
                                 "or leave it unset for no cap", limit=1)
