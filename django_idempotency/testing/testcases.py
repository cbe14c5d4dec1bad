"""Under ``manage.py test``: the Redis records written inside a ``TestCase``'s transaction
live under a prefix of that transaction's own, with nothing to opt into.

Django's ``TestCase`` runs each test inside an atomic block of its own (its
``_from_testcase`` blocks), which the test's end rolls back. A record written in Redis
meanwhile would outlive that rollback, and answer the next test that sends the same key
for the same user with the earlier test's response. Here every such block gets a suffix
of its own, which :func:`django_idempotency.strategies.redis.store.get_store` puts after
``REDIS_KEY_PREFIX`` while the block is the connection's innermost test block; the
records of the run are deleted when the process exits. An explicit
:func:`~django_idempotency.testing.isolated_store` (``IdempotencyTestMixin``, the pytest
plugin) wins; ``IDEMPOTENCY["TEST_ISOLATION"] = False`` turns it off.

Installed by the app's ``ready()`` when the process runs Django's test command (or is one
of its parallel workers). Under pytest the plugin isolates each test instead.
"""

from __future__ import annotations

import atexit
import logging
import sys
import uuid
from typing import Any

from django.db import connections

from ..conf import conf
from ..protocol import transactions

logger = logging.getLogger("django_idempotency")

#: Ends every suffix of this process's run (and of the workers forked from it), so that
#: one deletion at exit finds them all.
RUN = uuid.uuid4().hex[:16]


def current_suffix() -> str:
    """The suffix of the innermost ``TestCase`` block on the keys' database connection of
    this thread; "" outside one, or with ``TEST_ISOLATION`` off."""
    if not conf.TEST_ISOLATION:
        return ""
    block = transactions.innermost_testcase_block(connections[conf.DATABASE])
    if block is None:
        return ""
    suffix: str | None = getattr(block, "_idempotency_suffix", None)
    if suffix is None:
        suffix = f"-test-{uuid.uuid4().hex[:8]}-{RUN}"
        setattr(block, "_idempotency_suffix", suffix)  # noqa: B010 - not Atomic's own
    return suffix


def delete_records() -> None:
    """Delete the records of this run from the configured Redis (one ``SCAN``); a Redis
    that cannot be reached is logged: the records expire after their ``TTL``."""
    from . import _uses_redis, clear_store

    try:
        if _uses_redis():
            clear_store(f"-{RUN}", anywhere=True)
    except Exception:
        logger.warning("could not delete the Redis keys of the test run", exc_info=True)


def install() -> None:
    """Give each ``TestCase`` transaction's records a prefix of their own, from now on."""
    from ..strategies.redis import store

    store.isolate_by(current_suffix)
    atexit.register(delete_records)


def running_tests() -> bool:
    """Whether this ``django.setup()`` is the one of Django's test command (``manage.py
    test``, ``django-admin test``) or of one of its parallel workers."""
    from django.core.management import ManagementUtility
    from django.test import runner

    execute = ManagementUtility.execute.__code__
    worker = runner._init_worker.__code__  # type: ignore[attr-defined]
    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_code is execute:
            return bool(frame.f_locals.get("subcommand") == "test")
        if frame.f_code is worker:
            return True
        frame = frame.f_back
    return False
