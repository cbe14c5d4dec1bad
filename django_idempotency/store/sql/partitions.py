"""The DDL of a key table partitioned by expiry (PostgreSQL): one builder per statement.

Used by :mod:`~django_idempotency.store.partitions`, which runs them: the conversion of the
plain table and back, a partition created ahead and attached, an expired one detached and
dropped. Names are quoted by the caller's ``q`` (``connection.ops.quote_name``); bounds
are parameters.
"""

from __future__ import annotations

from collections.abc import Callable

from ..status import IN_PROGRESS

Quote = Callable[[str], str]

#: The partitions of a table: their names, their bounds (read back from the text PostgreSQL
#: prints them as, in the session's own date style; NULL for a DEFAULT partition), and
#: whether a ``DETACH … CONCURRENTLY`` of theirs was interrupted.
LIST_PARTITIONS = (
    "SELECT c.relname, (regexp_match(b, 'FROM \\(''([^'']+)''\\)'))[1]::timestamptz, "
    "(regexp_match(b, 'TO \\(''([^'']+)''\\)'))[1]::timestamptz, i.inhdetachpending "
    "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "CROSS JOIN LATERAL pg_get_expr(c.relpartbound, c.oid) AS b "
    "WHERE i.inhparent = to_regclass(%s) ORDER BY 1"
)
#: Whether a partition of the key table (or a ``DEFAULT`` one) holds an expiry of now, on the
#: database's clock as the statements read it, plus the first parameter's seconds: a row with
#: it can be inserted. A partition being detached takes no rows.
HOLDS_EXPIRY = (
    "SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "CROSS JOIN LATERAL pg_get_expr(c.relpartbound, c.oid) AS b "
    "CROSS JOIN (SELECT statement_timestamp() + make_interval(secs => %s) AS e) AS t "
    "WHERE i.inhparent = to_regclass(%s) AND NOT i.inhdetachpending AND (b = 'DEFAULT' OR "
    "((regexp_match(b, 'FROM \\(''([^'']+)''\\)'))[1]::timestamptz <= t.e "
    "AND t.e < (regexp_match(b, 'TO \\(''([^'']+)''\\)'))[1]::timestamptz)))"
)
#: The kind of a table: ``p`` partitioned, ``r`` plain, None when it does not exist.
RELKIND = "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)"
#: The database's clock, as the statements read it.
NOW = "SELECT statement_timestamp()"
#: The share of a heap page that inserts fill, as migration 0004 sets on the plain table: the
#: room a completion needs to stay on the row's page (a HOT update). A partitioned table has
#: no heap of its own, so each partition, and the plain table made again, gets it.
FILLFACTOR = " WITH (fillfactor = 80)"


def partitioned_like(q: Quote, new: str, old: str) -> str:
    """A partitioned table ``new`` with the columns, defaults and identity of ``old``."""
    return (
        f"CREATE TABLE {q(new)} (LIKE {q(old)} INCLUDING DEFAULTS INCLUDING IDENTITY) "
        'PARTITION BY RANGE ("expires_at")'
    )


def plain_like(q: Quote, new: str, old: str) -> str:
    """A plain table ``new`` with the columns, defaults and identity of ``old``."""
    return (
        f"CREATE TABLE {q(new)} (LIKE {q(old)} INCLUDING DEFAULTS INCLUDING IDENTITY)" + FILLFACTOR
    )


def primary_key(q: Quote, table: str, columns: str) -> str:
    """The primary key of ``table`` (named as Django names it) on ``columns``."""
    return f"ALTER TABLE {q(table)} ADD CONSTRAINT {q(table + '_pkey')} PRIMARY KEY ({columns})"


def partition_of(q: Quote, partition: str, parent: str) -> str:
    """A partition of ``parent`` for the range of two parameters (a new parent only:
    ``CREATE … PARTITION OF`` locks the parent against every reader)."""
    return (
        f"CREATE TABLE {q(partition)} PARTITION OF {q(parent)} FOR VALUES FROM (%s) TO (%s)"
        + FILLFACTOR
    )


def table_like(q: Quote, partition: str, parent: str) -> str:
    """A table to attach to ``parent``: its columns and defaults."""
    return f"CREATE TABLE {q(partition)} (LIKE {q(parent)} INCLUDING DEFAULTS)" + FILLFACTOR


def unique_key(q: Quote, table: str, name: str) -> str:
    """``(scope, key)`` unique within ``table`` (one partition)."""
    return f'ALTER TABLE {q(table)} ADD CONSTRAINT {q(name)} UNIQUE ("scope", "key")'


def attach(q: Quote, parent: str, partition: str) -> str:
    """``partition`` attached to ``parent`` for the range of two parameters (a lock that
    lets reads and writes of the parent go on)."""
    return f"ALTER TABLE {q(parent)} ATTACH PARTITION {q(partition)} FOR VALUES FROM (%s) TO (%s)"


def detach(q: Quote, parent: str, partition: str, *, concurrently: bool) -> str:
    """``partition`` detached; ``concurrently`` (outside a transaction) without blocking the
    parent's readers and writers."""
    how = " CONCURRENTLY" if concurrently else ""
    return f"ALTER TABLE {q(parent)} DETACH PARTITION {q(partition)}{how}"


#: A key in progress with steps: the purge keeps it, whatever its expiry (its steps may have
#: taken effect; claimed afresh, its retry would run them again). The ORM's is
#: ``store.purge.UNFINISHED``.
UNFINISHED = f'"status" = \'{IN_PROGRESS}\' AND "steps" IS NOT NULL'


def keep_unfinished(q: Quote, table: str, *, in_range: bool = True) -> str:
    """The keys in progress with steps whose expiry falls in the range of parameters
    ``lower`` and ``upper`` (a partition's), or, not ``in_range``, has passed, given the
    expiry of parameter ``now`` (the maintenance's now, in a partition that holds it;
    through a partitioned ``table``, moved out of that range). They stay expired, as the
    purge and ``unfinished()`` see them, and in a partition that is not dropped: a drop, or
    a conversion that copies only the unexpired rows, would take them."""
    expiring = (
        '"expires_at" >= %(lower)s AND "expires_at" < %(upper)s'
        if in_range
        else '"expires_at" <= %(now)s'
    )
    return f'UPDATE {q(table)} SET "expires_at" = %(now)s WHERE {expiring} AND {UNFINISHED}'


def finalize(q: Quote, parent: str, partition: str) -> str:
    """The end of an interrupted ``DETACH … CONCURRENTLY``."""
    return f"ALTER TABLE {q(parent)} DETACH PARTITION {q(partition)} FINALIZE"


def copy_live(q: Quote, new: str, old: str) -> str:
    """The unexpired rows of ``old`` into ``new``, and the keys in progress with steps (the
    others are the purge's)."""
    return (
        f"INSERT INTO {q(new)} SELECT * FROM {q(old)} "
        f'WHERE "expires_at" > statement_timestamp() OR ({UNFINISHED})'
    )


def lease_ahead(q: Quote, table: str) -> str:
    """The keys in progress under a lease renewed after now less parameter ``lease``
    seconds: their expiry at least ``lease`` ahead (as the renewal keeps it on a
    partitioned table)."""
    ahead = "statement_timestamp() + make_interval(secs => %(lease)s)"
    return (
        f'UPDATE {q(table)} SET "expires_at" = {ahead} '
        f'WHERE "status" = \'{IN_PROGRESS}\' AND "expires_at" < {ahead} '
        'AND "locked_at" > statement_timestamp() - make_interval(secs => %(lease)s)'
    )


def identity_after(q: Quote, table: str) -> str:
    """The identity of ``table``'s ``id`` set past its largest id."""
    return (
        f"SELECT setval(pg_get_serial_sequence(%s, 'id'), "
        f'COALESCE((SELECT max("id") FROM {q(table)}), 0) + 1, false)'
    )


def expires_index(q: Quote, table: str, name: str) -> str:
    """The index on ``expires_at`` (on a partitioned table: one per partition)."""
    return f'CREATE INDEX {q(name)} ON {q(table)} ("expires_at")'
