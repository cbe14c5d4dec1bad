"""Helpers for a project's own test suite: a store of each test's own, or the ``db`` strategy.

The ``db`` and ``advisory_lock`` strategies keep their records in the database, which a
``TestCase`` (or pytest-django's ``db`` fixture) rolls back after each test. The ``redis``
and ``hybrid`` strategies keep them in Redis too, which no test transaction undoes: the
next test that sends the same key for the same user (the same primary key, once the
database has reset its sequence) gets the earlier test's response replayed, and its view
never runs. :func:`isolated_store` gives each test's keys a prefix of their own (the
configured one and a suffix of the test's) and deletes them at the end (never a flush:
the Redis may be shared).

* :class:`IdempotencyTestMixin`: for ``django.test.TestCase`` and DRF's ``APITestCase``;
* ``django_idempotency.testing.plugin``: the same as pytest fixtures;
* :func:`use_strategy`: run a block under another strategy (``"db"``: no Redis at all).

See docs/testing.md.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

from django.conf import settings

from ..conf import conf

logger = logging.getLogger("django_idempotency")

__all__ = [
    "IdempotencyTestMixin",
    "clear_store",
    "idempotency_settings",
    "isolated_store",
    "use_strategy",
]


@contextlib.contextmanager
def idempotency_settings(**overrides: Any) -> Iterator[dict[str, Any]]:
    """``settings.IDEMPOTENCY`` with ``overrides`` for the block (``override_settings``,
    so that the library's cached settings, strategies and Redis store follow)."""
    from django.test import override_settings  # not on import: the pytest plugin's

    value = {**(getattr(settings, "IDEMPOTENCY", None) or {}), **overrides}
    with override_settings(IDEMPOTENCY=value):
        yield value


@contextlib.contextmanager
def use_strategy(name: str = "db", **overrides: Any) -> Iterator[dict[str, Any]]:
    """Run the block under the strategy ``name`` (and any other ``IDEMPOTENCY`` values).

    ``use_strategy("db")`` keeps every record in the database, where the test's
    transaction rolls it back: unit tests of a project configured for ``redis`` or
    ``hybrid`` then need no Redis. What it does not test is the configured strategy."""
    with idempotency_settings(STRATEGY=name, **overrides) as value:
        yield value


def _uses_redis() -> bool:
    return bool(conf.REDIS_URL or conf.REDIS_CACHE_ALIAS)


@contextlib.contextmanager
def isolated_store(suffix: str | None = None) -> Iterator[str]:
    """Keep the block's Redis records apart, and delete them after it; yields the suffix.

    For the block every key prefix is the configured ``REDIS_KEY_PREFIX`` followed by
    ``suffix`` (default: ``-test-`` and 16 random hex digits), whatever the settings
    become inside it (``override_settings`` on a test method, pytest-django's
    ``settings`` fixture): ``redis_store.isolate()``. On exit the keys with that suffix
    are deleted (:func:`clear_store`), if the block reached the Redis store at all (no
    ``SCAN`` otherwise); a Redis that cannot be reached then is logged, not raised: the
    suffix is never used again, so its records cannot reach another test (they expire
    after their ``TTL``). Keys of other tests and other processes are never
    touched. Without a Redis configured (the ``db`` strategy) the block just runs."""
    from ..strategies.redis import store as redis_store

    chosen = suffix or f"-test-{uuid.uuid4().hex[:16]}"
    previous = redis_store.isolate(chosen)
    try:
        yield chosen
    finally:
        redis_store.isolate(previous)
        if redis_store.used(chosen) and _uses_redis():
            try:
                clear_store(chosen, anywhere=True)  # under whichever prefix it was used
            except Exception:  # the test's own failure, if any, is the one to report
                logger.warning("could not delete the Redis keys of %s", chosen, exc_info=True)


_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def clear_store(prefix: str | None = None, *, anywhere: bool = False) -> int:
    """Delete the Redis keys under ``prefix`` (default: the current ``REDIS_KEY_PREFIX``)
    on the configured Redis, node by node on a Cluster; how many were deleted.
    ``anywhere``: the keys whose prefix *ends* with ``prefix`` (a test's suffix).

    A ``SCAN`` for ``<prefix>:*`` and a ``DEL`` of what it found: never ``FLUSHDB``, so a
    Redis shared with other tests, processes or applications keeps everything else.
    Raises ``ValueError`` for an empty prefix (that would match every record)."""
    from redis.cluster import RedisCluster

    from ..strategies.redis.store import get_client

    chosen = conf.REDIS_KEY_PREFIX if prefix is None else prefix
    if not chosen:
        raise ValueError("clear_store() needs a key prefix; an empty one matches every key")
    client = get_client()
    pattern = ("*" if anywhere else "") + _GLOB_SPECIAL.sub(r"\\\1", chosen) + ":*"
    deleted = 0
    batch: list[Any] = []
    for name in client.scan_iter(match=pattern, count=500):
        batch.append(name)
        if len(batch) >= 500 or isinstance(client, RedisCluster):
            deleted += int(client.delete(*batch))  # one slot per DEL on a Cluster
            batch.clear()
    if batch:
        deleted += int(client.delete(*batch))
    return deleted


class IdempotencyTestMixin:
    """For a ``TestCase`` (Django's, DRF's ``APITestCase``): each test's Redis records are
    kept apart from every other test's, and deleted after it (:func:`isolated_store`).

    ``idempotency_strategy``: a strategy to switch to for the class's tests
    (:func:`use_strategy`), e.g. ``"db"`` for tests that need no Redis. Put the mixin
    first in the bases, and call ``super().setUp()`` from an ``setUp`` of your own."""

    #: The strategy the tests run under; None: the configured one.
    idempotency_strategy: str | None = None

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        enter = self.enterContext  # type: ignore[attr-defined]
        if self.idempotency_strategy is not None:
            enter(use_strategy(self.idempotency_strategy))
        #: What follows ``REDIS_KEY_PREFIX`` in this test's keys.
        self.idempotency_suffix: str = enter(isolated_store())
