"""The ``advisory_lock`` strategy (PostgreSQL only).

The request opens a transaction, takes ``pg_advisory_xact_lock`` on a 64-bit
hash of (scope, key) and then reads and writes the record. The lock is held
until the transaction ends, so a duplicate *waits* for the first request and
then replays its response, instead of getting a 409; a waiter that cannot get
the lock within the lock timeout gets the 409. Two keys whose hashes collide
only serialize each other: the unique constraint on (scope, key) still decides.
A crashed worker's lock is freed by PostgreSQL when its connection closes, so
there is nothing to take over.
"""

from __future__ import annotations

import dataclasses

from django.db import DatabaseError, connections, transaction
from django.db.utils import OperationalError

from ..errors import LeaseLost, StoreUnavailable
from ..models import IdempotencyKey
from ..store.errors import retry_after
from ..store.partitions import holds_expiry, log_no_partition
from ..store.sql.deadline import bounded
from ..store.sql.partitioned import LOCK_SQL, lock_name
from ..store.status import COMPLETED
from ..values.response import StoredResponse
from . import waiting
from .base import (
    Attempt,
    Claim,
    InProgress,
    Mismatch,
    Outcome,
    Replay,
    Strategy,
    store_failed,
)

TRY_LOCK_SQL = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))"


class AdvisoryClaim(Claim):
    renewable = False  # the transaction itself is the lock
    folds_commit = True  # on PostgreSQL: the upsert and COMMIT, one query

    def renew(self) -> bool:
        return True

    def store(self, response: StoredResponse, *, commit: bool) -> None:
        # The advisory lock serialises this (scope, key), so no live record can exist.
        try:
            stored = self._upsert(response, commit=commit)
        except DatabaseError as exc:
            raise store_failed(exc, committing=commit)  # noqa: B904 - chained there
        if not stored:
            raise LeaseLost()

    def store_pending(self, response: StoredResponse) -> bool:
        # The view's transaction rolled back, and the lock with it: another request may
        # have run and completed the key since. Take the lock again and store only
        # over an absent or expired record, never over the other execution's.
        try:
            with transaction.atomic(using=self.attempt.database):
                lock(dataclasses.replace(self.attempt, wait=0))  # the owner: no waiter slot
                return self._upsert(response)
        except DatabaseError as exc:
            raise store_failed(exc, committing=False)  # noqa: B904 - chained there

    def _upsert(self, response: StoredResponse, *, commit: bool = False) -> bool:
        attempt = self.attempt
        return IdempotencyKey.objects.store_completed(
            attempt.scope,
            attempt.key,
            attempt.fingerprint,
            response,
            ttl=attempt.ttl,
            method=attempt.method,
            path=attempt.path,
            commit=commit,
            using=attempt.database,
        )

    def release(self) -> bool:
        # Nothing of the claim outlives its transaction's rollback.
        return False


class NoWaiterSlot(Exception):
    """``WAIT_MAX_WAITERS`` duplicates already wait in this process."""


def lock(attempt: Attempt) -> None:
    """Take the advisory lock of ``attempt``'s key in the current transaction, waiting
    at most its lock timeout for another holder (and at most ``attempt.wait`` when that
    is set: a waiter then takes one of the process's ``WAIT_MAX_WAITERS`` slots, or
    raises ``NoWaiterSlot``)."""
    name = lock_name(attempt.scope, attempt.key)
    connection = connections[attempt.database]
    # DATABASE_TIMEOUT past the longest wait for the lock (a wait shorter than that is the
    # lock timeout's, and a 409).
    with bounded(connection, extra=attempt.lock_timeout), connection.cursor() as cursor:
        # Uncontended (the usual case): one statement takes the lock at once.
        cursor.execute(TRY_LOCK_SQL, [name])
        if cursor.fetchone()[0]:
            return
        # Another request holds the key: wait for it, up to the lock timeout.
        seconds = attempt.lock_timeout
        if attempt.wait > 0:
            seconds = min(seconds, attempt.wait)
            if not waiting.slots.acquire():
                raise NoWaiterSlot()
        try:
            cursor.execute("SET LOCAL lock_timeout = %s", [f"{max(int(seconds * 1000), 1)}ms"])
            cursor.execute(LOCK_SQL, [name])
        finally:
            if attempt.wait > 0:
                waiting.slots.release()
        # The timeout is for the wait on the key only, not for the view's own statements.
        cursor.execute("SET LOCAL lock_timeout TO DEFAULT")


def _check_partition(attempt: Attempt) -> None:
    """On a key table partitioned by expiry, ``StoreUnavailable`` (with ``Retry-After``)
    unless a partition holds the expiry the completed record will get (the TTL from now, on
    the database's clock). The record is written only once the view has run: without this,
    a missing partition would be found only then, and every duplicate queued on the lock
    would run the view in turn to find it again."""
    try:
        holds = holds_expiry(connections[attempt.database], attempt.ttl)
    except DatabaseError as exc:
        raise StoreUnavailable() from exc
    if not holds:
        log_no_partition(attempt.ttl)
        raise StoreUnavailable(retry_after=retry_after())


class AdvisoryLockStrategy(Strategy):
    name = "advisory_lock"
    claims_in_transaction = True
    waits_in_claim = True  # with WAIT set, the lock wait is bounded by it

    @staticmethod
    def lock(attempt: Attempt) -> InProgress | None:
        """Take the key's lock (:func:`lock`); ``InProgress`` when another request held it
        past the lock timeout (or no waiter slot was free), None once it is this one's."""
        try:
            lock(attempt)
        except NoWaiterSlot:
            return InProgress()
        except OperationalError as exc:
            if getattr(getattr(exc, "__cause__", None), "sqlstate", None) == "55P03":
                # lock_not_available: another request has held the key past the lock timeout
                return InProgress()
            raise StoreUnavailable() from exc
        return None

    def claim(self, attempt: Attempt) -> Outcome:
        """Lock, then read, in the transaction the lifecycle has opened."""
        busy = self.lock(attempt)
        if busy is not None:
            return busy
        try:
            row = IdempotencyKey.objects.read(
                attempt.scope, attempt.key, live=True, using=attempt.database
            )
        except DatabaseError as exc:
            raise StoreUnavailable() from exc
        if row is None:
            _check_partition(attempt)
            return AdvisoryClaim(attempt)
        if row.fingerprint != attempt.fingerprint:
            return Mismatch()
        if row.status != COMPLETED:
            return InProgress()
        return Replay(row.stored_response())
