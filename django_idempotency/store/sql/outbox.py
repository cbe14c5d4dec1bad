"""The ``hybrid`` strategy's outbox row, inserted in the view's transaction (docs/hybrid.md).

A live row for the key wins (the conflict leaves it and returns nothing); an expired one
that was never drained is replaced. On PostgreSQL the commit guard (a stale ``db`` claim
deleted, a live key row refusing the insert) is folded into the same statement. The row's
``created_at`` and ``expires_at`` (now plus parameter ``ttl``) are the database's clock, as
every time of the key table is: never the app server's.
"""

from __future__ import annotations

from ..status import IN_PROGRESS
from .parts import Now, Param, Part, joined
from .schema import Schema

#: The columns of the outbox insert (the first two are the conflict target).
OUTBOX_ADD_COLUMNS = (
    "scope",
    "key",
    "fingerprint",
    "request_method",
    "request_path",
    "response_status",
    "response_headers",
    "response_body",
    "created_at",
    "expires_at",
)


#: The columns whose values are parameters; ``created_at`` and ``expires_at`` follow, from
#: the database's clock (:func:`_values`).
OUTBOX_ADD_PARAMS = OUTBOX_ADD_COLUMNS[:-2]


def _values(s: Schema) -> list[Part]:
    """The values of :data:`OUTBOX_ADD_COLUMNS`: the parameters, then now and now plus
    ``ttl`` seconds."""
    return joined([*(Param(name) for name in OUTBOX_ADD_PARAMS), Now(), Now("ttl")])


def _columns(s: Schema) -> list[str]:
    return [s.q(str(s.outbox_fields[name].column)) for name in OUTBOX_ADD_COLUMNS]


def _upsert(s: Schema) -> str:
    """``ON CONFLICT`` of the outbox insert: an expired row is replaced, a live one left."""
    columns = _columns(s)
    updates = ", ".join(f"{column} = EXCLUDED.{column}" for column in columns[2:])
    return (
        f" ON CONFLICT ({columns[0]}, {columns[1]}) DO UPDATE SET {updates} "
        f"WHERE {s.outbox}.{s.q('expires_at')} <= EXCLUDED.{s.q('created_at')} "
        f"RETURNING {s.q('id')}"
    )


def outbox_add(s: Schema) -> list[Part]:
    """``INSERT … VALUES … ON CONFLICT (scope, key) DO UPDATE … WHERE expired RETURNING``."""
    return [
        f"INSERT INTO {s.outbox} ({', '.join(_columns(s))}) VALUES (",
        *_values(s),
        ")" + _upsert(s),
    ]


def fence_ctes(s: Schema) -> list[Part]:
    """The CTEs of :func:`outbox_add_fenced`: ``fenced`` deletes a stale claim of the key
    (re-checked on the row's newest version: a renewal or a takeover in between keeps it),
    ``key_row`` reads the key's status and whether it is free."""
    return [
        f"fenced AS (DELETE FROM {s.table}",
        *s.key_where(),
        " AND ",
        *s.stale(),
        f" RETURNING 1), key_row AS (SELECT {s.col('status')} AS status, ",
        *s.free(),
        f" AS free FROM {s.table}",
        *s.key_where(),
        ")",
    ]


def outbox_add_fenced(s: Schema) -> list[Part]:
    """The outbox insert that runs after :func:`fence_ctes`: a row only when IdempotencyKey
    has no live row for the key and any in-progress row it had was the stale claim deleted
    by ``fenced``."""
    return [
        f"INSERT INTO {s.outbox} ({', '.join(_columns(s))}) SELECT ",
        *_values(s),
        " WHERE NOT EXISTS (SELECT 1 FROM key_row WHERE NOT key_row.free)",
        f" AND (NOT EXISTS (SELECT 1 FROM key_row WHERE key_row.status = '{IN_PROGRESS}')",
        " OR EXISTS (SELECT 1 FROM fenced))",
        _upsert(s),
    ]
