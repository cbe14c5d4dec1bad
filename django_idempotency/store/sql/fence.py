"""The ``hybrid`` strategy's check of a key before its commit, as two statements.

``fence_stale_claim``: read whether IdempotencyKey has a live row for the key, and delete
a stale ``db`` claim of it (fencing its owner out: its ``complete`` finds no row). On
PostgreSQL the same check is folded into the outbox insert
(:func:`~django_idempotency.store.sql.outbox.outbox_add_fenced`).
"""

from __future__ import annotations

from .parts import Param, Part
from .schema import Schema


def fence_read(s: Schema) -> list[Part]:
    """The key's id, status, claim token and whether it is free (stale or expired)."""
    return [
        f"SELECT {s.col('id')}, {s.col('status')}, {s.col('claim_token')}, ",
        *s.free(),
        f" FROM {s.table}",
        *s.key_where(),
    ]


def fence_delete(s: Schema) -> list[Part]:
    """The stale claim ``pk`` deleted, only while its token is ``token`` and it is stale."""
    return [
        f"DELETE FROM {s.table} WHERE {s.col('id')} = ",
        Param("pk"),
        f" AND {s.col('claim_token')} = ",
        Param("token"),
        " AND ",
        *s.stale(),
    ]
