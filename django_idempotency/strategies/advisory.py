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

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.utils import OperationalError
from django.utils import timezone

from ..errors import StoreUnavailable
from ..managers import COMPLETED
from ..models import IdempotencyKey
from ..responses import StoredResponse
from .base import (
    Attempt,
    InFlight,
    Mismatch,
    Outcome,
    Replay,
    Strategy,
    TransactionalClaim,
)

LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
TRY_LOCK_SQL = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))"


def lock_name(scope: str, key: str) -> str:
    return f"django_idempotency\x1f{scope}\x1f{key}"


class AdvisoryClaim(TransactionalClaim):
    renewable = False  # the transaction itself is the lock

    def __init__(self, attempt: Attempt) -> None:
        super().__init__(attempt)
        self.in_transaction = True  # the whole session is one transaction

    def renew(self) -> bool:
        return True

    def _store(self, response: StoredResponse) -> None:
        # One upsert: the advisory lock already serialises this (scope, key).
        attempt = self.attempt
        IdempotencyKey.objects.store_completed(
            attempt.scope,
            attempt.key,
            attempt.fingerprint,
            response,
            ttl=attempt.ttl,
            method=attempt.method,
            path=attempt.path,
            using=attempt.database,
        )

    def delete(self) -> bool:
        # Never called: the claim is always inside its transaction, and nothing of it
        # outlives a rollback.
        return False


class AdvisoryLockStrategy(Strategy):
    name = "advisory_lock"

    @contextmanager
    def session(self, attempt: Attempt) -> Iterator[Outcome]:
        using = attempt.database
        connection = connections[using]
        claim = AdvisoryClaim(attempt)
        try:
            atomic = transaction.atomic(using=using)
            atomic.__enter__()
        except DatabaseError as exc:
            raise StoreUnavailable() from exc
        try:
            outcome = self._lock_and_read(connection, attempt, claim)
            yield outcome
        except BaseException as exc:
            atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise
        try:
            atomic.__exit__(None, None, None)
        except IntegrityError as exc:  # pragma: no cover - the lock makes this unreachable
            raise StoreUnavailable() from exc
        if claim.pending is not None and not claim.released:
            with transaction.atomic(using=using):
                self._lock(connection, attempt)
                claim._store(claim.pending)

    def _lock(self, connection: object, attempt: Attempt) -> None:
        name = lock_name(attempt.scope, attempt.key)
        with connection.cursor() as cursor:  # type: ignore[attr-defined]
            # Uncontended (the usual case): one statement takes the lock at once.
            cursor.execute(TRY_LOCK_SQL, [name])
            if cursor.fetchone()[0]:
                return
            # Another request holds the key: wait for it, up to the lock timeout.
            cursor.execute(
                "SET LOCAL lock_timeout = %s", [f"{max(int(attempt.lock_timeout * 1000), 1)}ms"]
            )
            cursor.execute(LOCK_SQL, [name])
            # The timeout is for the wait on the key only, not for the view's own statements.
            cursor.execute("SET LOCAL lock_timeout TO DEFAULT")

    def _lock_and_read(self, connection: object, attempt: Attempt, claim: AdvisoryClaim) -> Outcome:
        try:
            self._lock(connection, attempt)
        except OperationalError as exc:
            if getattr(getattr(exc, "__cause__", None), "sqlstate", None) == "55P03":
                # lock_not_available: another request has held the key past the lock timeout
                transaction.set_rollback(True, using=attempt.database)
                return InFlight()
            raise StoreUnavailable() from exc
        row = IdempotencyKey.objects.read(attempt.scope, attempt.key, using=attempt.database)
        if row is None or row.expires_at <= timezone.now():
            return claim
        if row.fingerprint != attempt.fingerprint:
            return Mismatch()
        if row.status != COMPLETED:
            return InFlight()
        return Replay(
            StoredResponse(
                status=int(row.response_status or 0),
                headers=dict(row.response_headers or {}),
                body=bytes(row.response_body or b""),
            )
        )
