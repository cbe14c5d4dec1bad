"""The ``db`` strategy: one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` per claim.

Works on PostgreSQL, SQLite, MariaDB and MySQL (``ON DUPLICATE KEY UPDATE``; see
:mod:`django_idempotency.store.sql.mysql`). The claim commits on its own, before the view
runs, so that every duplicate sees it at once. The view then runs in a
transaction, and the key's completion is the last statement of that same
transaction, guarded by the claim token: an owner whose claim was taken over
rolls its own writes back instead of committing them a second time.

A key that the ``hybrid`` strategy completed and that is still in its outbox (not
yet drained into IdempotencyKey) is never claimed: the claim's ``INSERT`` inserts
nothing while the outbox holds a live row for the key, and the loser's read returns
that row (see :meth:`IdempotencyKeyManager.claim`). See docs/strategies.md.
"""

from __future__ import annotations

import logging
import uuid

from django.db import DatabaseError, connections

from ..errors import LeaseLost, TransientConflict
from ..models import IdempotencyKey
from ..store.errors import is_transient, retry_after, store_unavailable
from ..store.records import ClaimState
from ..store.sql.statements import features_of
from ..values.keys import key_digest
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

logger = logging.getLogger("django_idempotency")


class DatabaseClaim(Claim):
    """A row of IdempotencyKey in progress under ``token``; its claim has committed."""

    folds_commit = True  # on PostgreSQL: the fenced completion and COMMIT, one query

    def __init__(
        self,
        strategy: DatabaseStrategy,
        attempt: Attempt,
        pk: int,
        token: uuid.UUID,
        taken_over: bool,
    ) -> None:
        super().__init__(attempt)
        self.strategy = strategy
        self.pk = pk
        self.token = token
        self.taken_over = taken_over

    def renew(self) -> bool:
        a = self.attempt
        return IdempotencyKey.objects.renew(
            self.pk, self.token, lock_timeout=a.lock_timeout, using=a.database
        )

    def store(self, response: StoredResponse, *, commit: bool) -> None:
        a = self.attempt
        try:
            if commit and a.wait > 0:
                # Before the completion that commits: the waiters are woken at COMMIT
                # (and never when the completion fails and aborts the transaction).
                waiting.notify_database(a.database, a.scope, a.key)
            stored = IdempotencyKey.objects.complete(
                self.pk, self.token, response, ttl=a.ttl, commit=commit, using=a.database
            )
            if stored and a.wait > 0 and not commit:
                # In the view's transaction: the waiters are woken at its COMMIT.
                waiting.notify_database(a.database, a.scope, a.key)
        except DatabaseError as exc:
            raise store_failed(exc, committing=commit)  # noqa: B904 - chained there
        if not stored:
            raise LeaseLost()

    def after_commit(self) -> None:
        if self.attempt.wait > 0:
            self.wake_local()

    def wake_local(self) -> None:
        """Wake this process's waiters for the key (the only wake-up on SQLite)."""
        waiting.hub.wake(key_digest(self.attempt.scope, self.attempt.key))

    def release(self) -> bool:
        a = self.attempt
        try:
            released = IdempotencyKey.objects.release(self.pk, self.token, using=a.database)
        except DatabaseError:
            logger.exception(
                "could not release idempotency key; it will be taken over after the lock timeout",
                extra={
                    "idempotency_scope": self.attempt.scope,
                    "idempotency_key": self.attempt.key,
                },
            )
            return False
        if released and a.wait > 0:
            # One waiter claims the key now; outside a transaction this is sent at once.
            try:
                waiting.notify_database(a.database, a.scope, a.key)
            except DatabaseError:
                logger.warning("could not notify the waiters of key %s", a.key, exc_info=True)
            self.wake_local()
        return released


class DatabaseStrategy(Strategy):
    name = "db"
    #: The Claim class handed to the view (the hybrid strategy's fallback extends it).
    claim_class: type[DatabaseClaim] = DatabaseClaim

    def listener(self, attempt: Attempt) -> waiting.Listener | None:
        if not features_of(connections[attempt.database]).notifies:
            return None  # in-process wake-ups and the poll
        return waiting.postgres_listener(attempt.database)

    def claim(self, attempt: Attempt) -> Outcome:
        try:
            result = IdempotencyKey.objects.claim(
                attempt.scope,
                attempt.key,
                attempt.fingerprint,
                ttl=attempt.ttl,
                lock_timeout=attempt.lock_timeout,
                method=attempt.method,
                path=attempt.path,
                using=attempt.database,
            )
        except DatabaseError as exc:
            if is_transient(exc):  # a deadlock the claim kept hitting: nothing was claimed
                raise TransientConflict(retry_after=retry_after()) from exc
            raise store_unavailable(exc) from exc
        if result.state is ClaimState.CLAIMED:
            assert result.pk is not None and result.token is not None
            return self.claim_class(self, attempt, result.pk, result.token, result.taken_over)
        if result.state is ClaimState.MISMATCH:
            return Mismatch()
        if result.state is ClaimState.IN_PROGRESS:
            return InProgress()
        assert result.response is not None
        return Replay(result.response)
