"""One batch of the ``hybrid`` outbox drain as one statement (docs/hybrid.md, "The outbox
and its drain").

``WITH batch AS MATERIALIZED (SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED), moved
AS (DELETE … USING batch … RETURNING …), stored AS (INSERT INTO IdempotencyKey … SELECT …
FROM moved WHERE live ON CONFLICT (scope, key) DO UPDATE …)``: the rows no other drainer
holds are deleted from the outbox and their live ones written as completed keys, in one
statement and so in one transaction, with no row passing through the client. The key row
is overwritten whatever it holds, as the ORM path does (a ``db`` claim of the key still
running is fenced out by the fresh claim token). Built where the dialect has
data-modifying CTEs (:attr:`BaseDialect.moves_in_statement
<django_idempotency.store.sql.base.BaseDialect.moves_in_statement>`); elsewhere the
manager keeps its ORM path.
"""

from __future__ import annotations

from ..status import COMPLETED
from .completed import STORE_COLUMNS
from .outbox import OUTBOX_ADD_COLUMNS
from .parts import Now, Param, Part
from .schema import Schema


def _batch(s: Schema, hold: bool) -> list[Part]:
    """``batch``: the first ``limit`` outbox rows by id that no other drainer holds; with
    ``hold``, ``due`` has a row only when the batch is full or its oldest row was created
    at or before now plus ``hold`` (a negative number of seconds)."""
    pk, created = s.q("id"), s.q("created_at")
    parts: list[Part] = [
        f"batch AS MATERIALIZED (SELECT {pk}, {created} FROM {s.outbox} ORDER BY {pk} LIMIT ",
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


def _stored(s: Schema) -> list[Part]:
    """``stored``: the moved rows that have not expired, written as completed keys with a
    fresh claim token over any row of their keys."""

    def column(name: str) -> str:
        return s.q(str(s.outbox_fields[name].column))

    taken = {
        "status": f"'{COMPLETED}'",
        "claim_token": "gen_random_uuid()",
        "locked_at": "NULL",
        "completed_at": column("created_at"),
    }
    selected = ", ".join(taken.get(name) or column(name) for name in STORE_COLUMNS)
    updates = ", ".join(f"{s.col(name)} = EXCLUDED.{s.col(name)}" for name in STORE_COLUMNS[2:])
    return [
        f"stored AS (INSERT INTO {s.table} ({', '.join(s.col(n) for n in STORE_COLUMNS)}) "
        f"SELECT {selected} FROM moved WHERE {column('expires_at')} > ",
        Now(),
        f" ON CONFLICT ({s.col('scope')}, {s.col('key')}) DO UPDATE SET {updates} RETURNING 1)",
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
