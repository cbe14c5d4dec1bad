"""The (scope, key) digest: one short fixed-size name for one key."""

from __future__ import annotations

import hashlib


def key_digest(scope: str, key: str) -> str:
    """The digest of ``(scope, key)``: one name for one key in places that take a short
    fixed-size name (the waiters' channels, Redis record names)."""
    return hashlib.sha256(scope.encode() + b"\x00" + key.encode()).hexdigest()[:32]
