"""The claim owner's statements, fenced by its token: complete, renew, release.

Each matches the row ``pk`` only while its claim token is ``token`` and it is in
progress: an owner whose claim was taken over (or released, or completed) changes
nothing, and learns so from the row count.
"""

from __future__ import annotations

from ..status import COMPLETED, IN_PROGRESS
from .parts import Now, Param, Part
from .schema import Schema


def owner_where(s: Schema) -> list[Part]:
    """`` WHERE`` the row ``pk`` is in progress under claim token ``token``."""
    return [
        f" WHERE {s.col('id')} = ",
        Param("pk"),
        f" AND {s.col('claim_token')} = ",
        Param("token"),
        f" AND {s.col('status')} = '{IN_PROGRESS}'",
    ]


def complete(s: Schema) -> list[Part]:
    """The response stored and the key completed, its TTL counted from now, or from the
    claim when that is at most ``ttl - kept_ttl`` earlier (the expiry the claim wrote is
    kept: no indexed column changes, so PostgreSQL updates the row in place, a HOT
    update; see :data:`~django_idempotency.store.records.EXPIRY_SLACK`)."""
    col = s.col
    expires = col("expires_at")
    return [
        f"UPDATE {s.table} SET {col('status')} = '{COMPLETED}', {col('response_status')} = ",
        Param("response_status"),
        f", {col('response_headers')} = ",
        Param("response_headers"),
        f", {col('response_body')} = ",
        Param("response_body"),
        f", {col('completed_at')} = ",
        Now(),
        f", {col('locked_at')} = NULL, {expires} = CASE WHEN {expires} >= ",
        Now("kept_ttl"),
        f" AND {expires} <= ",
        Now("ttl"),
        f" THEN {expires} ELSE ",
        Now("ttl"),
        " END",
        *owner_where(s),
    ]


def renew(s: Schema) -> list[Part]:
    """The lease renewed to now."""
    return [f"UPDATE {s.table} SET {s.col('locked_at')} = ", Now(), *owner_where(s)]


def release(s: Schema) -> list[Part]:
    """The in-progress claim deleted, so that the client may retry."""
    return [f"DELETE FROM {s.table}", *owner_where(s)]
