"""The ``hybrid`` strategy: Redis on the hot path, PostgreSQL authoritative (imports ``redis``).

Redis decides who runs the view; the view's transaction inserts the response as an
outbox row (which ``drain_outbox`` moves into IdempotencyKey later), so the database
refuses a second commit of a key and answers for a key Redis lost (``HYBRID_DB_CHECK``).
See docs/hybrid.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connections, transaction

from ..conf import conf
from ..errors import LeaseLost, StoreUnavailable
from ..models import IdempotencyOutbox, IdempotencySuspect
from ..store.databases import key_databases
from ..store.records import KeyRecord
from ..store.sql.deadline import bounded
from ..values.response import StoredResponse
from .base import Attempt, Delegate, InProgress, Mismatch, Outcome, Replay, store_failed
from .db import DatabaseClaim, DatabaseStrategy
from .redis.store import (
    LossCheck,
    RedisRecord,
    RedisStore,
    RedisUnavailable,
    get_store,
    redis_scope,
    to_ms,
)
from .redis.strategy import RedisClaim, RedisStrategy, ours, redis_claim
from .redis.suspects import suspects

logger = logging.getLogger("django_idempotency")

#: Seconds after the user's ACL refused the loss check (``INFO``) before it is tried again;
#: meanwhile every new key is looked up in the database, as with ``"always"``.
LOSS_CHECK_RETRY = 60.0


def redis_ttl(ttl: float) -> float:
    """How long a completed record of a key kept ``ttl`` seconds stays in Redis: at most
    ``HYBRID_REDIS_TTL`` (Redis holds the hot window, the database the whole ``ttl``)."""
    hot = conf.HYBRID_REDIS_TTL
    return ttl if hot is None else min(ttl, hot)


# -- the fallback: the db strategy, completing into the outbox too ---------------------------


@contextmanager
def outbox_write(
    attempt: Attempt, response: StoredResponse, *, fenced: bool, commit: bool = False
) -> Iterator[None]:
    """Insert the key's outbox row, then run the block, in the view's transaction when
    there is one; ``fenced``: only when IdempotencyKey has no live row for the key
    (``add(fence_lock_timeout=...)``). A row another transaction committed first, or a
    live key row, is a lost claim (``LeaseLost``); a database failure is a 503 with the
    view's writes rolled back. ``commit``: the insert also commits the transaction (see
    ``add(commit=True)``); the block then runs after that COMMIT."""
    using = attempt.database
    try:
        with transaction.atomic(using=using, savepoint=False):
            added = IdempotencyOutbox.objects.add(
                attempt.scope,
                attempt.key,
                attempt.fingerprint,
                response,
                ttl=attempt.ttl,
                method=attempt.method,
                path=attempt.path,
                fence_lock_timeout=attempt.lock_timeout if fenced else None,
                commit=commit,
                using=using,
            )
            if not added:
                raise LeaseLost()  # another transaction committed this key first
            yield
    except DatabaseError as exc:
        raise store_failed(exc, committing=commit)  # noqa: B904 - chained there


class OutboxDatabaseClaim(DatabaseClaim):
    """A ``db`` claim whose completion also inserts the outbox row, in the same transaction.

    Its unique constraint makes this commit and a hybrid commit of the same key
    (from a process that still reaches Redis) exclude each other.
    """

    strategy: OutboxDatabaseStrategy
    #: Two statements (the outbox row, then the fenced completion): Django's COMMIT.
    folds_commit = False

    def store(self, response: StoredResponse, *, commit: bool) -> None:
        # The key's row is this claim's own: the completion below is fenced by its token.
        with outbox_write(self.attempt, response, fenced=False):
            super().store(response, commit=False)

    def after_commit(self) -> None:
        super().after_commit()
        # Committed in PostgreSQL only: Redis's hot path looks the key up there while it lives.
        suspect(self.attempt, self.attempt.ttl)
        self.strategy.parent.request_drain()


class OutboxDatabaseStrategy(DatabaseStrategy):
    """The ``db`` strategy as the hybrid strategy's fallback."""

    name = "db"
    claim_class = OutboxDatabaseClaim

    def __init__(self, parent: HybridStrategy) -> None:
        self.parent = parent


def suspect(attempt: Attempt, seconds: float) -> None:
    """Remember ``attempt``'s key as one Redis has no record of, for ``seconds``: in this
    process, and in a row of the key's database that every process reads (when that row
    cannot be written, this process still knows: logged)."""
    scope = redis_scope(attempt)
    row = None
    try:
        with bounded(connections[attempt.database]):  # DATABASE_TIMEOUT
            row = IdempotencySuspect.objects.note(
                scope, attempt.key, seconds, using=attempt.database
            )
    except DatabaseError:
        drop_if_broken(attempt.database)
        logger.warning(
            "idempotency key %s (scope %s) is handled without Redis, and the database did not "
            "take its note for the other processes",
            attempt.key,
            attempt.scope,
            exc_info=True,
        )
    suspects.add(scope, attempt.key, seconds, row=row)


def drop_if_broken(using: str) -> None:
    """After a failed statement of the suspects' (outside any transaction): a connection
    that is no longer usable (cut by ``DATABASE_TIMEOUT``) is closed, so that the request's
    next statement opens a new one instead of failing on it."""
    connection = connections[using]
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


# -- the Redis claim -------------------------------------------------------------------------


class HybridClaim(RedisClaim):
    """This request holds the key in Redis; the view runs in the database transaction
    that ``complete()`` adds the outbox row to. Redis gets the completed record only
    after COMMIT (``after_commit``)."""

    folds_commit = True  # on PostgreSQL: the fenced outbox insert and COMMIT, one query

    def __init__(
        self, strategy: HybridStrategy, store: RedisStore, attempt: Attempt, token: str
    ) -> None:
        super().__init__(store, attempt, token)
        self.strategy = strategy
        #: Look the key up in the database before the view runs (``HYBRID_DB_CHECK``).
        self.check_db = True
        #: Milliseconds the key's held mark lives past each renewal; None: no mark (the
        #: claim did not write one).
        self.held_ms: int | None = None
        self.response: StoredResponse | None = None

    def renew(self) -> bool:
        """The lease, and the key's held mark with it (a claim that finds the mark after the
        lease lapsed looks the key up in the database)."""
        a = self.attempt
        return self.redis.renew(
            redis_scope(a), a.key, self.token, to_ms(a.lock_timeout), held_ms=self.held_ms
        )

    def settled(self) -> Outcome | None:
        """A key that Redis did not know but the database does: replay it (refilling
        Redis), or leave a key that a ``db`` claim holds to the ``db`` strategy."""
        if not self.check_db:
            return None
        found = self.strategy.lookup(self.attempt)
        if found is None:
            return None
        return self.strategy.settle(self.redis, self.attempt, found, token=self.token)

    def store(self, response: StoredResponse, *, commit: bool) -> None:
        """Insert the outbox row in the view's transaction (Redis follows the commit),
        refused when IdempotencyKey already has the key: completed (drained earlier) or
        claimed by the ``db`` strategy. A ``db`` claim whose lease went stale (on the
        database's clock) is deleted in this transaction, which fences its owner out."""
        with outbox_write(self.attempt, response, fenced=True, commit=commit):
            pass
        self.response = response

    def after_commit(self) -> None:
        if self.response is not None:
            self.publish(self.response)

    def publish(self, response: StoredResponse) -> None:
        """After the commit: the completed record into Redis, and a drain queued."""
        attempt = self.attempt
        try:
            # One SET, no compare-and-set: the commit decided that this request's response
            # is the key's, whoever holds the key in Redis now (a claim made after our lease
            # expired cannot commit: the outbox refuses it, and it refills Redis from there).
            self.redis.put_completed(
                redis_scope(attempt),
                attempt.key,
                attempt.fingerprint,
                response,
                to_ms(redis_ttl(attempt.ttl)),
                token=self.token,
            )
        except RedisUnavailable:
            self.redis.verify_due = True
            suspect(attempt, attempt.ttl)
            logger.warning(
                "idempotency key %s (scope %s) committed, but Redis could not be updated; "
                "it will be refilled from the database",
                attempt.key,
                attempt.scope,
                exc_info=True,
            )
        if attempt.wait > 0:
            self.wake()
        self.strategy.request_drain()

    def discard(self) -> None:
        # Redis holds only the in-progress claim until the commit: give it back.
        self.release()

    def lost(self) -> None:
        """Our commit was refused: Redis gets the record that won, or loses our claim."""
        attempt = self.attempt
        try:
            found = self.strategy.lookup(attempt)
        except StoreUnavailable:
            found = None
        if found is not None and found.completed and found.response is not None:
            self.strategy.refill(self.redis, attempt, found, token=self.token)
        else:
            self.release()


# -- the strategy ----------------------------------------------------------------------------


class HybridStrategy(RedisStrategy):
    """Redis on the hot path, PostgreSQL authoritative; see docs/hybrid.md."""

    name = "hybrid"
    uses_outbox = True

    #: Seconds between a commit and the drain it queues; commits in between share it.
    drain_delay: float = 1.0
    #: That drain leaves a short last batch younger than this many seconds for a
    #: follow-up run, so that under load each drain transaction moves a full batch.
    drain_hold: float = 10.0
    #: Queue ``drain_outbox`` after commits (when Celery is installed and configured).
    queue_drain: bool = True

    def __init__(self) -> None:
        self.fallback = OutboxDatabaseStrategy(self)
        self._drain_lock = threading.Lock()
        self._drain_due = 0.0

    # -- claim ----------------------------------------------------------------------------

    def claim(self, attempt: Attempt) -> Outcome:
        store = None
        try:
            store = get_store()
            outcome, record = self._claim(store, attempt, self._marker_applies(store, attempt))
            if (
                isinstance(outcome, Mismatch)
                and record is not None
                and not record.completed
                and self._must_check_db(store, attempt)
            ):
                # Redis holds another request's claim, perhaps a reuse of a key whose
                # completed record Redis lost: the database's record wins over it.
                return self._beneath_foreign_claim(attempt)
        except RedisUnavailable as exc:
            if store is not None:
                store.verify_due = True  # a restart or a failover may be why
            return self.unavailable(attempt, exc)
        if suspects.pending:
            # Redis answers: the marks of the keys handled without it go there now, so that
            # every process's claims of those keys look them up in PostgreSQL.
            self.mark_suspects(store)
        self.reached_redis()
        return outcome

    def _claim(
        self, store: RedisStore, attempt: Attempt, with_marker: bool
    ) -> tuple[Outcome, RedisRecord | None]:
        """The Redis claim; ``with_marker``: and the loss check, in one script."""
        checks: list[LossCheck] = []
        claim = None
        held_ms = self._held_ms(attempt)
        if with_marker:

            def claim(
                scope: str, key: str, fingerprint: str, token: str, lease: int
            ) -> tuple[bool, RedisRecord | None]:
                won, record, check = store.claim_checking_loss(
                    scope,
                    key,
                    fingerprint,
                    token,
                    lease,
                    loss_keys=store.loss_keys_for(scope, key),
                    window_ms=self._window_ms(attempt.ttl),
                    interval_ms=to_ms(self._interval(store)),
                    held_ms=held_ms,
                )
                if record is not None and ours(record, token):
                    # Our own claim, applied by a send whose reply never came: its loss
                    # check's verdict was lost with it, so the database is asked.
                    check = LossCheck(1)
                checks[:] = [check]
                return won, record

        outcome, record = redis_claim(
            store, attempt, lambda token: HybridClaim(self, store, attempt, token), claim
        )
        if isinstance(outcome, HybridClaim):
            if suspects.read_due():
                # A key new in Redis, whose view writes in the database anyway: a replay or a
                # 409 from Redis never waits on the database for this read.
                self.read_suspects()
            if suspects.holds(redis_scope(attempt), attempt.key):
                outcome.check_db = True
            elif claim is None:
                outcome.check_db = self._must_check_db(store, attempt)
            else:
                outcome.check_db = self._loss_reported(store, checks[-1], attempt.ttl, attempt)
            if claim is not None:
                outcome.held_ms = held_ms
        return outcome, record

    def _beneath_foreign_claim(self, attempt: Attempt) -> Outcome:
        found = self.lookup(attempt)
        if found is None or found.fingerprint != attempt.fingerprint:
            return Mismatch()
        if found.completed and found.response is not None:
            return Replay(found.response)
        return InProgress()

    def lookup(self, attempt: Attempt) -> KeyRecord | None:
        """The key's live record in the outbox or IdempotencyKey (one statement)."""
        try:
            return IdempotencyOutbox.objects.lookup(
                attempt.scope, attempt.key, using=attempt.database
            )
        except DatabaseError as exc:
            raise StoreUnavailable() from exc

    def settle(
        self, store: RedisStore, attempt: Attempt, found: KeyRecord, *, token: str
    ) -> Outcome:
        """What a record that the database has and Redis had not means for ``attempt``."""
        if found.completed and found.response is not None:
            self.refill(store, attempt, found, token=token)
            logger.info(
                "idempotency key %s (scope %s) was missing in Redis; replayed from the %s",
                attempt.key,
                attempt.scope,
                "outbox" if found.source == "outbox" else "database",
            )
            if found.fingerprint != attempt.fingerprint:
                return Mismatch()
            return Replay(found.response)
        # A ``db`` claim (made while Redis was down) holds the key: the ``db`` strategy
        # answers 409 while it runs and takes it over once its lease is stale.
        return Delegate(self.fallback)

    def refill(
        self, store: RedisStore, attempt: Attempt, found: KeyRecord, *, token: str = ""
    ) -> None:
        """Put a completed database record back into Redis (errors are logged)."""
        assert found.response is not None
        try:
            store.put_completed(
                redis_scope(attempt),
                attempt.key,
                found.fingerprint,
                found.response,
                to_ms(redis_ttl(found.ttl_seconds())),
                token=token,
            )
        except RedisUnavailable:
            logger.warning("could not refill Redis for key %s", attempt.key, exc_info=True)

    # -- HYBRID_DB_CHECK ------------------------------------------------------------------

    #: Seconds between two comparisons of a server's loss marker with its ``INFO`` (run id,
    #: eviction count), per server, whatever the number of clients: a restart or a
    #: failover is also seen at once (the server must load the claim script again), a
    #: flush at once (the marker is gone); an eviction within this interval.
    loss_check_interval: float = 0.01
    #: The same on a Redis Cluster, where each hash slot has its loss keys (the claim's
    #: script may touch one slot only), so per slot: at most 16 384 comparisons per interval
    #: over the cluster. Shorter than ``cluster-node-timeout`` (15 s by default), so that a
    #: replica is never promoted before its slots' ``checked`` keys expired.
    cluster_loss_check_interval: float = 5.0

    def _interval(self, store: RedisStore) -> float:
        return self.cluster_loss_check_interval if store.cluster else self.loss_check_interval

    @staticmethod
    def _marker_applies(store: RedisStore, attempt: Attempt) -> bool:
        """``"after_loss"`` with records that live as long as their keys (with a shorter
        ``HYBRID_REDIS_TTL`` a key new in Redis may be one it let expire), unless the user's
        ACL refused the loss check in the last ``LOSS_CHECK_RETRY`` seconds."""
        if conf.HYBRID_DB_CHECK != "after_loss":
            return False
        if redis_ttl(attempt.ttl) < attempt.ttl:
            return False
        refused = store.loss_check_refused_at
        return refused is None or time.monotonic() - refused >= LOSS_CHECK_RETRY

    def _held_ms(self, attempt: Attempt) -> int:
        """How long a claim's held mark lives past the claim and each renewal: while the
        owner may commit (its lease, and as much again for a stalled heartbeat) and its
        completion may live (the records' Redis TTL)."""
        return 2 * to_ms(attempt.lock_timeout) + self._window_ms(attempt.ttl)

    @staticmethod
    def _window_ms(ttl: float) -> int:
        """How long after a loss new keys are looked up: as long as a lost record would
        have stayed in Redis (a key kept ``ttl`` seconds, or ``TTL``, whichever is longer)."""
        return to_ms(max(redis_ttl(ttl), redis_ttl(conf.TTL)))

    def _must_check_db(self, store: RedisStore, attempt: Attempt) -> bool:
        if not self._marker_applies(store, attempt):
            return True
        return self.loss_suspected(store, attempt.ttl, attempt)

    def loss_suspected(self, store: RedisStore, ttl: float, attempt: Attempt | None = None) -> bool:
        """Whether a key kept ``ttl`` seconds that is new in Redis must be looked up in the
        database: Redis may have lost records (the loss check, see docs/hybrid.md; on a
        Cluster that of ``attempt``'s slot); True whenever that cannot be told."""
        if attempt is None and store.cluster:
            return True
        keys = (
            store.loss_keys()
            if attempt is None
            else store.loss_keys_for(redis_scope(attempt), attempt.key)
        )
        try:
            check = store.loss_suspected(keys, self._window_ms(ttl), to_ms(self._interval(store)))
        except RedisUnavailable:
            logger.debug("could not read the Redis loss marker", exc_info=True)
            return True
        return self._loss_reported(store, check, ttl, attempt)

    def _loss_reported(
        self, store: RedisStore, check: LossCheck, ttl: float, attempt: Attempt | None = None
    ) -> bool:
        if check.refused:
            self._loss_check_refused(store, check.reason)
        elif check.verdict < 0:
            logger.warning("the Redis loss check failed: %s", check.reason)
        elif check.verdict == 3 and attempt is not None:
            logger.info(
                "idempotency key %s (scope %s) was taken over in Redis from a lapsed lease; "
                "looked up in the database",
                attempt.key,
                attempt.scope,
            )
        elif check.verdict == 2:
            # Once a minute per store: on a Cluster each slot sees the same loss at its own
            # first claim after it.
            now = time.monotonic()
            warned = store.loss_reported_at
            level = logging.WARNING if warned is None or now - warned >= 60 else logging.DEBUG
            if level == logging.WARNING:
                store.loss_reported_at = now
            logger.log(
                level,
                "Redis may have lost idempotency records (no loss marker, or the server "
                "restarted, failed over or evicted keys); new keys are checked in the "
                "database for the next %d seconds",
                self._window_ms(ttl) // 1000,
            )
        return check.verdict != 0

    @staticmethod
    def _loss_check_refused(store: RedisStore, reason: str) -> None:
        """Logged at ERROR the first time per store: correct, but one read more per key."""
        first = store.loss_check_refused_at is None
        store.loss_check_refused_at = time.monotonic()
        if first:
            logger.error(
                "The Redis user may not run INFO or MGET (%s), which the hybrid strategy's "
                "loss check needs (HYBRID_DB_CHECK = 'after_loss'): every new key is looked "
                "up in the database, as with 'always'. Grant +info and +mget (docs/redis.md, "
                "'Redis ACL') or set HYBRID_DB_CHECK to 'always'; tried again every %d "
                "seconds.",
                reason,
                int(LOSS_CHECK_RETRY),
            )

    # -- Redis down -----------------------------------------------------------------------

    def unavailable(self, attempt: Attempt, exc: RedisUnavailable) -> Outcome:
        """As the ``redis`` strategy; a key handed to the ``db`` strategy is remembered
        (``suspects``) for as long as its claim and record may live."""
        outcome = super().unavailable(attempt, exc)
        suspect(attempt, attempt.ttl + attempt.lock_timeout)
        return outcome

    @staticmethod
    def read_suspects() -> None:
        """Learn the keys that any process handled in the database alone (their rows in
        every key database); a database that does not answer is read again next time."""
        for using in key_databases():
            try:
                with bounded(connections[using]):  # DATABASE_TIMEOUT
                    live = IdempotencySuspect.objects.live(using=using)
            except DatabaseError:
                logger.debug("could not read the suspect keys of %s", using, exc_info=True)
                drop_if_broken(using)
                continue
            for found in live:
                suspects.add(found.scope, found.key, found.seconds, row=found.row)

    @staticmethod
    def mark_suspects(store: RedisStore) -> None:
        """The marks of the keys this process knows Redis has no record of go to Redis,
        and the rows they cover are deleted (a row left is read and marked again)."""
        if not suspects.flush(store):
            return
        rows = suspects.settled()
        if not rows:
            return
        try:
            IdempotencySuspect.objects.settle(rows)
        except DatabaseError:
            logger.debug("could not delete the marked suspect keys", exc_info=True)
            for using in {row.database for row in rows}:
                drop_if_broken(using)

    # -- the drain ------------------------------------------------------------------------

    def request_drain(self) -> None:
        """Queue ``drain_outbox`` in ``drain_delay`` seconds unless one is already due;
        never raises (the beat schedule is the backstop)."""
        if not self.queue_drain:
            return
        now = time.monotonic()
        with self._drain_lock:
            if now < self._drain_due:
                return
            self._drain_due = now + self.drain_delay
        try:
            from .. import tasks
        except ImportError:
            return
        try:
            if tasks.celery_configured():
                tasks.send_drain(self.drain_delay, self.drain_hold)
        except Exception:
            logger.warning("could not queue the outbox drain", exc_info=True)


__all__ = ["HybridClaim", "HybridStrategy", "OutboxDatabaseStrategy"]
