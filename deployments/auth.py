"""API keys of the gRPC and HTTP APIs, and the prefix cache scope each call gets from its key.

Keys are loaded once when the ingress starts, from a file (one key per line) and/or an environment variable
(comma-separated), never from the YAML, which names only where they live. A call passes with `authorization: Bearer
<key>` (gRPC metadata, HTTP header); keys are compared with `hmac.compare_digest` against every configured key, so
the time taken does not reveal how much of a key matched or which key it was.

**Cache scope.** The engine replicas' prefix cache (`radix_core.prefix_cache`) keeps one tree per scope, and a
sequence reads only its own scope's K/V. A call whose key passes is, for the rest of the call, that key's tenant:
`cache_scope()` (a context variable set by the check, read by the request path, which sends it with the request to
the replica) is `scope_digest(key)`, 32 hex digits of a BLAKE2b digest of the key, keyed with a secret made from all
the configured keys. So one key's cached prompt is never a hit for another key: a hit answers faster, and a shared
cache lets a tenant learn by timing whether someone else sent a prompt (Gu et al., "Auditing Prompt Caching in
Language Model APIs", 2025, found such sharing across users in production APIs). The raw key never leaves this
module: the digest travels to the replicas and may show in a dump or a log line, and without the configured keys
it cannot be tested against guessed keys. Every ingress replica loads the same keys, so one key has one scope on
every replica; changing the keys changes every scope (the cache starts cold, which costs time, never results).
`prefix_cache_scope: shared` gives every call the scope None, one tree for everyone (one tenant behind several
keys); so does a server without keys, and a DeploymentHandle call (no key).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Literal

AUTH_METADATA = "authorization"
_BEARER = "bearer "
CacheScope = Literal["key", "shared"]  # prefix_cache_scope: one cache tree per API key, or one for everyone
DEFAULT_CACHE_SCOPE: CacheScope = "key"
SCOPE_DIGEST_BYTES = 16  # 32 hex digits: two keys sharing a scope by chance is out of reach (2**-64 at 2**32 keys)
_SCOPE: ContextVar[str | None] = ContextVar("radixserve_cache_scope", default=None)


def cache_scope() -> str | None:
    """The prefix cache scope of the call this code runs for: its key's digest, or None (one shared tree)."""
    return _SCOPE.get()


class ApiKeys:
    """The configured keys; with none, every call is allowed (auth off). `prefix_cache_scope`: "key" (each key's
    calls their own cache tree) or "shared" (one tree)."""

    def __init__(self, keys: Iterable[str] = (), prefix_cache_scope: CacheScope = DEFAULT_CACHE_SCOPE):
        self._keys = tuple(key.encode() for key in keys)
        self._per_key = prefix_cache_scope == "key"
        self._secret = hashlib.blake2b(b"\n".join(sorted(self._keys)), person=b"radixserve-scope").digest()

    def refusal(self, metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
        """Why a call with this metadata is refused (for UNAUTHENTICATED), or None when it may proceed; a call that
        proceeds with a key has that key's `cache_scope()` from here on (the module docstring)."""
        if not self._keys:
            return None
        presented = _bearer_token(metadata)
        if presented is None:
            return f"missing API key: send the metadata '{AUTH_METADATA}: Bearer <key>'"
        matched = False
        for key in self._keys:  # no early exit: every key is compared
            matched |= hmac.compare_digest(key, presented)
        if not matched:
            return "invalid API key"
        _SCOPE.set(self.scope_digest(presented) if self._per_key else None)
        return None

    def scope_digest(self, key: bytes) -> str:
        """The cache scope of `key`: a digest keyed with the secret of all configured keys, never the key."""
        return hashlib.blake2b(key, key=self._secret, digest_size=SCOPE_DIGEST_BYTES).hexdigest()


def load_api_keys(keys_file: str | None, keys_env: str | None, environ: Mapping[str, str] = os.environ,
                  prefix_cache_scope: CacheScope = DEFAULT_CACHE_SCOPE) -> ApiKeys:
    """The keys of `keys_file` and of the variable named `keys_env`; neither set: auth off. A source that is set but
    holds no key is an error, so a missing Secret cannot switch auth off silently. `prefix_cache_scope`: as
    `ApiKeys`'."""
    keys = []
    if keys_file is not None:
        keys += _keys_from_file(Path(keys_file))
    if keys_env is not None:
        keys += _keys_from_env(keys_env, environ)
    return ApiKeys(keys, prefix_cache_scope)


def _keys_from_file(path: Path) -> list[str]:
    """Non-blank lines, stripped; lines starting with # are comments."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ValueError(f"auth.api_keys_file {str(path)!r} cannot be read ({err.strerror}): mount the keys file "
                         f"there or unset auth.api_keys_file") from None
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ValueError(f"auth.api_keys_file {str(path)!r} holds no key: put one key per line")
    return keys


def _keys_from_env(name: str, environ: Mapping[str, str]) -> list[str]:
    keys = [key.strip() for key in environ.get(name, "").split(",") if key.strip()]
    if not keys:
        raise ValueError(f"auth.api_keys_env names {name!r}, but that environment variable is unset or holds no "
                         f"key in the ingress replica: set it to comma-separated keys, or unset auth.api_keys_env")
    return keys


def _bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> bytes | None:
    """The key of the first `authorization: Bearer <key>` entry (the scheme in any case), as bytes."""
    for name, value in metadata:
        if name.lower() == AUTH_METADATA and isinstance(value, str) and value.lower().startswith(_BEARER):
            return value[len(_BEARER):].strip().encode()
    return None
