"""The claims of a view that runs in steps (``steps=True``; docs/steps.md).

Such a view commits several times: each local step commits its own writes together with
the key's ``recovery_point`` and ``steps`` (what the steps done returned), in one
transaction whose last statement is fenced by the claim token, as the completion is. A
retry claims the key again, finds the steps done and resumes after them; so a claim given
back after a step committed keeps its row (a fresh token no one holds and a lapsed lease,
so that the next retry takes it over at once) instead of deleting it.

Two strategies run steps:

* ``db``: the claim, the lease and its takeover are the ``db`` strategy's; a takeover of a
  stale claim keeps the steps it committed (``store.sql.claim.take_over``). A retry with
  another fingerprint that took the row over gives it back as it found it and is answered
  422.
* ``advisory_lock``: the transaction-level lock ends at a step's COMMIT, so the claim also
  takes the same key's *session-level* advisory lock, held across the steps' commits and
  freed by PostgreSQL when the connection closes (a crashed worker). It writes an
  in-progress row (the steps need one), whose lease the running owner renews, which a
  duplicate that gets the lock finds: its owner is then gone, and the duplicate resumes it
  under a new token.

``redis`` and ``hybrid`` keep the claim in Redis, where no transaction can commit a step
together with the key's record: a view with steps that declares one is refused (check
E090); one that runs under the ``STRATEGY`` setting's is answered 503.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import ExpressionWrapper, F
from django.db.models.functions import Greatest
from django.utils.translation import gettext_lazy as _

from ..conf import conf
from ..errors import LeaseLost, StoreUnavailable
from ..models import IdempotencyKey
from ..store.clock import DatabaseNow, database_ago
from ..store.records import ClaimState
from ..store.sql.partitioned import lock_name
from ..store.status import COMPLETED, IN_PROGRESS
from .advisory import AdvisoryLockStrategy
from .base import Attempt, InProgress, Mismatch, Outcome, Replay, Strategy
from .db import DatabaseClaim, DatabaseStrategy

logger = logging.getLogger("django_idempotency")

#: The strategies that run a view in steps, by name.
STEP_STRATEGIES = ("db", "advisory_lock")

#: The detail of the 503 for a view with steps under a strategy that does not run them.
STEPS_UNSUPPORTED = _(
    "This endpoint is configured to run in steps under a strategy that cannot run them."
)

SESSION_LOCK_SQL = "SELECT pg_advisory_lock(hashtextextended(%s, 0))"
SESSION_UNLOCK_SQL = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"

#: How far back a given-back claim's lease is set: lapsed for any ``LOCK_TIMEOUT``.
LAPSED = datetime.timedelta(days=3650)


@dataclass
class StepState:
    """What a key's row says of its steps: the fingerprint of the request that ran them,
    the steps done, in order (``{"name", "kind", "result"}`` each), and what else the row's
    ``steps`` holds (the completer's request and attempts, :mod:`~django_idempotency.
    completer`), which every record of a step keeps as it found it."""

    fingerprint: str = ""
    done: list[dict[str, Any]] = field(default_factory=list)
    kept: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, stored: Any) -> StepState | None:
        if not isinstance(stored, dict):
            return None
        kept = {name: value for name, value in stored.items() if name not in _OWN}
        return cls(str(stored.get("fingerprint", "")), list(stored.get("done") or []), kept)


#: The members of a row's ``steps`` that :class:`StepState` reads itself.
_OWN = frozenset({"fingerprint", "done"})


def load_state(attempt: Attempt, pk: int) -> StepState | None:
    """The steps the row ``pk`` holds (None: none, or no such row)."""
    stored = (
        IdempotencyKey.objects.using(attempt.database)
        .filter(pk=pk)
        .values_list("steps", flat=True)
        .first()
    )
    return StepState.of(stored)


def _lapsed() -> ExpressionWrapper[Any]:
    """The database's now, less :data:`LAPSED`: a lease any claim takes over."""
    return database_ago(LAPSED)


class StepClaim(DatabaseClaim):
    """A claim of a view with steps: the ``db`` claim (row ``pk`` under ``token``), plus
    the steps found at the claim (:attr:`done`) and what records the next ones."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The steps done, in order, as the row holds them (loaded at the claim).
        self.done: list[dict[str, Any]] = []
        #: The other members of the row's ``steps``, written back as they were loaded
        #: (``StepState.kept``), with ``keep``'s added by the next record.
        self.kept: dict[str, Any] = {}

    def record(
        self, done: list[dict[str, Any]], point: str | None, keep: dict[str, Any] | None = None
    ) -> None:
        """Write ``done``, the recovery point ``point`` and the kept members (with
        ``keep``'s) in the current transaction, the step's last statement, only while the
        claim is this one's (and the lease with it): ``LeaseLost`` otherwise, and the step's
        transaction rolls back."""
        a = self.attempt
        kept = {**self.kept, **(keep or {})}
        renewed: dict[str, Any] = {"locked_at": DatabaseNow()}
        if conf.PARTITION_INTERVAL is not None:
            # As a renewal keeps it on a partitioned table (store.sql.partitioned.renew): a
            # key in progress with steps is never in a partition the purge drops.
            renewed["expires_at"] = Greatest(
                F("expires_at"), database_ago(-datetime.timedelta(seconds=a.lock_timeout))
            )
        try:
            count = (
                IdempotencyKey.objects.using(a.database)
                .filter(pk=self.pk, claim_token=self.token, status=IN_PROGRESS)
                .update(
                    recovery_point=point,
                    steps={**kept, "fingerprint": a.fingerprint, "done": done},
                    **renewed,
                )
            )
        except DatabaseError as exc:
            raise StoreUnavailable() from exc
        if count != 1:
            raise LeaseLost()
        self.done, self.kept = done, kept

    def found(self, state: StepState) -> None:
        """Take the steps ``state`` holds as this claim's (a resumed key's)."""
        self.done, self.kept = state.done, state.kept

    def first_claimed_within(self, seconds: float) -> bool:
        """Whether the key was first claimed (its row's ``created_at``, which takeovers
        keep) less than ``seconds`` ago, by the database's clock."""
        a = self.attempt
        since = database_ago(datetime.timedelta(seconds=seconds))
        try:
            return (
                IdempotencyKey.objects.using(a.database)
                .filter(pk=self.pk, created_at__gt=since)
                .exists()
            )
        except DatabaseError as exc:
            raise StoreUnavailable() from exc

    def release(self) -> bool:
        """Give the key back: deleted when nothing committed; else (a step, the request the
        completer keeps, or the mark of a remote call, which may have taken effect) kept for
        the retry or the completer to resume, under a token no one holds and a lease that
        has lapsed."""
        if not self.done and not self.kept:
            return super().release()
        return self.hand_back()

    def hand_back(self, **restore: Any) -> bool:
        """Keep the row in progress for the next claim (with ``restore``'s columns), but no
        longer this claim's; whether it still was."""
        a = self.attempt
        try:
            count = (
                IdempotencyKey.objects.using(a.database)
                .filter(pk=self.pk, claim_token=self.token, status=IN_PROGRESS)
                .update(claim_token=uuid.uuid4(), locked_at=_lapsed(), **restore)
            )
        except DatabaseError:
            logger.exception(
                "could not give back idempotency key %s (scope %s); a retry takes it over "
                "once its lease has lapsed",
                a.key,
                a.scope,
            )
            return False
        return bool(count)


class SteppedDatabaseStrategy(DatabaseStrategy):
    """The ``db`` strategy for a view with steps."""

    name = "db"
    claim_class = StepClaim

    def claim(self, attempt: Attempt) -> Outcome:
        outcome = super().claim(attempt)
        if not isinstance(outcome, StepClaim):
            return outcome
        return resumed(outcome)


def resumed(claim: StepClaim) -> Outcome:
    """``claim`` with the steps its row holds when it took the row over (a fresh row holds
    none), or ``Mismatch`` when they are another request's: the row is then handed back as
    it was found. A row whose steps could not be read is handed back too, never deleted
    with them (``StoreUnavailable``)."""
    if not claim.taken_over:
        return claim
    attempt = claim.attempt
    try:
        state = load_state(attempt, claim.pk)
    except DatabaseError as exc:
        claim.hand_back()
        raise StoreUnavailable() from exc
    if state is None:
        return claim
    claim.found(state)
    if state.fingerprint != attempt.fingerprint:
        # Taken over from a crashed request with other content: not this one's to resume.
        claim.hand_back(fingerprint=state.fingerprint)
        return Mismatch()
    return claim


class AdvisoryStepClaim(StepClaim):
    """A claim of ``advisory_lock`` for a view with steps: a row under a token, and the
    key's session-level advisory lock, given back when the claim ends. The session lock
    keeps duplicates out; the row's lease is renewed as ``db``'s is all the same, because
    the purge and the completer read it: a step that outlasts ``LOCK_TIMEOUT`` once the
    key's ``TTL`` is over must not see its key purged under it."""

    def renew(self) -> bool:
        """The lease renewed; nothing to renew while a new claim's row has not committed
        (it commits with the first step: no other connection sees it before, and the key's
        locks keep duplicates out)."""
        if not (self.taken_over or self.done or self.kept):
            return True
        return super().renew()

    def _unlock(self) -> None:
        a = self.attempt
        try:
            with connections[a.database].cursor() as cursor:
                cursor.execute(SESSION_UNLOCK_SQL, [lock_name(a.scope, a.key)])
        except DatabaseError:
            # The connection is gone, and its locks with it.
            logger.warning("could not unlock idempotency key %s", a.key, exc_info=True)

    def after_commit(self) -> None:
        self._unlock()
        super().after_commit()

    def release(self) -> bool:
        try:
            return super().release()
        finally:
            self._unlock()

    def lost(self) -> None:
        self._unlock()


class SteppedAdvisoryStrategy(AdvisoryLockStrategy):
    """The ``advisory_lock`` strategy for a view with steps (PostgreSQL)."""

    name = "advisory_lock"

    def claim(self, attempt: Attempt) -> Outcome:
        busy = self.lock(attempt)
        if busy is not None:
            return busy
        try:
            return self._claim_locked(attempt)
        except DatabaseError as exc:
            raise StoreUnavailable() from exc

    def _claim_locked(self, attempt: Attempt) -> Outcome:
        """Under the key's transaction lock: claim a new row, resume a gone owner's, or
        answer as the row says."""
        manager = IdempotencyKey.objects.using(attempt.database)
        row = manager.read(attempt.scope, attempt.key, live=True)
        if row is not None and row.fingerprint != attempt.fingerprint:
            return Mismatch()
        if row is not None and row.status == COMPLETED:
            return Replay(row.stored_response())
        if row is None:
            result = manager.claim(
                attempt.scope,
                attempt.key,
                attempt.fingerprint,
                ttl=attempt.ttl,
                lock_timeout=attempt.lock_timeout,
                method=attempt.method,
                path=attempt.path,
            )
            if result.state is ClaimState.MISMATCH:
                return Mismatch()
            if result.pk is None or result.token is None:
                return InProgress()
            # A row the live read did not see (its TTL over) is taken over with its steps.
            claim = AdvisoryStepClaim(self, attempt, result.pk, result.token, result.taken_over)
            found = resumed(claim)
            if not isinstance(found, StepClaim):
                return found
        else:
            # In progress while its lock is free: its owner is gone (an owner holds the
            # session lock until its last commit). Resume it, if it ran in steps.
            state = load_state(attempt, row.pk)
            if state is None or row.claim_token is None:
                return InProgress()
            token = uuid.uuid4()
            taken = manager.filter(
                pk=row.pk, claim_token=row.claim_token, status=IN_PROGRESS
            ).update(claim_token=token, locked_at=DatabaseNow())
            if taken != 1:
                return InProgress()
            claim = AdvisoryStepClaim(self, attempt, row.pk, token, True)
            claim.found(state)
        with connections[attempt.database].cursor() as cursor:
            cursor.execute(SESSION_LOCK_SQL, [lock_name(attempt.scope, attempt.key)])
        return claim


_STEPPED: dict[str, Strategy] = {}


def stepped(strategy: Strategy) -> Strategy | None:
    """The strategy that runs a view with steps in place of ``strategy`` (by its name),
    or None when there is none."""
    if isinstance(strategy, SteppedDatabaseStrategy | SteppedAdvisoryStrategy):
        return strategy
    # The built-in classes themselves: a subclass (``hybrid``'s fallback, a project's) may
    # claim elsewhere than the row the steps are recorded on.
    cls = {DatabaseStrategy: SteppedDatabaseStrategy, AdvisoryLockStrategy: SteppedAdvisoryStrategy}
    found = cls.get(type(strategy))
    if found is None:
        return None
    return _STEPPED.setdefault(found.name, found())


def steps_strategy(strategy: Strategy) -> Strategy:
    """The strategy that runs a view with steps in place of ``strategy``;
    ``StoreUnavailable`` (a 503, logged) under one that cannot (a view's own strategy is
    refused when it is declared, check E090; this is the ``STRATEGY`` setting's)."""
    found = stepped(strategy)
    if found is not None:
        return found
    logger.error(
        "a view declared with steps=True runs under the strategy %r, which does not run "
        "steps (%s do); refused with a 503 (see docs/steps.md)",
        strategy.name,
        ", ".join(STEP_STRATEGIES),
    )
    raise StoreUnavailable(STEPS_UNSUPPORTED)
