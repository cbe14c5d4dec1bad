"""The ``hybrid`` strategy: Redis on the hot path, PostgreSQL authoritative (imports ``redis``).

::

    request -> Redis SET NX PX lease
      taken     -> in progress: 409 | completed: replay from Redis | other request: 422
      new       -> HYBRID_DB_CHECK: look the key up in IdempotencyKey and the outbox
                   found     -> refill Redis, replay (or 422, or 409 while a db claim runs)
                   not found -> run the view in transaction.atomic; complete() inserts the
                                outbox row in that transaction; after the commit, Redis gets
                                the completed record (token compare-and-set) and a drain task
                                is queued

The request path writes no row of its own to the database: the outbox row is one
more statement of the view's transaction, so a request costs exactly the commits
the view already makes. The Celery task ``drain_outbox`` moves outbox rows into
IdempotencyKey later, a thousand per transaction.

Two commits for one key cannot both succeed. The outbox has a unique constraint on
(scope, key), so a second insert waits for the first transaction and then finds
its row; and ``complete()`` reads IdempotencyKey in the same transaction, so a key
that was drained already, or is held by a ``db`` claim (see below), fails too.
Either way the loser raises ``LeaseLost``: its transaction rolls back, Redis is
refilled from the committed record, and the client's retry is replayed.

``HYBRID_DB_CHECK``

* ``"always"`` (default): every key that is new in Redis costs one indexed read
  (two when the outbox has no row for it) inside the view's transaction, before
  the view runs. A key whose Redis record was lost - a restart without
  persistence, ``FLUSHALL``, a failover to a replica that had not received it, an
  eviction - is found in the database and replayed; the view never runs twice.
* ``"after_loss"``: the read happens only while a loss is suspected. Each Redis
  server holds a marker key, ``<prefix>:{hybrid}:epoch``, with the ``run_id`` of
  the server that wrote it and the time it was written. A key that is new in
  Redis is checked in the database when the marker is missing (flush, restart
  without persistence, eviction of the marker), when its ``run_id`` is not the
  server's current one (a restart or a failover: the last writes before it may be
  gone, whatever the persistence settings), and for TTL seconds after the marker
  was (re)written (records lost then would still be replayed otherwise). A loss
  that removes records but leaves the marker and the server process in place is
  not detected: an eviction under an ``allkeys-*`` or ``volatile-*`` policy (the
  marker has no TTL, the records do), or a ``DEL`` by hand. Use ``maxmemory-policy
  noeviction``. Even then a second commit is refused by the outbox and
  IdempotencyKey check above; what the mode risks is running the view's code a
  second time (an outside call it makes, such as a payment provider, is then
  protected only by the downstream key). On a Redis Cluster each node can lose
  data on its own, so ``after_loss`` checks every new key there, as ``always``.

Redis unreachable: with ``REDIS_FAILURE_MODE = "db"`` the request is handled by the
``db`` strategy (the claim, the view and the completion in the database; the
completion also inserts the outbox row, so that a hybrid commit of the same key
and this one exclude each other through its unique constraint); with
``"fail_closed"`` the answer is 503 (``StoreUnavailable``). A key that a ``db``
claim holds is left to the ``db`` strategy by later hybrid requests too: they
answer 409 while it runs, and take it over through the ``db`` strategy when its
lease went stale.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial

from django.db import DatabaseError, connections, transaction
from redis.cluster import RedisCluster

from ..conf import conf
from ..errors import LeaseLost, StoreUnavailable
from ..managers import KeyRecord
from ..models import IdempotencyKey, IdempotencyOutbox
from ..redis_store import (
    REDIS_ERRORS,
    RedisRecord,
    RedisStore,
    RedisUnavailable,
    get_store,
    to_ms,
)
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
from .db import DatabaseClaim, DatabaseStrategy

logger = logging.getLogger("django_idempotency")

EPOCH_SUFFIX = ":{hybrid}:epoch"
_MARKER_ERRORS: tuple[type[BaseException], ...] = (*REDIS_ERRORS, ValueError, KeyError, TypeError)


# -- the fallback: the db strategy, completing into the outbox too ---------------------------


@contextmanager
def outbox_write(attempt: Attempt, response: StoredResponse) -> Iterator[None]:
    """Insert the key's outbox row, then run the block, in the view's transaction when
    there is one. A row another transaction committed first is a lost claim
    (``LeaseLost``); a database failure is a 503 with the view's writes rolled back."""
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
                using=using,
            )
            if not added:
                raise LeaseLost()  # another transaction committed this key first
            yield
    except DatabaseError as exc:
        raise StoreUnavailable(
            "The response could not be stored, so this request's changes were rolled back. "
            "Retry with the same Idempotency-Key."
        ) from exc


class OutboxDatabaseClaim(DatabaseClaim):
    """A ``db`` claim whose completion also inserts the outbox row, in the same transaction.

    Its unique constraint makes this commit and a hybrid commit of the same key
    (from a process that still reaches Redis) exclude each other.
    """

    strategy: HybridStrategy | None = None

    def _store(self, response: StoredResponse) -> None:
        with outbox_write(self.attempt, response):
            super()._store(response)
            if self.strategy is not None:
                transaction.on_commit(self.strategy.request_drain, using=self.attempt.database)


class OutboxDatabaseStrategy(DatabaseStrategy):
    """The ``db`` strategy as the hybrid strategy's fallback."""

    name = "db"
    claim_class = OutboxDatabaseClaim

    def __init__(self, parent: HybridStrategy) -> None:
        self.parent = parent

    def reads_outbox(self) -> bool:
        return True

    def claim(self, attempt: Attempt) -> Outcome:
        outcome = super().claim(attempt)
        if isinstance(outcome, OutboxDatabaseClaim):
            outcome.strategy = self.parent
        return outcome


# -- the Redis claim -------------------------------------------------------------------------


class HybridClaim(TransactionalClaim):
    """This request holds the key in Redis; the view runs in the database transaction
    that ``complete()`` adds the outbox row to."""

    def __init__(
        self, strategy: HybridStrategy, store: RedisStore, attempt: Attempt, token: str
    ) -> None:
        super().__init__(attempt)
        self.strategy = strategy
        self.store = store
        self.token = token

    def renew(self) -> bool:
        attempt = self.attempt
        return self.store.renew(attempt.scope, attempt.key, self.token, to_ms(attempt.lock_timeout))

    def _store(self, response: StoredResponse) -> None:
        """Insert the outbox row (in the view's transaction when there is one) and
        arrange for Redis and the drain after the commit."""
        with outbox_write(self.attempt, response):
            self._check_key_row()
            transaction.on_commit(partial(self.publish, response), using=self.attempt.database)

    def _check_key_row(self) -> None:
        """Refuse to commit when IdempotencyKey already has the key: completed (drained
        earlier) or claimed by the ``db`` strategy. A ``db`` claim whose lease went stale
        (on the database's clock) is deleted here, in this transaction, which fences its
        owner out."""
        attempt = self.attempt
        if not IdempotencyKey.objects.fence_stale_claim(
            attempt.scope, attempt.key, attempt.lock_timeout, using=attempt.database
        ):
            raise LeaseLost()

    def publish(self, response: StoredResponse) -> None:
        """After the commit: the completed record into Redis, and a drain queued."""
        attempt = self.attempt
        ttl_ms = to_ms(attempt.ttl)
        try:
            if not self.store.complete(attempt.scope, attempt.key, self.token, response, ttl_ms):
                # Our lease expired or Redis lost the claim: the commit is what counts.
                self.store.put_completed(
                    attempt.scope,
                    attempt.key,
                    attempt.fingerprint,
                    response,
                    ttl_ms,
                    token=self.token,
                )
        except RedisUnavailable:
            logger.warning(
                "idempotency key %s (scope %s) committed, but Redis could not be updated; "
                "it will be refilled from the database",
                attempt.key,
                attempt.scope,
                exc_info=True,
            )
        self.strategy.request_drain()

    def delete(self) -> bool:
        """Delete our Redis claim (compare-and-delete on the token)."""
        try:
            return self.store.release(self.attempt.scope, self.attempt.key, self.token)
        except RedisUnavailable:
            logger.warning(
                "could not release idempotency key %s in Redis; its lease will expire",
                self.attempt.key,
                exc_info=True,
            )
            return False


# -- the strategy ----------------------------------------------------------------------------


class HybridStrategy(Strategy):
    name = "hybrid"

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

    # -- session --------------------------------------------------------------------------

    @contextmanager
    def session(self, attempt: Attempt) -> Iterator[Outcome]:
        token = uuid.uuid4().hex
        try:
            store = get_store()
            first = self._claim(store, attempt, token)
            check_db = isinstance(first, HybridClaim) and self._must_check_db(store, attempt)
        except RedisUnavailable as exc:
            first = None
            failure: RedisUnavailable | None = exc
        else:
            failure = None
        if failure is not None:
            with self._unavailable(attempt, failure) as outcome:
                yield outcome
            return
        if not isinstance(first, HybridClaim):
            assert first is not None
            yield first
            return
        with self._run(store, attempt, first, check_db) as outcome:
            yield outcome

    def _claim(self, store: RedisStore, attempt: Attempt, token: str) -> Outcome:
        lease_ms = to_ms(attempt.lock_timeout)
        for _attempt in range(3):
            claimed, record = store.claim(
                attempt.scope, attempt.key, attempt.fingerprint, token, lease_ms
            )
            if claimed:
                return HybridClaim(self, store, attempt, token)
            if record is not None:
                return self._from_redis(record, attempt)
        return InFlight()

    @staticmethod
    def _from_redis(record: RedisRecord, attempt: Attempt) -> Outcome:
        if record.fingerprint != attempt.fingerprint:
            return Mismatch()
        if record.completed and record.response is not None:
            return Replay(record.response)
        return InFlight()

    @contextmanager
    def _run(
        self, store: RedisStore, attempt: Attempt, claim: HybridClaim, check_db: bool
    ) -> Iterator[Outcome]:
        using = attempt.database
        found: KeyRecord | None = None
        atomic: AbstractContextManager[object] = (
            transaction.atomic(using=using) if attempt.atomic else nullcontext()
        )
        # On PostgreSQL the lookup is the first statement of the view's transaction (no
        # commit of its own). On SQLite it runs before: there a read fixes the
        # transaction's snapshot, and the view's first write would then fail at once
        # ("database is locked") whenever another connection committed in between.
        in_transaction = attempt.atomic and connections[using].vendor == "postgresql"
        try:
            if check_db and not in_transaction:
                found = self._lookup(attempt)
            if found is None:
                with atomic:
                    if check_db and in_transaction:
                        found = self._lookup(attempt)
                    if found is None:
                        claim.in_transaction = attempt.atomic
                        try:
                            yield claim
                        finally:
                            claim.in_transaction = False
                    else:
                        transaction.set_rollback(True, using=using)  # nothing was written
                if found is None and not claim.released and claim.pending is not None:
                    claim._store(claim.pending)
        except LeaseLost:
            self._after_lease_lost(store, attempt, claim)
            raise
        except BaseException:
            claim.delete()
            raise
        if found is not None:
            with self._settle(store, attempt, claim, found) as outcome:
                yield outcome
            return
        if claim.released:
            claim.delete()

    def _lookup(self, attempt: Attempt) -> KeyRecord | None:
        try:
            return IdempotencyOutbox.objects.lookup(
                attempt.scope, attempt.key, using=attempt.database
            )
        except DatabaseError as exc:
            raise StoreUnavailable() from exc

    @contextmanager
    def _settle(
        self, store: RedisStore, attempt: Attempt, claim: HybridClaim, found: KeyRecord
    ) -> Iterator[Outcome]:
        """The database knew the key that Redis did not: replay (refilling Redis), or
        leave a key that a ``db`` claim holds to the ``db`` strategy."""
        if found.completed and found.response is not None:
            self.refill(store, attempt, found, token=claim.token)
            logger.info(
                "idempotency key %s (scope %s) was missing in Redis; replayed from the %s",
                attempt.key,
                attempt.scope,
                "outbox" if found.source == "outbox" else "database",
            )
            if found.fingerprint != attempt.fingerprint:
                yield Mismatch()
            else:
                yield Replay(found.response)
            return
        claim.delete()
        with self.fallback.session(attempt) as outcome:
            yield outcome

    def refill(
        self, store: RedisStore, attempt: Attempt, found: KeyRecord, *, token: str = ""
    ) -> None:
        """Put a completed database record back into Redis (errors are logged)."""
        assert found.response is not None
        try:
            store.put_completed(
                attempt.scope,
                attempt.key,
                found.fingerprint,
                found.response,
                to_ms(found.ttl_seconds()),
                token=token,
            )
        except RedisUnavailable:
            logger.warning("could not refill Redis for key %s", attempt.key, exc_info=True)

    def _after_lease_lost(self, store: RedisStore, attempt: Attempt, claim: HybridClaim) -> None:
        """Our commit was refused: Redis gets the record that won, or loses our claim."""
        try:
            found = self._lookup(attempt)
        except StoreUnavailable:
            found = None
        if found is not None and found.completed and found.response is not None:
            self.refill(store, attempt, found, token=claim.token)
        else:
            claim.delete()

    # -- HYBRID_DB_CHECK ------------------------------------------------------------------

    def _must_check_db(self, store: RedisStore, attempt: Attempt) -> bool:
        if conf.HYBRID_DB_CHECK != "after_loss":
            return True
        return self.loss_suspected(store, attempt.ttl)

    def loss_suspected(self, store: RedisStore, ttl: float) -> bool:
        """Whether Redis may have lost records in the last ``ttl`` seconds (see the module
        doc); True whenever that cannot be told."""
        client = store.client
        if isinstance(client, RedisCluster):
            return True
        marker = store.prefix + EPOCH_SUFFIX
        try:
            pipe = client.pipeline(transaction=False)
            pipe.get(marker)
            pipe.info("server")
            raw, info = pipe.execute()
            run_id = str(info["run_id"])
            epoch = json.loads(raw) if raw else None
            now = time.time()
            if not isinstance(epoch, dict) or epoch.get("run_id") != run_id:
                client.set(marker, json.dumps({"run_id": run_id, "since": now}))
                logger.warning(
                    "Redis may have lost idempotency records (%s); new keys are checked "
                    "in the database for the next %d seconds",
                    "no marker" if epoch is None else "server restarted or failed over",
                    int(ttl),
                )
                return True
            return now < float(epoch["since"]) + ttl
        except _MARKER_ERRORS:
            logger.debug("could not read the Redis loss marker", exc_info=True)
            return True

    # -- Redis down -----------------------------------------------------------------------

    @contextmanager
    def _unavailable(self, attempt: Attempt, exc: RedisUnavailable) -> Iterator[Outcome]:
        if conf.REDIS_FAILURE_MODE == "fail_closed":
            raise StoreUnavailable() from exc
        logger.warning(
            "Redis is unavailable (%s); idempotency key %s handled by the db strategy",
            exc,
            attempt.key,
        )
        with self.fallback.session(attempt) as outcome:
            yield outcome

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

    def describe(self) -> str:
        return f"hybrid (Redis, DB check: {conf.HYBRID_DB_CHECK})"


__all__ = ["HybridClaim", "HybridStrategy", "OutboxDatabaseStrategy"]
