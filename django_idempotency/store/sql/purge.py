"""One batch of the purge of expired keys, one statement in a short transaction of its own.

Purgeable: expired at ``cutoff`` (a parameter when given, else the database's now plus
``older``) and, when in progress, neither under a live lease (renewed after parameter
``lease_cutoff`` when given, else after the database's now plus ``lease``) nor holding
steps: a key whose request is still running is never deleted, nor one whose steps may have
taken effect (a retry resumes it; claimed afresh, it would run them again). See
docs/operations.md.
"""

from __future__ import annotations

from ..status import IN_PROGRESS
from .parts import Now, Param, Part, lapsed
from .schema import Schema


def purgeable(s: Schema, *, cutoff: bool, lease_cutoff: bool) -> list[Part]:
    """The purge's condition on one row (``store.purge.PurgeQuerySet.purgeable`` through
    the ORM)."""
    expired_at: Part = Param("cutoff") if cutoff else Now("older")
    lease_at: Part = Param("lease_cutoff") if lease_cutoff else Now("lease")
    return [
        f"{s.col('expires_at')} <= ",
        expired_at,
        f" AND ({s.col('status')} <> '{IN_PROGRESS}' OR (",
        *lapsed(s.col("locked_at"), lease_at),
        f" AND {s.col('steps')} IS NULL))",
    ]


def purge_batch(s: Schema, *, cutoff: bool, lease_cutoff: bool) -> list[Part]:
    """The first ``limit`` purgeable keys by expiry deleted
    (:meth:`~django_idempotency.store.sql.base.BaseDialect.delete_first`: ``DELETE …
    WHERE <purgeable> AND id IN (SELECT id … WHERE <purgeable> ORDER BY expires_at LIMIT
    n)``). The condition is checked again on the row version the DELETE locks: a key that
    a request took over (renewed) after it was read is not deleted."""
    where = purgeable(s, cutoff=cutoff, lease_cutoff=lease_cutoff)
    return s.dialect.delete_first(s, where, s.col("expires_at"), Param("limit"))
