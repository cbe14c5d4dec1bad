"""Keys derived from a request's key: bounded scopes and downstream keys for outside
services (see docs/how-it-works.md, "Derived downstream keys").

The header parser and the fingerprint live in :mod:`.header` and :mod:`.fingerprint`;
their public names are importable from here too.
"""

from __future__ import annotations

import hashlib
import hmac

from .fingerprint import MAX_JSON_DEPTH, canonical_body, canonical_json, fingerprint, preload_body
from .header import MAX_KEY_LENGTH, parse_key

MAX_SCOPE_LENGTH = 255

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_SCOPE_LENGTH",
    "bounded_scope",
    "canonical_body",
    "canonical_json",
    "downstream_key",
    "fingerprint",
    "parse_key",
    "preload_body",
]


def bounded_scope(scope: str) -> str:
    """Scopes longer than the column are stored as their SHA-256."""
    if len(scope) <= MAX_SCOPE_LENGTH:
        return scope
    return "sha256:" + hashlib.sha256(scope.encode()).hexdigest()


def downstream_key(secret: str, scope: str, key: str, name: str = "default") -> str:
    """A key for an outside service, stable across retries of one request.

    Hand it to a payment provider as *its* idempotency key, so that a request
    that lost its lease and was retried is deduplicated by the provider too.
    """
    message = "\x00".join((scope, key, name)).encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
