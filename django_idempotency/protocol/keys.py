"""Keys derived from a request's key: the (scope, key) digest, and downstream keys for
outside services (see docs/how-it-works.md, "Derived downstream keys").
"""

from __future__ import annotations

import hashlib
import hmac


def key_digest(scope: str, key: str) -> str:
    """The digest of ``(scope, key)``: one name for one key in places that take a short
    fixed-size name (the waiters' channels, Redis record names)."""
    return hashlib.sha256(scope.encode() + b"\x00" + key.encode()).hexdigest()[:32]


def downstream_key(secret: str, scope: str, key: str, name: str = "default") -> str:
    """A key for an outside service, stable across retries of one request.

    Hand it to a payment provider as *its* idempotency key, so that a request
    that lost its lease and was retried is deduplicated by the provider too.
    """
    message = "\x00".join((scope, key, name)).encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
