"""The test database's key table partitioned by expiry while a block runs (PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest

#: Two-second partitions, so that a key's claims straddle boundaries within a test.
INTERVAL = 2
#: Seconds of partitions past TTL: enough for the tests' longest per-request TTL.
AHEAD = 40
SMALL: dict[str, Any] = {
    "PARTITION_INTERVAL": INTERVAL,
    "PARTITION_AHEAD": AHEAD,
    "TTL": 10,
    "LOCK_TIMEOUT": 5,
}


@contextmanager
def partitioned_table(
    settings: dict[str, Any] | None = None, using: str = "default", ahead: float = AHEAD
) -> Iterator[None]:
    """``IDEMPOTENCY`` = ``settings`` (two-second partitions by default) and the table of
    ``using`` converted; a plain table again after."""
    from django.db import connections
    from django.test import override_settings

    from django_idempotency.store import partitions

    if connections[using].vendor != "postgresql":
        pytest.skip("time partitions are PostgreSQL's")
    with override_settings(IDEMPOTENCY=settings or SMALL):
        assert partitions.convert(using, ahead=ahead) is True
        try:
            yield
        finally:
            partitions.undo(using)


def past_partition(using: str = "default", seconds: int = 60) -> tuple[datetime, datetime]:
    """A partition attached before the first one, ``seconds`` wide and ended already on the
    database's clock, as a partition looks once its range has passed: its range, so that a
    test places an expired row in it (``UPDATE … SET expires_at``) without waiting."""
    from django.db import connections, transaction

    from django_idempotency.store import partitions
    from django_idempotency.store.sql import partitions as ddl

    connection = connections[using]
    upper = min(p.lower for p in partitions.partitions(connection))
    lower = upper - timedelta(seconds=seconds)
    parent, q = partitions.table(), connection.ops.quote_name
    name = partitions.partition_name(parent, lower)
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute(ddl.table_like(q, name, parent))
        cursor.execute(ddl.unique_key(q, name, name + "_scope_key"))
        cursor.execute(ddl.attach(q, parent, name), [lower, upper])
    return lower, upper
