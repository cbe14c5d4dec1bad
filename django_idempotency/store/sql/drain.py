"""One batch of the ``hybrid`` outbox drain as one statement (docs/hybrid.md, "The outbox
and its drain").

``WITH batch AS MATERIALIZED (SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED), moved
AS (DELETE … USING batch … RETURNING …), stored AS (INSERT INTO IdempotencyKey … SELECT …
FROM moved WHERE live ON CONFLICT (scope, key) DO UPDATE …)``: the rows no other drainer
holds are deleted from the outbox and their live ones written as completed keys, in one
statement and so in one transaction, with no row passing through the client. The key row
is overwritten whatever it holds, as the ORM path does (a ``db`` claim of the key still
running is fenced out by the fresh claim token), unless it was created after the response
expired: that is a newer record of the key, kept. Built where the dialect has
data-modifying CTEs (:attr:`BaseDialect.moves_in_statement
<django_idempotency.store.sql.base.BaseDialect.moves_in_statement>`); elsewhere the
manager keeps its ORM path.

On a key table partitioned by expiry (``PARTITION_INTERVAL``) no index can arbitrate
``ON CONFLICT (scope, key)``, so a batch is two statements of one transaction, as the
claim is (:mod:`.partitioned`): :func:`lock_batch` takes the batch and each of its keys'
advisory locks, in the order of the locks' hashes; :func:`move_locked` (whose snapshot
is taken after the locks) deletes the batch from the outbox and, for its live rows only,
any row of their keys from the key table, and inserts them as completed keys.
"""

from __future__ import annotations

from ..status import COMPLETED
from .completed import STORE_COLUMNS
from .outbox import OUTBOX_ADD_COLUMNS
from .parts import Now, Param, Part
from .schema import Schema


def _batch(s: Schema, hold: bool, *columns: str) -> list[Part]:
    """``batch``: the first ``limit`` outbox rows by id that no other drainer holds (their
    id, creation time and ``columns``); with ``hold``, ``due`` has a row only when the
    batch is full or its oldest row was created at or before now plus ``hold`` (a negative
    number of seconds)."""
    pk, created = s.q("id"), s.q("created_at")
    selected = ", ".join([pk, created, *(s.q(c) for c in columns)])
    parts: list[Part] = [
        f"batch AS MATERIALIZED (SELECT {selected} FROM {s.outbox} ORDER BY {pk} LIMIT ",
        Param("limit"),
        " FOR UPDATE SKIP LOCKED)",
    ]
    if hold:
        parts += [
            ", due AS (SELECT 1 FROM batch HAVING count(*) >= ",
            Param("limit"),
            f" OR min({created}) <= ",
            Now("hold"),
            ")",
        ]
    return parts


def _moved(s: Schema, hold: bool) -> list[Part]:
    """``moved``: the batch's rows deleted from the outbox, their columns returned."""
    returned = ", ".join(s.outbox_col(name) for name in OUTBOX_ADD_COLUMNS)
    return [
        f"moved AS (DELETE FROM {s.outbox} USING batch{', due' if hold else ''} "
        f"WHERE {s.outbox_col('id')} = batch.{s.q('id')} RETURNING {returned})",
    ]


def _insert_moved(s: Schema) -> str:
    """``INSERT INTO`` the key table ``SELECT`` the moved rows as completed keys, each with
    a fresh claim token (the ``WHERE`` follows)."""

    def column(name: str) -> str:
        return s.q(str(s.outbox_fields[name].column))

    taken = {
        "status": f"'{COMPLETED}'",
        "claim_token": "gen_random_uuid()",
        "locked_at": "NULL",
        "completed_at": column("created_at"),
    }
    selected = ", ".join(taken.get(name) or column(name) for name in STORE_COLUMNS)
    return (
        f"INSERT INTO {s.table} ({', '.join(s.col(n) for n in STORE_COLUMNS)}) "
        f"SELECT {selected} FROM moved WHERE {s.q(str(s.outbox_fields['expires_at'].column))} > "
    )


def _stored(s: Schema) -> list[Part]:
    """``stored``: the moved rows that have not expired, written as completed keys with a
    fresh claim token over any row of their keys that was created before the response
    expired. A row created at or after that is a newer record of the key (claimed once the
    response had expired, and committed while this statement, which judged the response
    live when it started, waited for it): it is kept, and the response only deleted."""
    updates = ", ".join(f"{s.col(name)} = EXCLUDED.{s.col(name)}" for name in STORE_COLUMNS[2:])
    return [
        f"stored AS ({_insert_moved(s)}",
        Now(),
        f" ON CONFLICT ({s.col('scope')}, {s.col('key')}) DO UPDATE SET {updates} "
        f"WHERE {s.table}.{s.col('created_at')} < EXCLUDED.{s.col('expires_at')} RETURNING 1)",
    ]


def drain_batch(s: Schema, *, hold: bool) -> list[Part]:
    """One batch of the drain; its one row: the rows the batch took, the rows it deleted
    from the outbox, the rows it wrote as keys (taken but not deleted: held)."""
    return [
        "WITH ",
        *_batch(s, hold),
        ", ",
        *_moved(s, hold),
        ", ",
        *_stored(s),
        " SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM moved), "
        "(SELECT count(*) FROM stored)",
    ]


def lock_expression(scope: str, key: str) -> str:
    """SQL for the 64-bit hash that names the advisory lock of the key in columns ``scope``
    and ``key``: the same text, and so the same lock, as
    :func:`~django_idempotency.store.sql.partitioned.lock_name` gives the claim's."""
    return f"hashtextextended('django_idempotency' || chr(31) || {scope} || chr(31) || {key}, 0)"


def lock_batch(s: Schema, *, hold: bool) -> list[Part]:
    """The partitioned drain's first statement: the batch (as :func:`drain_batch` takes
    it) and the advisory lock of each of its keys, taken in the order of their hashes (a
    drainer never waits for a lock while it holds a later one); its one row: the rows
    taken, and the ids of those to move (none while a short batch is held)."""
    pk, lock = s.q("id"), lock_expression(s.q("scope"), s.q("key"))
    return [
        "WITH ",
        *_batch(s, hold, "scope", "key"),
        f", locked AS MATERIALIZED (SELECT {pk}, pg_advisory_xact_lock(lock) FROM "
        f"(SELECT batch.{pk}, {lock} AS lock FROM batch{', due' if hold else ''} "
        f"ORDER BY lock OFFSET 0) AS ordered) "
        f"SELECT (SELECT count(*) FROM batch), ARRAY(SELECT {pk} FROM locked)",
    ]


def move_locked(s: Schema) -> list[Part]:
    """The partitioned drain's second statement: the outbox rows of ids ``ids`` (locked
    by :func:`lock_batch`) deleted; for each of them that is live, every row of its key
    deleted from the key table (whatever partition holds it) and the row inserted as a
    completed key (after the delete: the insert reads its count). An expired outbox row
    is only deleted: the key's row, which may be a newer record written since (another
    strategy's, after a switch), is left alone. Live is judged once, on the database's
    clock, for the delete and the insert alike. Its one row: rows deleted, rows stored."""
    returned = ", ".join(s.outbox_col(name) for name in OUTBOX_ADD_COLUMNS)
    return [
        f"WITH moved AS (DELETE FROM {s.outbox} WHERE {s.outbox_col('id')} = ANY(",
        Param("ids"),
        f") RETURNING {returned}), gone AS (DELETE FROM {s.table} USING moved "
        f"WHERE {s.table}.{s.col('scope')} = moved.{s.q('scope')} "
        f"AND {s.table}.{s.col('key')} = moved.{s.q('key')} "
        f"AND moved.{s.q(str(s.outbox_fields['expires_at'].column))} > ",
        Now(),
        f" RETURNING 1), stored AS ({_insert_moved(s)}",
        Now(),
        " AND (SELECT count(*) FROM gone) >= 0 RETURNING 1) "
        "SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM stored)",
    ]
