"""`RequestError`: a client's mistake in a request, as a value with structure, raised where the input is checked.

A transport maps errors to its codes by type, never by message text: a `RequestError` is the client's to fix
(gRPC INVALID_ARGUMENT, HTTP 422, nothing logged beyond one line), and any other exception raised while answering
is the server's fault (INTERNAL, HTTP 500, logged once with its traceback). It subclasses `ValueError`, so a
library caller's `except ValueError` keeps working; but a plain `ValueError` (a bug, numpy's) is not a client error.

    raise RequestError.about("documents", "is empty", "give at least one")         # "documents is empty: ..."
    raise RequestError.about("documents", "is empty", index=2)                      # "documents[2] is empty"
    raise RequestError.about("top_n", "must be at least 1, got 0", limit=1)
    raise RequestError("the model has no LM head", "use a causal LM")               # names no field
    str(err)  # "documents is empty: give at least one"

An error made by `about` names its field in the message by structure (`lead + name + " " + problem`), so a
transport whose clients call the field otherwise renames it from a table, never by editing the text:

    err.renamed({"documents": "texts"})                                              # "texts[2] is empty"
    err.renamed({"texts": FieldName("inputs", item=lambda i: "inputs")})             # one text per message
    raise Items("documents", "document").error(2, " gives a sequence of 900 tokens")  # "document 2 gives ..."
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldName:
    """How a transport names one of the library's fields: `field` as a whole, and item `index` of it
    (`item(index)`; default `field[index]`). A whole field may have a name of its own (`whole`)."""

    field: str
    item: Callable[[int], str] | None = None
    whole: str | None = None

    def name(self, index: int | None) -> str:
        if index is None:
            return self.whole or self.field
        return self.item(index) if self.item is not None else f"{self.field}[{index}]"


@dataclass(frozen=True)
class Items:
    """A request's list field as messages name one of its items: item 2 of `documents` is "document 2" (`noun`
    and index) in the text, and index 2 of `documents` by structure, so a transport renames it from its table
    like any field. The tokenizer's checks (`radix_core.prompt_encoding`, `truncation`, `chunking`) take one."""

    field: str
    noun: str

    def error(self, index: int, rest: str, fix: str | None = None, *, limit: int | None = None) -> RequestError:
        """The error whose message is item `index`'s name, then `rest` (" gives a sequence of ...", or ": the
        prompt ..."), then the `fix`."""
        name = FieldName(self.field, item=lambda i: f"{self.noun} {i}")
        return RequestError._named(self.field, "", rest, fix, index, limit, name)


FieldNames = Mapping[str, "str | FieldName"]  # library field -> the transport's name (a str: the field renamed)


class RequestError(ValueError):
    """What was wrong (`problem`) and what to do about it (`fix`, None when the problem says it all); the message
    is `problem: fix`. Where known: `field`, the request argument at fault (the library's name, `documents`);
    `index`, the item of it (`documents[index]`); `limit`, the bound it crossed (a count, tokens).

    Made by `about`, the message names the field by structure (`named`: the text before and after the name) and
    `renamed` renames it; made directly, the message is the text as given and `renamed` renames the `field`
    attribute only."""

    def __init__(self, problem: str, fix: str | None = None, *, field: str | None = None, index: int | None = None,
                 limit: int | None = None):
        super().__init__(problem if fix is None else f"{problem}: {fix}")
        self.problem = problem
        self.fix = fix
        self.field = field
        self.index = index
        self.limit = limit
        self.named: tuple[str, str] | None = None  # (lead, rest) around the field's name, for `about` errors

    @classmethod
    def about(cls, field: str, problem: str, fix: str | None = None, *, index: int | None = None,
              limit: int | None = None, lead: str = "", name: FieldName | None = None) -> RequestError:
        """An error whose message is `lead`, the field's name (`field`, or `field[index]`), then `problem`:
        `about("documents", "is empty", index=2)` says "documents[2] is empty". `name` names the field otherwise."""
        return cls._named(field, lead, f" {problem}", fix, index, limit, name or FieldName(field))

    @classmethod
    def _named(cls, field: str, lead: str, rest: str, fix: str | None, index: int | None, limit: int | None,
               name: FieldName) -> RequestError:
        err = cls(f"{lead}{name.name(index)}{rest}", fix, field=field, index=index, limit=limit)
        err.named = (lead, rest)
        return err

    def renamed(self, names: FieldNames) -> RequestError:
        """The same error in a transport's field names: `names` maps a library field to the transport's (a str, or
        a `FieldName` for items named otherwise). A field the table does not name, and an error whose message
        does not name its field by structure, keep their text."""
        new = names.get(self.field) if self.field is not None else None
        if new is None:
            return self
        name = new if isinstance(new, FieldName) else FieldName(new)
        if self.named is None:
            return RequestError(self.problem, self.fix, field=name.field, index=self.index, limit=self.limit)
        lead, rest = self.named
        return RequestError._named(name.field, lead, rest, self.fix, self.index, self.limit, name)
