"""Keys derived from a request's key: downstream keys and bounded scopes."""

from __future__ import annotations

from django_idempotency.protocol.keys import downstream_key
from django_idempotency.protocol.scope import bounded_scope


def test_downstream_key_is_stable_per_scope_key_and_name() -> None:
    first = downstream_key("s3cret", "user:1", "k1", "psp")
    assert downstream_key("s3cret", "user:1", "k1", "psp") == first
    assert len(first) == 64
    others = {
        downstream_key("s3cret", "user:2", "k1", "psp"),
        downstream_key("s3cret", "user:1", "k2", "psp"),
        downstream_key("s3cret", "user:1", "k1", "mail"),
        downstream_key("s3cret", "user:1", "k1"),
        downstream_key("other", "user:1", "k1", "psp"),
        # the separator keeps ("user:1", "k1") apart from ("user:1k", "1")
        downstream_key("s3cret", "user:1k", "1", "psp"),
    }
    assert first not in others
    assert len(others) == 6


def test_bounded_scope() -> None:
    assert bounded_scope("user:1") == "user:1"
    assert bounded_scope("x" * 255) == "x" * 255
    long = bounded_scope("x" * 256)
    assert long.startswith("sha256:") and len(long) <= 255
    assert bounded_scope("x" * 256) == long != bounded_scope("y" * 256)
