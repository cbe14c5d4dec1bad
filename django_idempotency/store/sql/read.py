"""The reads of a key: its live outbox row first, else its IdempotencyKey row, one statement.

An outbox row (a completion of the ``hybrid`` strategy not drained yet) is read as a
completed key in the columns of :data:`~django_idempotency.store.records.READ_COLUMNS`,
with a first column that says where the row came from (0: the outbox, 1: the key table).
"""

from __future__ import annotations

from ..records import READ_COLUMNS
from ..status import COMPLETED
from .parts import Now, Part
from .schema import Schema


def _outbox_as_key(s: Schema) -> str:
    """The outbox row's columns as a completed key's, in READ_COLUMNS order."""
    as_key = {
        "id": s.outbox_col("id"),
        "fingerprint": s.outbox_col("fingerprint"),
        "status": f"'{COMPLETED}'",
        "claim_token": "NULL",
        "locked_at": "NULL",
        "expires_at": s.outbox_col("expires_at"),
        "response_status": s.outbox_col("response_status"),
        "response_headers": s.outbox_col("response_headers"),
        "response_body": s.outbox_col("response_body"),
    }
    return ", ".join(as_key[name] for name in READ_COLUMNS)


def _key_columns(s: Schema) -> str:
    return ", ".join(s.col(name) for name in READ_COLUMNS)


def _key_row(s: Schema, *live: Part) -> list[Part]:
    return [f" FROM {s.table}", *s.key_where(), *live, " ORDER BY 1 LIMIT 1"]


def _outbox_then_key(s: Schema, *key_live: Part, clock: list[Part] | None = None) -> list[Part]:
    clock = clock or []
    return [
        f"SELECT 0, {_outbox_as_key(s)}",
        *clock,
        *s.outbox_live(Now()),
        f" UNION ALL SELECT 1, {_key_columns(s)}",
        *clock,
        *_key_row(s, *key_live),
    ]


#: The last column of the lookups of live rows: the database's now, from which the
#: ``hybrid`` strategy counts what a record has left when it refills Redis
#: (``KeyRecord.ttl_seconds``), never from the app server's clock.
CLOCK: list[Part] = [", ", Now()]


def read(s: Schema) -> list[Part]:
    """The key's live outbox row, else its IdempotencyKey row, live or not."""
    return _outbox_then_key(s)


def read_live(s: Schema) -> list[Part]:
    """The same, live rows only: an expired key row counts as absent (database clock),
    and the database's now as the last column. The ``hybrid`` strategy's lookup, and
    ``advisory_lock``'s read."""
    return _outbox_then_key(s, f" AND {s.col('expires_at')} > ", Now(), clock=CLOCK)


def claim_read(s: Schema) -> list[Part]:
    """The loser's read: :func:`read` with whether the row may be taken over by this
    request (decided in SQL, on the database's clock; never an outbox row) as its last
    column."""
    return [
        f"SELECT 0, {_outbox_as_key(s)}, FALSE",
        *s.outbox_live(Now()),
        f" UNION ALL SELECT 1, {_key_columns(s)}, ",
        *s.claimable(),
        *_key_row(s),
    ]


def outbox_lookup(s: Schema) -> list[Part]:
    """The key's live outbox row alone, and the database's now as the last column."""
    return [f"SELECT 0, {_outbox_as_key(s)}", *CLOCK, *s.outbox_live(Now())]
