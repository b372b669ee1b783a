"""`RequestError`: a client's mistake in a request, as a value with structure, raised where the input is checked.

A transport maps errors to its codes by type, never by message text: a `RequestError` is the client's to fix
(gRPC INVALID_ARGUMENT, HTTP 422, nothing logged beyond one line), and any other exception raised while answering
is the server's fault (INTERNAL, HTTP 500, logged once with its traceback). It subclasses `ValueError`, so a
library caller's `except ValueError` keeps working; but a plain `ValueError` (a bug, numpy's) is not a client error.

    raise RequestError("top_n must be at least 1, got 0", field="top_n", limit=1)
    raise RequestError("documents is empty", "give at least one", field="documents")
    str(err)  # "documents is empty: give at least one"
"""

from __future__ import annotations

from collections.abc import Callable


class RequestError(ValueError):
    """What was wrong (`problem`) and what to do about it (`fix`, None when the problem says it all); the message
    is `problem: fix`. Where known: `field`, the request argument at fault (the library's name, `documents`);
    `index`, the item of it (`documents[index]`); `limit`, the bound it crossed (a count, tokens)."""

    def __init__(self, problem: str, fix: str | None = None, *, field: str | None = None, index: int | None = None,
                 limit: int | None = None):
        super().__init__(problem if fix is None else f"{problem}: {fix}")
        self.problem = problem
        self.fix = fix
        self.field = field
        self.index = index
        self.limit = limit

    def renamed(self, rename: Callable[[str], str]) -> RequestError:
        """The same error in a transport's field names: `rename` rewrites the library's argument names in each
        text (TEI's `texts` for `documents`)."""
        return RequestError(rename(self.problem), None if self.fix is None else rename(self.fix),
                            field=None if self.field is None else rename(self.field), index=self.index,
                            limit=self.limit)
