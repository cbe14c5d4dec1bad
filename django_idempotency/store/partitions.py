"""The key table partitioned by expiry (``PARTITION_INTERVAL``, PostgreSQL): converting the
table and back, creating partitions ahead, dropping the expired ones whole.

A partition holds the keys whose ``expires_at`` falls in its range, ``[lower, upper)``,
bounds on whole multiples of the interval since the Unix epoch. Once ``upper`` has passed
on the database's clock the partition holds expired keys only, none of them in progress
under a live lease (the claim and the renewal keep such a key's expiry a lease ahead:
:mod:`~django_idempotency.store.sql.partitioned`), so :func:`maintain` detaches it
(``CONCURRENTLY``: reads and writes of the table go on) and drops it, whatever its size.
The statements and how uniqueness is kept across partitions: docs/how-it-works.md; how to
run it: docs/operations.md ("Time partitions").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import DatabaseError, connections, transaction

from ..conf import conf
from .purge import check_older_than
from .sql import partitions as ddl
from .sql.statements import statements

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_idempotency")

#: How long the DDL of :func:`maintain` waits for a lock on the table before it gives up
#: until the next run (claims queue behind a waiting ``ATTACH``/``DROP``, never longer).
DDL_LOCK_TIMEOUT = "2s"


@dataclass(frozen=True)
class Partition:
    """One partition of the key table: its name, its range, and whether a concurrent detach
    of it was interrupted."""

    name: str
    lower: datetime
    upper: datetime
    detaching: bool = False


@dataclass
class Maintenance:
    """What one :func:`maintain` did: partitions created, dropped, and left for the next run
    (a lock not granted in time)."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)


def table() -> str:
    """IdempotencyKey's table name."""
    return str(apps.get_model("django_idempotency", "IdempotencyKey")._meta.db_table)


def partition_name(parent: str, lower: datetime) -> str:
    """``<table>_p<lower as YYYYMMDDHHMMSS in UTC>``."""
    return f"{parent}_p{lower.astimezone(UTC):%Y%m%d%H%M%S}"


def is_partitioned(connection: BaseDatabaseWrapper) -> bool:
    """Whether the key table on ``connection`` is partitioned (connects)."""
    return _relkind(connection, table()) == "p"


def _relkind(connection: BaseDatabaseWrapper, name: str) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(ddl.RELKIND, [connection.ops.quote_name(name)])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def _now(connection: BaseDatabaseWrapper) -> datetime:
    with connection.cursor() as cursor:
        cursor.execute(ddl.NOW)
        now: datetime = cursor.fetchone()[0]
    return now


def partitions(connection: BaseDatabaseWrapper) -> list[Partition]:
    """The partitions of the key table on ``connection``, by name (that is, by range)."""
    with connection.cursor() as cursor:
        cursor.execute(ddl.LIST_PARTITIONS, [connection.ops.quote_name(table())])
        rows = cursor.fetchall()
    return [
        Partition(name, lower, upper, bool(detaching))
        for name, lower, upper, detaching in rows
        if lower is not None and upper is not None  # not a DEFAULT partition someone added
    ]


def holds_expiry(connection: BaseDatabaseWrapper, seconds: float) -> bool:
    """Whether a partition of the key table on ``connection`` holds an expiry ``seconds``
    from now on the database's clock: whether a row with it can be written. One statement,
    on the catalog; none, and True, when the table is not partitioned (``PARTITION_INTERVAL``
    unset, or not PostgreSQL)."""
    if not statements(connection).partitioned:
        return True
    with connection.cursor() as cursor:
        cursor.execute(ddl.HOLDS_EXPIRY, [float(seconds), connection.ops.quote_name(table())])
        return bool(cursor.fetchone()[0])


def log_no_partition(seconds: float) -> None:
    """The error that says no partition holds an expiry ``seconds`` ahead, and the fix."""
    logger.error(
        "no partition of the idempotency keys holds an expiry %s s ahead: "
        "run manage.py purge_idempotency_keys (it creates partitions ahead)",
        seconds,
    )


def ranges(start: datetime, until: datetime, interval: int) -> list[tuple[datetime, datetime]]:
    """The ranges from ``start`` until past ``until``, each ending on a multiple of
    ``interval`` seconds since the epoch (the first may be shorter: it starts at
    ``start``)."""
    lower = start
    found = []
    while lower < until:
        upper = _aligned(lower, interval) + timedelta(seconds=interval)
        found.append((lower, upper))
        lower = upper
    return found


def _aligned(now: datetime, interval: int) -> datetime:
    """The multiple of ``interval`` seconds since the epoch at or before ``now``."""
    step = timedelta(seconds=interval)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + step * ((now - epoch) // step)


def ahead_seconds(ahead: float | None = None) -> float:
    """How far past now the partitions reach: the longest of TTL and LOCK_TIMEOUT (an
    expiry a claim can write) plus ``ahead`` (default ``PARTITION_AHEAD``)."""
    extra = conf.PARTITION_AHEAD if ahead is None else ahead
    return max(conf.TTL, conf.LOCK_TIMEOUT) + float(extra)


# -- creating ahead and dropping ---------------------------------------------------------------


def create_ahead(
    connection: BaseDatabaseWrapper,
    interval: int,
    now: datetime,
    until: datetime,
    done: Maintenance,
) -> None:
    """Create and attach the partitions from the end of the last one (``now``, the
    database's, when there is none) until past ``until``; each in a transaction of its own."""
    existing = partitions(connection)
    # After the last partition, never over one (the interval may have changed since).
    start = max([_aligned(now, interval), *(p.upper for p in existing)])
    parent, q = table(), connection.ops.quote_name
    for lower, upper in ranges(start, until, interval):
        name = partition_name(parent, lower)
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
                cursor.execute(ddl.table_like(q, name, parent))
                cursor.execute(ddl.unique_key(q, name, name + "_scope_key"))
                cursor.execute(ddl.attach(q, parent, name), [lower, upper])
        except DatabaseError:
            logger.warning("could not create partition %s; the next run tries again", name)
            done.deferred.append(name)
            return  # the next ranges start where this one does
        done.created.append(name)


def drop_expired(
    connection: BaseDatabaseWrapper,
    cutoff: datetime,
    done: Maintenance,
    now: datetime | None = None,
) -> None:
    """Detach and drop the partitions whose range ended at or before ``cutoff`` (at most the
    database's ``now``, which a partition that is not dropped holds; read by each drop
    when not given)."""
    for partition in partitions(connection):
        if partition.upper > cutoff:
            continue
        try:
            drop(connection, partition, now)
        except DatabaseError:
            logger.warning("could not drop partition %s; the next run tries again", partition.name)
            done.deferred.append(partition.name)
            continue
        done.dropped.append(partition.name)


def drop(
    connection: BaseDatabaseWrapper, partition: Partition, now: datetime | None = None
) -> None:
    """Move the keys in progress with steps out of ``partition`` (the purge keeps them) to
    an expiry of ``now`` (by default the database's: a time a partition that is not dropped
    holds, and that has passed, so that they stay expired as the purge and ``unfinished()``
    see them); detach ``partition`` (concurrently, outside a transaction; else waiting at
    most :data:`DDL_LOCK_TIMEOUT` for the table's lock) and drop it, with what else it holds.

    No key gets steps in ``partition`` after the move: a step's record keeps the key's
    expiry a lease ahead (``strategies.stepped.StepClaim.record``), as a renewal does,
    which moves it out before the detach gets past its transaction."""
    parent, q = table(), connection.ops.quote_name
    with connection.cursor() as cursor:
        if not partition.detaching:
            moved = _now(connection) if now is None else now
            bounds = {"lower": partition.lower, "upper": partition.upper, "now": moved}
            cursor.execute(ddl.keep_unfinished(q, parent), bounds)
        if partition.detaching:
            cursor.execute(ddl.finalize(q, parent, partition.name))
        elif not connection.in_atomic_block:
            cursor.execute(ddl.detach(q, parent, partition.name, concurrently=True))
        else:
            cursor.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
            cursor.execute(ddl.detach(q, parent, partition.name, concurrently=False))
        cursor.execute(f"DROP TABLE {q(partition.name)}")


def maintain(
    using: str | None = None,
    *,
    interval: int | None = None,
    ahead: float | None = None,
    older_than: timedelta | None = None,
) -> Maintenance:
    """Create the partitions ahead (until now plus :func:`ahead_seconds`) and drop those
    whose range ended ``older_than`` ago or more (default: at once), on the keys' database.
    Nothing when the table is not partitioned. Run by the purge command and task."""
    check_older_than(older_than)  # a cutoff in the future would drop live keys
    connection = connections[using or conf.DATABASE]
    done = Maintenance()
    step = interval or conf.PARTITION_INTERVAL
    if step is None or not is_partitioned(connection):
        return done
    now = _now(connection)
    # Ahead first: the keys a drop keeps move to an expiry of now, which a partition must hold.
    create_ahead(connection, step, now, now + timedelta(seconds=ahead_seconds(ahead)), done)
    drop_expired(connection, now - (older_than or timedelta(0)), done, now)
    if done.dropped or done.created:
        logger.info(
            "partitions of the idempotency keys: %d created, %d dropped",
            len(done.created),
            len(done.dropped),
        )
    return done


# -- converting the table ----------------------------------------------------------------------


def convert(
    using: str | None = None, *, interval: int | None = None, ahead: float | None = None
) -> bool:
    """Make the key table partitioned by expiry, in one transaction that locks it: a new
    partitioned table with the same columns, partitions from now until past the latest
    expiry and :func:`ahead_seconds`, the unexpired rows copied (with the keys in progress
    with steps, which the purge keeps: their expiry set to now first, which the partitions
    hold), the old table dropped. False (and nothing done) when it is partitioned
    already."""
    alias = using or conf.DATABASE
    connection = connections[alias]
    step = interval or conf.PARTITION_INTERVAL
    if step is None:
        raise ValueError("PARTITION_INTERVAL is not set and no interval was given")
    parent, q = table(), connection.ops.quote_name
    new = parent + "_partitioned"
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if _relkind(connection, parent) == "p":
            return False
        cursor.execute(f"LOCK TABLE {q(parent)} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(ddl.lease_ahead(q, parent), {"lease": float(conf.LOCK_TIMEOUT)})
        now = _now(connection)
        cursor.execute(ddl.keep_unfinished(q, parent, in_range=False), {"now": now})
        cursor.execute(f'SELECT max("expires_at") FROM {q(parent)}')
        latest = cursor.fetchone()[0] or now
        until = max(latest + timedelta(seconds=1), now + timedelta(seconds=ahead_seconds(ahead)))
        cursor.execute(ddl.partitioned_like(q, new, parent))
        cursor.execute(ddl.primary_key(q, new, '"id", "expires_at"'))
        for lower, upper in ranges(_aligned(now, step), until, step):
            name = partition_name(parent, lower)
            cursor.execute(ddl.partition_of(q, name, new), [lower, upper])
            cursor.execute(ddl.unique_key(q, name, name + "_scope_key"))
        cursor.execute(ddl.copy_live(q, new, parent))
        _swap(cursor, q, old=parent, new=new)
        pkey = q(parent + "_pkey")
        cursor.execute(f"ALTER TABLE {q(parent)} RENAME CONSTRAINT {q(new + '_pkey')} TO {pkey}")
        cursor.execute(ddl.expires_index(q, parent, _expires_index()))
    return True


def undo(using: str | None = None) -> bool:
    """Make the key table a plain table again, as the migrations made it (every row kept,
    ``(scope, key)`` unique again); in one transaction that locks it. False (and nothing
    done) when it is not partitioned."""
    alias = using or conf.DATABASE
    connection = connections[alias]
    parent, q = table(), connection.ops.quote_name
    plain = parent + "_plain"
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if _relkind(connection, parent) != "p":
            return False
        cursor.execute(f"LOCK TABLE {q(parent)} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(ddl.plain_like(q, plain, parent))
        cursor.execute(f"INSERT INTO {q(plain)} SELECT * FROM {q(parent)}")
        _swap(cursor, q, old=parent, new=plain)
        cursor.execute(ddl.primary_key(q, parent, '"id"'))
        cursor.execute(ddl.unique_key(q, parent, _unique_constraint()))
        cursor.execute(ddl.expires_index(q, parent, _expires_index()))
    return True


def _swap(cursor: Any, q: ddl.Quote, *, old: str, new: str) -> None:
    """``new`` takes the place (and the name) of ``old``, which is dropped; the identity of
    ``id`` continues after the largest id."""
    cursor.execute(f"DROP TABLE {q(old)}")
    cursor.execute(f"ALTER TABLE {q(new)} RENAME TO {q(old)}")
    cursor.execute(ddl.identity_after(q, old), [q(old)])


def _expires_index() -> str:
    model = apps.get_model("django_idempotency", "IdempotencyKey")
    return str(model._meta.indexes[0].name)


def _unique_constraint() -> str:
    model = apps.get_model("django_idempotency", "IdempotencyKey")
    return str(model._meta.constraints[0].name)
