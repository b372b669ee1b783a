"""What every task shares: the `Task` interface each task module implements once, the job it encodes a request
into, the head query a job asks of the batch, usage accounting, and the input checks.

A task is one object (`TASKS` in `radix_core.tasks.registry`) that owns everything about it:

    job = task.encode(context, request)        # check the arguments, render the template, tokenize (CPU)
    parts = task.split(job, max_tokens)        # token-bounded sub-jobs that keep the shared prefix
    partial = task.finish(part, view)          # a sub-job's result from its slice of a batch's forward
    result = task.merge(job, partials)         # one result, as if the request had run whole
    task.to_dict(result)                       # the response's fields, as the transports name them

A job holds token ids (`TokenSequences`), never text the engine would tokenize again, and what finishing needs.
"""

from __future__ import annotations

import inspect
import numbers
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from radix_core.errors import RequestError
from radix_core.tasks.context import TaskContext
from radix_core.tokenization import TRUNCATION_DIRECTIONS
from radix_core.tokens import TokenSequences

if TYPE_CHECKING:
    from radix_core.tasks.view import BatchView

_SURROGATE = re.compile("[\ud800-\udfff]")  # code points that are halves of UTF-16 pairs, never characters


@dataclass(frozen=True)
class Usage:
    """Tokens of one call: as sent to the model, and rows computed after shared prefixes were deduplicated."""

    input_tokens: int
    computed_tokens: int

    @staticmethod
    def total(usages: Sequence[Usage]) -> Usage:
        return Usage(sum(u.input_tokens for u in usages), sum(u.computed_tokens for u in usages))


@dataclass(frozen=True)
class HeadQuery:
    """Head outputs a job needs, answered for the whole batch at once (`radix_core.tasks.view.answer_queries`):
    at position `positions[i]` (negative from the end) of the job's sequence `sequences[i]`, either the head's
    outputs (`columns` of them, or all) or, with `targets`, the log-probability of token `targets[i]`."""

    sequences: np.ndarray  # (P,) int64
    positions: np.ndarray  # (P,) int64
    targets: np.ndarray | None = None  # (P,) int64 token ids
    columns: tuple[int, ...] | None = None

    def select(self, keep: slice, first_sequence: int) -> HeadQuery:
        """Queries `keep`, their sequences renumbered from `first_sequence`."""
        targets = None if self.targets is None else self.targets[keep]
        return replace(self, sequences=self.sequences[keep] - first_sequence, positions=self.positions[keep],
                       targets=targets)


@dataclass(frozen=True)
class TaskJob:
    """One request (or a part of one), validated and tokenized; picklable. Every sequence starts with the
    request's `shared_len` shared ids, the prefix the routing key hashes. The split unit is an *item*; by default
    item i is sequence i (a document, a text)."""

    task: ClassVar[str]
    sequences: TokenSequences
    shared_len: int

    @property
    def num_tokens(self) -> int:
        return self.sequences.num_tokens

    @property
    def work_tokens(self) -> int:
        """Rows the engine computes for this job alone, at most: the shared prefix once, then each sequence's own
        tokens after it (the price of its admission; sequences that share more than the prefix cost less)."""
        return self.num_tokens - (len(self.sequences) - 1) * self.shared_len

    @property
    def shared_ids(self) -> np.ndarray:
        """(shared_len,) int32 ids every sequence starts with."""
        return self.sequences.ids[:self.shared_len]

    def item_tokens(self) -> np.ndarray:
        """(I,) int64 tokens each item brings."""
        return self.sequences.lengths

    def select(self, start: int, end: int) -> TaskJob:
        """Items `start .. end - 1` as a job of their own."""
        return replace(self, sequences=self.sequences.select(start, end))


class Task(ABC):
    """One task: its request checking, template and encoding, split and merge, finishing and response fields.

    `job`'s keyword parameters are the request's arguments: `encode` refuses unknown and missing ones by name.
    """

    name: ClassVar[str]
    rpc: ClassVar[str]  # gRPC method of radixserve.v1.Scoring; its messages are `{rpc}Request`/`{rpc}Response`

    def encode(self, context: TaskContext, request: Mapping[str, Any]) -> TaskJob:
        """Validate and tokenize one request (the keyword arguments of the `Engine` method of this task); an
        unknown or missing key and bad input raise a `RequestError` saying what is wrong."""
        if not isinstance(request, Mapping):
            raise RequestError(f"the {self.name} request must be a mapping of its arguments, got "
                               f"{type(request).__name__}")
        params = list(inspect.signature(self.job).parameters.values())[1:]  # after the TaskContext
        allowed = [p.name for p in params]
        unknown = sorted(set(request) - set(allowed), key=str)  # a handle's caller may send keys of any type
        if unknown:
            raise RequestError(f"unknown {self.name} request keys {unknown}", f"allowed are {allowed}")
        required = [p.name for p in params if p.default is inspect.Parameter.empty]
        missing = [name for name in required if name not in request]
        if missing:
            raise RequestError(f"the {self.name} request lacks {missing}", f"it needs {required}")
        return self.job(context, **request)

    @abstractmethod
    def job(self, context: TaskContext, /, **arguments: Any) -> TaskJob:
        """The request's job; the keyword parameters are the request's arguments, with their defaults."""

    def split(self, job: TaskJob, max_tokens: int) -> list[TaskJob]:
        """Sub-jobs of at most `max_tokens` each (unless one item alone is larger), items in order; each starts
        with the request's shared ids, so all keep its routing key. Token counts are exact."""
        bounds = _chunks(job.item_tokens(), max_tokens)
        return [job] if len(bounds) == 1 else [job.select(start, end) for start, end in bounds]

    def head_query(self, job: TaskJob) -> HeadQuery | None:
        """The head outputs `finish` reads (`view.head`); None when it reads hidden states only."""
        return None

    @abstractmethod
    def finish(self, job: TaskJob, view: BatchView) -> Any:
        """The job's partial result (with `view.usage`) from its slice of the batch's forward."""

    @abstractmethod
    def merge(self, job: TaskJob, partials: Sequence[Any]) -> Any:
        """The request's result from its sub-jobs' partial results, in `split` order."""

    @abstractmethod
    def to_dict(self, result: Any) -> dict[str, Any]:
        """The result as the response's fields (the names of `{rpc}Response` in the gRPC API)."""


def usage_dict(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.input_tokens, "computed_tokens": usage.computed_tokens}


def _chunks(costs: np.ndarray, max_tokens: int) -> list[tuple[int, int]]:
    """`(start, end)` item ranges of at most `max_tokens` (a single larger item alone), greedy in order."""
    bounds, start, total = [], 0, 0
    for i, cost in enumerate(costs.tolist()):
        if i > start and total + cost > max_tokens:
            bounds.append((start, i))
            start, total = i, 0
        total += cost
    bounds.append((start, len(costs)))
    return bounds


def check_text(what: str, text: str) -> None:
    """A required text: a non-empty str of valid Unicode."""
    if not isinstance(text, str):
        raise RequestError(f"{what} must be a string, got {type(text).__name__}", field=what)
    if not text:
        raise RequestError(f"{what} is empty", field=what)
    check_unicode(what, text)


def check_optional_text(what: str, text: str | None) -> None:
    """An optional text (an instruction, a classify prefix): None, or a str of valid Unicode; empty is a value."""
    if text is None:
        return
    if not isinstance(text, str):
        raise RequestError(f"{what} must be a string, got {type(text).__name__}", field=what)
    check_unicode(what, text)


def check_unicode(what: str, text: str, index: int | None = None) -> None:
    """Text the tokenizer can encode: no lone surrogate. JSON's `"\\ud800"` escape decodes to one (a valid pair of
    escapes decodes to its character), but a surrogate alone is no character and has no UTF-8 encoding. `what`
    names the text, `index` its item when it is one of a list."""
    bad = _SURROGATE.search(text)
    if bad is not None:
        name = what if index is None else f"{what}[{index}]"
        raise RequestError(f"{name} is not valid Unicode: it holds a lone surrogate U+{ord(bad[0]):04X} at "
                           f"character {bad.start()}", "send UTF-8 text (in JSON, a \\u escape of a surrogate must "
                           "be half of a high-low pair)", field=what, index=index)


def check_count(what: str, count: int, max_items: int) -> None:
    """At most `max_items` items of `what` in one call."""
    if count > max_items:
        raise RequestError(f"{count} {what} are more than the limit of {max_items} per call",
                           "split the request or raise max_items in the task config", field=what, limit=max_items)


def check_items(what: str, items: Sequence[str], max_items: int) -> None:
    """A list of 1..max_items non-empty strings of valid Unicode (a bare string is refused, not split into
    characters). Every task refuses an empty item: it has nothing to score or embed, and a model kind's prompt
    would make of it what another's does not (a tokenizer drops an empty text_pair)."""
    if isinstance(items, str) or not isinstance(items, Sequence):
        raise RequestError(f"{what} must be a list of strings, got {type(items).__name__}", field=what)
    if not items:
        raise RequestError(f"{what} is empty", "give at least one", field=what)
    check_count(what, len(items), max_items)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise RequestError(f"{what}[{i}] must be a string, got {type(item).__name__}", field=what, index=i)
        if not item:
            raise RequestError(f"{what}[{i}] is empty", "give every one at least one character, or leave it out",
                               field=what, index=i)
        check_unicode(what, item, i)


def check_flag(what: str, value: Any) -> None:
    """A bool argument: True or False, not a value Python would take as one ("no" is true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise RequestError(f"{what} must be a boolean, got {type(value).__name__}", field=what)


def check_optional_int(what: str, value: Any) -> None:
    """None, or an integer (a bool is no count); its range is the caller's to check."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise RequestError(f"{what} must be an integer, got {type(value).__name__}", field=what)


def check_choice(what: str, value: Any, choices: Sequence[str], meaning: str = "") -> None:
    """One of `choices` (`meaning`, when given, says what they choose)."""
    if not isinstance(value, str):
        raise RequestError(f"{what} must be a string, got {type(value).__name__}", field=what)
    if value not in choices:
        raise RequestError(f"unknown {what} {value[:40]!r}", f"choose one of {', '.join(choices)}{meaning}",
                           field=what)


def check_truncation(truncation_direction: str, cap_name: str | None = None, cap: int | None = None) -> None:
    """A task's truncation arguments: `truncation_direction` is one of `TRUNCATION_DIRECTIONS`; a per-item token
    cap (the argument `cap_name`), when given, is a whole number of at least 1."""
    check_choice("truncation_direction", truncation_direction, TRUNCATION_DIRECTIONS,
                 " (the side of a text that is cut)")
    if cap_name is None:
        return
    check_optional_int(cap_name, cap)
    if cap is not None and cap < 1:
        raise RequestError(f"{cap_name} must be a whole number of tokens, at least 1, got {cap}",
                           "or leave it unset for no cap", field=cap_name, limit=1)
