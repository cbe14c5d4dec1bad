"""Keys derived from a request's key: downstream keys for outside services (see
docs/how-it-works.md, "Derived downstream keys"). The (scope, key) digest is
:mod:`django_idempotency.values.keys`'s, named here too.
"""

from __future__ import annotations

import hashlib
import hmac

from ..values.keys import key_digest

__all__ = ["downstream_key", "key_digest"]


def downstream_key(secret: str, scope: str, key: str, name: str = "default") -> str:
    """A key for an outside service, stable across retries of one request.

    Hand it to a payment provider as *its* idempotency key, so that a request
    that lost its lease and was retried is deduplicated by the provider too.
    """
    message = "\x00".join((scope, key, name)).encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
