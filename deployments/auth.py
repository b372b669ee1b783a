"""API keys of the gRPC API: loaded once when the ingress starts, from a file (one key per line) and/or an
environment variable (comma-separated), never from the YAML, which names only where they live. A call passes with
the metadata `authorization: Bearer <key>`; keys are compared with `hmac.compare_digest` against every configured
key, so the time taken does not reveal how much of a key matched or which key it was.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

AUTH_METADATA = "authorization"
_BEARER = "bearer "


class ApiKeys:
    """The configured keys; with none, every call is allowed (auth off)."""

    def __init__(self, keys: Iterable[str] = ()):
        self._keys = tuple(key.encode() for key in keys)

    def refusal(self, metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
        """Why a call with this metadata is refused (for UNAUTHENTICATED), or None when it may proceed."""
        if not self._keys:
            return None
        presented = _bearer_token(metadata)
        if presented is None:
            return f"missing API key: send the metadata '{AUTH_METADATA}: Bearer <key>'"
        matched = False
        for key in self._keys:  # no early exit: every key is compared
            matched |= hmac.compare_digest(key, presented)
        return None if matched else "invalid API key"


def load_api_keys(keys_file: str | None, keys_env: str | None,
                  environ: Mapping[str, str] = os.environ) -> ApiKeys:
    """The keys of `keys_file` and of the variable named `keys_env`; neither set: auth off. A source that is set but
    holds no key is an error, so a missing Secret cannot switch auth off silently."""
    keys = []
    if keys_file is not None:
        keys += _keys_from_file(Path(keys_file))
    if keys_env is not None:
        keys += _keys_from_env(keys_env, environ)
    return ApiKeys(keys)


def _keys_from_file(path: Path) -> list[str]:
    """Non-blank lines, stripped; lines starting with # are comments."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ValueError(f"api_keys_file {str(path)!r} cannot be read ({err.strerror}): mount the keys file there "
                         f"or unset api_keys_file") from None
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ValueError(f"api_keys_file {str(path)!r} holds no key: put one key per line")
    return keys


def _keys_from_env(name: str, environ: Mapping[str, str]) -> list[str]:
    keys = [key.strip() for key in environ.get(name, "").split(",") if key.strip()]
    if not keys:
        raise ValueError(f"api_keys_env names {name!r}, but that environment variable is unset or holds no key "
                         f"in the ingress replica: set it to comma-separated keys, or unset api_keys_env")
    return keys


def _bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> bytes | None:
    """The key of the first `authorization: Bearer <key>` entry (the scheme in any case), as bytes."""
    for name, value in metadata:
        if name.lower() == AUTH_METADATA and isinstance(value, str) and value.lower().startswith(_BEARER):
            return value[len(_BEARER):].strip().encode()
    return None
