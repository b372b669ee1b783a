"""`Usage`: the tokens of one call, which every task's result carries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """Tokens of one call: as sent to the model, rows computed after shared prefixes were deduplicated, and tokens
    read from the prefix cache instead of computed (per sequence, as `input_tokens` counts them: a cached 1,024-token
    prompt in front of 4 inputs is 4,096 cached tokens)."""

    input_tokens: int
    computed_tokens: int
    cached_tokens: int = 0

    @staticmethod
    def total(usages: Sequence[Usage]) -> Usage:
        return Usage(sum(u.input_tokens for u in usages), sum(u.computed_tokens for u in usages),
                     sum(u.cached_tokens for u in usages))

    def to_dict(self) -> dict[str, int]:
        """The fields of the gRPC `Usage` message."""
        return {"input_tokens": self.input_tokens, "computed_tokens": self.computed_tokens,
                "cached_tokens": self.cached_tokens}
