"""The claim and the takeover: how a request makes a key its own.

The claim inserts the in-progress row, or nothing when the key has a row or a live outbox
row; the takeover replaces a stale or expired claim, fenced by its old token. Both commit
on their own in autocommit (asynchronously where the dialect can) and with the caller's
transaction inside one. What they do is told in docs/how-it-works.md.
"""

from __future__ import annotations

from ..status import IN_PROGRESS
from .parts import Now, Param, Part, joined
from .schema import Schema

#: The columns of the claim's INSERT.
CLAIM_COLUMNS = (
    "scope",
    "key",
    "fingerprint",
    "status",
    "claim_token",
    "locked_at",
    "request_method",
    "request_path",
    "response_headers",
    "created_at",
    "expires_at",
)


def claim(s: Schema, commit_mode: str) -> list[Part]:
    """``INSERT … SELECT … WHERE NOT EXISTS (live outbox row) ON CONFLICT DO NOTHING
    RETURNING id``: one statement (on SQLite, ``INSERT … SELECT … ON CONFLICT`` needs the
    ``SELECT``'s ``WHERE`` clause, which it has); the end is the dialect's
    (:meth:`~django_idempotency.store.sql.base.BaseDialect.insert_or_nothing`).
    ``commit_mode``: the dialect's ``async_commit`` in autocommit, else ``""``."""
    stamped: dict[str, Part] = {"locked_at": Now(), "created_at": Now(), "expires_at": Now("ttl")}
    return [
        f"INSERT INTO {s.table} ({', '.join(s.col(name) for name in CLAIM_COLUMNS)}) SELECT ",
        *joined([stamped.get(name, Param(name)) for name in CLAIM_COLUMNS]),
        commit_mode or s.dialect.from_nothing,
        " WHERE NOT EXISTS (SELECT 1",
        *s.outbox_live(Now()),
        ")",
        *s.dialect.insert_or_nothing(s),
    ]


def take_over(s: Schema, commit_mode: str) -> list[Part]:
    """The row ``pk`` made a new claim under ``token``, only while its token is still
    ``old_token``, it is still free (stale or expired, on the database's clock) and the
    outbox holds no live completion of its key."""
    col = s.col
    # First, while ``status`` is still the old row's (MySQL assigns left to right): a stale
    # claim keeps the steps it committed (its retry resumes them, docs/steps.md); an
    # expired completed key starts again without them.
    # So does the time of its first claim, when it has steps: a remote step's downstream key
    # lives from then at the other service (``DOWNSTREAM_KEY_LIFETIME``), whatever the
    # takeovers since. Without steps the claim is new (a drain of an outbox completion over
    # it tells a newer record of the key by its creation, ``store.sql.drain``).
    kept = f"CASE WHEN {col('status')} = '{IN_PROGRESS}' THEN {{}} ELSE NULL END"
    return [
        f"UPDATE {s.table} SET {col('recovery_point')} = "
        f"{kept.format(col('recovery_point'))}, {col('steps')} = {kept.format(col('steps'))}, "
        f"{col('created_at')} = CASE WHEN {col('status')} = '{IN_PROGRESS}' "
        f"AND {col('steps')} IS NOT NULL THEN {col('created_at')} ELSE ",
        Now(),
        f" END, {col('claim_token')} = ",
        Param("token"),
        f", {col('fingerprint')} = ",
        Param("fingerprint"),
        f", {col('status')} = '{IN_PROGRESS}', {col('locked_at')} = ",
        Now(),
        f", {col('request_method')} = ",
        Param("method"),
        f", {col('request_path')} = ",
        Param("path"),
        f", {col('response_status')} = NULL, {col('response_headers')} = ",
        Param("response_headers"),
        f", {col('response_body')} = NULL, {col('completed_at')} = NULL, {col('expires_at')} = ",
        Now("ttl"),
        commit_mode,
        *s.takeover_where(),
    ]
