"""The checks of ``PARTITION_INTERVAL``, the key table partitioned by expiry (E070-W077).

The settings' own (validators, run at start-up, never connecting): E070 the interval is
set on a database that is not PostgreSQL, W073 the partitions a claim looks in are many
(E071, the interval not a whole number of seconds, and E076, ``PARTITION_AHEAD`` not a
positive number of seconds, are the rules of their declarations in ``conf``). The
table's (``manage.py check --deploy`` only, which connects, on each key database): W074
the setting is on and the table is plain yet, E075 the table is partitioned and the
setting is off, W075 the database could not be asked, W077 a hybrid drain batch's locks
would hold more than a quarter of the server's lock table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from ..conf import PARTITIONS_HINT, conf
from . import ID
from .values import _number, _raw, value_errors

#: A claim looks for its key in every partition: past this many, say so (W073).
MANY_PARTITIONS = 200
HINT = PARTITIONS_HINT


def _interval() -> Any:
    return _raw("PARTITION_INTERVAL")


def _check_database() -> list[CheckMessage]:
    """E070: PostgreSQL only, on every key database."""
    from django.db import connections

    from ..store.sql import features_of

    if _interval() is None:
        return []
    messages: list[CheckMessage] = []
    for alias in conf.KEY_DATABASES:
        if alias not in settings.DATABASES:
            continue  # E005 / E035 name a missing alias
        vendor = connections[alias].vendor
        if not features_of(connections[alias]).time_partitions:
            messages.append(
                Error(
                    f"IDEMPOTENCY['PARTITION_INTERVAL'] is set, but database {alias!r} "
                    f"is {vendor}: time partitions are PostgreSQL's.",
                    hint="Set PARTITION_INTERVAL to None. " + HINT,
                    id=ID + "E070",
                )
            )
    return messages


def _check_count() -> list[CheckMessage]:
    """W073: the partitions from now to the longest expiry, past :data:`MANY_PARTITIONS`."""
    from ..store.partitions import ahead_seconds

    interval = _number(_interval())
    if interval is None or value_errors("PARTITION_INTERVAL") or value_errors("PARTITION_AHEAD"):
        return []
    count = int(ahead_seconds() // interval)
    if count <= MANY_PARTITIONS:
        return []
    return [
        Warning(
            f"IDEMPOTENCY['PARTITION_INTERVAL'] of {interval:g} s makes about {count} "
            f"partitions ahead of now, and every claim looks for its key in each.",
            hint="Use a longer interval: a few hours for a TTL of a day. " + HINT,
            id=ID + "W073",
        )
    ]


@register("idempotency_partitions", deploy=True)
def check_partitioned_table(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W074/E075: the key table on each key database is partitioned exactly when the
    setting says so; W077: the hybrid drain's locks against the server's lock table; W075
    when a database could not be asked (never raised)."""
    from django.db import DatabaseError, connections

    from ..store.partitions import is_partitioned
    from ..store.sql import features_of

    messages: list[CheckMessage] = []
    for alias in conf.KEY_DATABASES:
        if alias not in settings.DATABASES or not features_of(connections[alias]).time_partitions:
            continue
        try:
            partitioned = is_partitioned(connections[alias])
            messages += _drain_lock_messages(alias, connections[alias])
        except DatabaseError as exc:
            messages.append(
                Warning(
                    f"Could not read whether the idempotency key table of database "
                    f"{alias!r} is partitioned: {exc}",
                    hint="Run manage.py check --deploy where the database is reachable. " + HINT,
                    id=ID + "W075",
                )
            )
            continue
        messages += _table_messages(alias, partitioned, conf.PARTITION_INTERVAL is not None)
    return messages


#: The share of the server's lock table that one drain batch may hold (W077): room for a
#: few drainers at once and every other transaction's locks.
DRAIN_LOCK_SHARE = 4

LOCK_SLOTS = (
    "SELECT current_setting('max_locks_per_transaction')::int * "
    "(current_setting('max_connections')::int + "
    "current_setting('max_prepared_transactions')::int)"
)


def _drain_lock_messages(alias: str, connection: Any) -> list[CheckMessage]:
    """W077: with partitions, each row of a hybrid drain batch holds an advisory lock until
    the batch commits; a batch past a quarter of the server's shared lock table leaves two
    drainers able to fill it, and then every transaction that needs a lock fails."""
    if conf.PARTITION_INTERVAL is None or conf.STRATEGY != "hybrid":
        return []
    with connection.cursor() as cursor:
        cursor.execute(LOCK_SLOTS)
        slots = int(cursor.fetchone()[0])
    batch = conf.OUTBOX_BATCH_SIZE
    if batch * DRAIN_LOCK_SHARE <= slots:
        return []
    return [
        Warning(
            f"IDEMPOTENCY['OUTBOX_BATCH_SIZE'] is {batch}: on the partitioned key table of "
            f"database {alias!r} each row of a drain batch holds an advisory lock until the "
            f"batch commits, and the server's lock table has {slots} slots "
            "(max_locks_per_transaction * (max_connections + max_prepared_transactions)), "
            f"shared by every transaction: {slots // batch or 1} drain batch(es) at once "
            "fill it, and then every statement that needs a lock fails.",
            hint=f"Keep OUTBOX_BATCH_SIZE at or below {slots // DRAIN_LOCK_SHARE}, or raise "
            "max_locks_per_transaction on the server. " + HINT,
            id=ID + "W077",
        )
    ]


def _table_messages(alias: str, partitioned: bool, wanted: bool) -> list[CheckMessage]:
    if partitioned and not wanted:
        return [
            Error(
                f"The idempotency key table of database {alias!r} is partitioned, but "
                "IDEMPOTENCY['PARTITION_INTERVAL'] is None: every claim would fail.",
                hint="Set PARTITION_INTERVAL, or run manage.py partition_idempotency_keys "
                "--undo. " + HINT,
                id=ID + "E075",
            )
        ]
    if wanted and not partitioned:
        return [
            Warning(
                f"IDEMPOTENCY['PARTITION_INTERVAL'] is set, but the idempotency key table "
                f"of database {alias!r} is not partitioned yet.",
                hint="Run manage.py partition_idempotency_keys. " + HINT,
                id=ID + "W074",
            )
        ]
    return []


#: This module's validators of the settings (see ``settings.SETTINGS_VALIDATORS``).
VALIDATORS: list[Callable[[], list[CheckMessage]]] = [
    _check_database,
    _check_count,
]
