"""The statements that differ on a key table partitioned by expiry (PostgreSQL).

With ``PARTITION_INTERVAL`` set, IdempotencyKey is partitioned by range of ``expires_at``
(:mod:`~django_idempotency.store.partitions`). A unique index of a partitioned table must
hold the partition key, so no index keeps ``(scope, key)`` unique across partitions: each
partition has its own, and the statement that creates a live row of a key first takes a
transaction-level advisory lock on the key (:data:`LOCK_SQL`, the ``advisory_lock``
strategy's lock), in a statement of its own, then looks for a row of the key in every
partition and inserts only when there is none. Under READ COMMITTED the look's snapshot
is taken after the lock is granted, so it sees the row of any claimant that held the lock
before (the lock is held until that claimant's transaction committed). The reasoning is
in docs/how-it-works.md ("Uniqueness across partitions").

* the claim: ``INSERT … SELECT … WHERE NOT EXISTS (live outbox row) AND NOT EXISTS (row of
  the key) ON CONFLICT DO NOTHING RETURNING id`` (the partition's unique index as the
  arbiter: a second line, never reached while every writer takes the lock);
* the takeover: the stale or expired row deleted and the new claim inserted, one statement
  (a new id): an owner that was slow finds no row, where an ``UPDATE`` that moved the row
  to another partition would fail its concurrent ``UPDATE`` with a serialization error;
* the lease renewal also keeps ``expires_at`` at least one lease ahead, so that a key in
  progress under a live lease is never in a partition whose range has passed (the purge
  drops those whole);
* ``advisory_lock``'s completed record: the key's expired rows deleted and the record
  inserted when no live row is left (its caller holds the lock).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..status import COMPLETED, IN_PROGRESS
from . import claim as plain_claim
from . import completed, owner
from .deadline import bounded
from .parts import Now, Param, Part, joined
from .postgresql import commits_in_statement
from .schema import Schema
from .statement import Statement

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

#: The transaction-level advisory lock of a key; its one parameter is :func:`lock_name`.
LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


def lock_name(scope: str, key: str) -> str:
    """The text whose 64-bit hash names the advisory lock of ``(scope, key)``."""
    return f"django_idempotency\x1f{scope}\x1f{key}"


class LockedStatement(Statement):
    """A statement run after :data:`LOCK_SQL` on the key of parameter ``lock``, in the same
    transaction: the two as one query through psycopg 3's client-side binding (Django's
    default: a simple-protocol query is one implicit transaction, and the second
    statement's snapshot is taken after the first's lock), else as two statements in one
    transaction."""

    __slots__ = ("locked_sql",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.locked_sql = f"{LOCK_SQL}; {self.sql}"

    def execute(
        self, connection: BaseDatabaseWrapper, values: dict[str, Any], *, bound: bool = True
    ) -> Any:
        params = self.params(connection, values)
        with bounded(connection) if bound else nullcontext(), connection.cursor() as cursor:
            if commits_in_statement(connection):
                cursor.execute(self.locked_sql, [values["lock"], *params])
                cursor.nextset()
            else:
                with transaction.atomic(using=connection.alias):
                    cursor.execute(LOCK_SQL, [values["lock"]])
                    cursor.execute(self.sql, params)
            return cursor.fetchone() if self.returns_rows else None, cursor.rowcount


def _key_row(s: Schema) -> list[Part]:
    return [f" AND NOT EXISTS (SELECT 1 FROM {s.table}", *s.key_where(), ")"]


def claim(s: Schema, commit_mode: str) -> list[Part]:
    """The claim's ``INSERT``, inserting nothing while the key has a row in any partition."""
    insert = plain_claim.claim(s, commit_mode)
    where = insert[: len(insert) - len(s.dialect.insert_or_nothing(s))]
    return [*where, *_key_row(s), f" ON CONFLICT DO NOTHING RETURNING {s.col('id')}"]


def _also_from(commit_mode: str) -> str:
    """``commit_mode`` (``" FROM (…) AS async_commit"`` or ``""``) joined to a ``FROM``."""
    return commit_mode.replace(" FROM ", ", ", 1)


#: The columns of a view that runs in steps, which a takeover of a stale claim carries over.
STEP_COLUMNS = ("recovery_point", "steps")


def take_over(s: Schema, commit_mode: str) -> list[Part]:
    """The row ``pk`` deleted while its token is ``old_token``, it is free and the outbox
    holds no live completion of its key, and a new claim of its key inserted in its place;
    returns the new row's id."""
    col = s.col
    # A stale claim's steps go over to the new row (its retry resumes them, docs/steps.md),
    # with the time of its first claim (``DOWNSTREAM_KEY_LIFETIME`` counts from it); an
    # expired completed key's do not, nor a claim's without steps (a new claim: see
    # ``claim.take_over``).
    first = (
        f"CASE WHEN gone.{col('status')} = '{IN_PROGRESS}' AND gone.{col('steps')} IS NOT NULL "
        f"THEN gone.{col('created_at')} ELSE "
    )
    stamped: dict[str, Part | list[Part]] = {
        "scope": f"gone.{col('scope')}",
        "key": f"gone.{col('key')}",
        "status": f"'{IN_PROGRESS}'",
        "claim_token": Param("token"),
        "request_method": Param("method"),
        "request_path": Param("path"),
        "locked_at": Now(),
        "created_at": [first, Now(), " END"],
        "expires_at": Now("ttl"),
    }
    kept = [
        f"CASE WHEN gone.{col('status')} = '{IN_PROGRESS}' THEN gone.{col(n)} END"
        for n in STEP_COLUMNS
    ]
    columns = [*plain_claim.CLAIM_COLUMNS, *STEP_COLUMNS]
    gone = ("scope", "key", "status", "created_at", *STEP_COLUMNS)
    return [
        f"WITH gone AS (DELETE FROM {s.table}",
        *s.takeover_where(),
        f" RETURNING {', '.join(col(n) for n in gone)}) ",
        f"INSERT INTO {s.table} ({', '.join(col(n) for n in columns)}) SELECT ",
        *joined([stamped.get(name, Param(name)) for name in plain_claim.CLAIM_COLUMNS]),
        f", {', '.join(kept)}",
        f" FROM gone{_also_from(commit_mode)} ON CONFLICT DO NOTHING RETURNING {col('id')}",
    ]


def renew(s: Schema) -> list[Part]:
    """The lease renewed to now, and the expiry moved to now plus ``lease`` when it was
    sooner (a request that runs past its TTL)."""
    expires = s.col("expires_at")
    return [
        f"UPDATE {s.table} SET {s.col('locked_at')} = ",
        Now(),
        f", {expires} = GREATEST({expires}, ",
        Now("lease"),
        ")",
        *owner.owner_where(s),
    ]


def store_ctes(s: Schema) -> list[Part]:
    """``gone``: the key's expired rows deleted (the completed record replaces them)."""
    return [
        f"gone AS (DELETE FROM {s.table}",
        *s.key_where(),
        f" AND {s.col('expires_at')} <= ",
        Now(),
        " RETURNING 1)",
    ]


def store_insert(s: Schema) -> list[Part]:
    """The completed record inserted when the key has no live row (after ``gone``: the
    condition reads it, so the delete runs first)."""
    names = completed.STORE_COLUMNS
    stored: dict[str, Part] = {
        "created_at": Now(),
        "completed_at": Now(),
        "expires_at": Now("ttl"),
        "status": f"'{COMPLETED}'",
        "locked_at": "NULL",
    }
    return [
        f"INSERT INTO {s.table} ({', '.join(s.col(name) for name in names)}) SELECT ",
        *joined([stored.get(name, Param(name)) for name in names]),
        f" WHERE (SELECT count(*) FROM gone) >= 0 AND NOT EXISTS (SELECT 1 FROM {s.table}",
        *s.key_where(),
        f" AND {s.col('expires_at')} > ",
        Now(),
        f") ON CONFLICT DO NOTHING RETURNING {s.col('id')}",
    ]


def store(s: Schema) -> list[Part]:
    """``advisory_lock``'s completed record, over an expired one only."""
    return ["WITH ", *store_ctes(s), " ", *store_insert(s)]
