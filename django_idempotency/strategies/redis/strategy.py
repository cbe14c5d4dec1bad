"""The ``redis`` strategy: the key lives in Redis, the view's writes in the database.

A claim is one ``SET NX PX`` (see :mod:`django_idempotency.strategies.redis.store`), the response
is stored *prepared* by a compare-and-set on the claim token as the last step before COMMIT
(with the transaction's id), and confirmed once COMMIT has returned; a record found prepared
is settled by the database (:mod:`.prepared`). ``REDIS_FAILURE_MODE`` decides what a request
does while Redis is down. A key is only as
durable as Redis makes it: not for payments. See docs/redis.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from django.db import DatabaseError, connections

from ...conf import conf
from ...errors import LeaseLost, StoreUnavailable
from ...store.errors import retry_after
from ...store.sql import xact
from ...store.status import IN_PROGRESS
from ...values.keys import key_digest
from ...values.response import StoredResponse
from .. import waiting
from ..base import (
    NOT_STORED_DETAIL,
    Attempt,
    Claim,
    Delegate,
    InProgress,
    Mismatch,
    Outcome,
    Replay,
    Strategy,
    store_failed,
)
from ..db import DatabaseStrategy
from .discards import discards
from .health import monitor
from .outcome import RedisOutcomeUnknown, resend_once
from .prepared import settle_prepared
from .store import (
    RedisRecord,
    RedisStore,
    RedisUnavailable,
    get_store,
    new_token,
    redis_scope,
    to_ms,
)

logger = logging.getLogger("django_idempotency")

#: How often a claim is tried again when the holder's record vanished between SET and GET.
CLAIM_ATTEMPTS = 3


class RedisClaim(Claim):
    """A key this request holds in Redis under ``token``."""

    def __init__(self, redis: RedisStore, attempt: Attempt, token: str) -> None:
        super().__init__(attempt)
        self.redis = redis
        self.token = token
        #: Whether the response went to Redis prepared, to be confirmed after COMMIT (the
        #: view ran in a transaction); else it was stored completed.
        self.prepared = False

    def renew(self) -> bool:
        a = self.attempt
        return self.redis.renew(redis_scope(a), a.key, self.token, to_ms(a.lock_timeout))

    def store(self, response: StoredResponse, *, commit: bool) -> None:
        """The response into Redis, as the last step before COMMIT: *prepared*, with the
        id of the view's transaction (one statement more on PostgreSQL), so that a retry
        that finds it before its confirmation asks the database whether it committed
        (:mod:`.prepared`). Without a transaction (the view's writes are durable already),
        or in one that wrote nothing (nothing for its COMMIT to lose), it is stored
        completed."""
        a = self.attempt
        connection = connections[a.database]
        xid = None
        if connection.in_atomic_block:
            try:
                xid = xact.transaction_id(connection)
            except DatabaseError as exc:
                raise store_failed(exc, committing=False) from exc
        self.prepared = connection.in_atomic_block and xid != xact.NOTHING_WRITTEN
        try:
            stored = resend_once(
                lambda: self.redis.complete(
                    redis_scope(a),
                    a.key,
                    self.token,
                    response,
                    to_ms(a.ttl),
                    prepared=self.prepared,
                    xid=xid,
                ),
                "completion",
            )
        except RedisUnavailable as exc:
            raise StoreUnavailable(NOT_STORED_DETAIL) from exc
        if not stored:
            raise LeaseLost()

    def after_commit(self) -> None:
        """COMMIT returned: the prepared record confirmed, and the waiters woken (only now:
        a waiter woken before COMMIT would find the response not yet durable)."""
        if not self.prepared:
            if self.attempt.wait > 0:
                self.wake()
            return
        a = self.attempt
        try:
            resend_once(
                lambda: self.redis.confirm(redis_scope(a), a.key, self.token, notify=a.wait > 0),
                "confirmation",
            )
        except RedisUnavailable:
            # Committed all the same: confirmed before this process's next claim; a retry
            # that finds the record prepared first asks the database (where it can tell).
            discards.add(redis_scope(a), a.key, self.token, a.ttl, confirm=True)
            logger.warning(
                "idempotency key %s (scope %s) committed, but its record in Redis could not "
                "be confirmed yet; it is confirmed before this process's next claim",
                a.key,
                a.scope,
                exc_info=True,
            )
        if a.wait > 0:  # this process's waiters (after the confirmation: they find it)
            waiting.hub.wake(key_digest(a.scope, a.key))

    def commit_unknown(self) -> None:
        """COMMIT was sent and its answer never came (``DATABASE_TIMEOUT``, a connection
        lost): the writes may be durable. The prepared record stays, for a retry to settle
        with the database (:mod:`.prepared`); deleting it would run the view again."""
        if not self.prepared:
            self.discard()
            return
        a = self.attempt
        logger.warning(
            "idempotency key %s (scope %s): the outcome of the view's COMMIT is unknown; "
            "its prepared record in Redis is kept, for a retry to settle with the database",
            a.key,
            a.scope,
            extra={"idempotency_scope": a.scope, "idempotency_key": a.key},
        )

    def wake(self) -> None:
        """Wake the key's waiting duplicates (in every process through Redis); never raises."""
        a = self.attempt
        waiting.hub.wake(key_digest(a.scope, a.key))
        try:
            self.redis.notify(a.scope, a.key)
        except RedisUnavailable:
            logger.warning("could not notify the waiters of key %s", a.key, exc_info=True)

    def release(self) -> bool:
        """Delete this claim's in-progress record, if it is still ours."""
        return self._redis_delete(self.redis.release)

    def discard(self) -> None:
        """The transaction did not commit: delete our record, completed or not; when Redis
        does not answer, before this process's next claim (``discards``)."""
        self._redis_delete(self.redis.discard, remember=True)

    def _redis_delete(
        self, operation: Callable[[str, str, str], bool], *, remember: bool = False
    ) -> bool:
        a = self.attempt
        try:
            deleted = operation(redis_scope(a), a.key, self.token)
        except RedisUnavailable:
            later = "it will expire after the lock timeout"
            if remember:  # a completion may be there (applied late, by a hung server)
                discards.add(redis_scope(a), a.key, self.token, a.ttl)
                later = "it is deleted before this process's next claim"
            logger.warning(
                "could not release idempotency key in Redis; %s",
                later,
                exc_info=True,
                extra={"idempotency_scope": a.scope, "idempotency_key": a.key},
            )
            return False
        if deleted and a.wait > 0:
            self.wake()  # one waiter claims the key now
        return deleted


def outcome_for(record: RedisRecord, attempt: Attempt) -> Outcome:
    """What a record found in Redis means for ``attempt``."""
    if record.fingerprint != attempt.fingerprint:
        return Mismatch()
    if record.completed and record.response is not None:
        return Replay(record.response)
    return InProgress()


def ours(record: RedisRecord, token: str) -> bool:
    """Whether ``record`` is the claim this request made under ``token`` (one sent again,
    by us or by a Cluster client's own retry, finds the first one applied)."""
    return record.token == token and record.status == IN_PROGRESS


#: ``(scope, key, fingerprint, token, lease_ms) -> (won, record)``, as ``RedisStore.claim``.
ClaimCall = Callable[[str, str, str, str, int], tuple[bool, RedisRecord | None]]


def redis_claim(
    store: RedisStore,
    attempt: Attempt,
    make: Callable[[str], Outcome],
    claim: ClaimCall | None = None,
) -> tuple[Outcome, RedisRecord | None]:
    """One claim in Redis (``store.claim``, or ``claim``): ``make(token)`` when won, else
    the outcome of the record found (and the record). A claim whose outcome is unknown is
    sent once more with the same token: a record that holds that token is ours. A record
    found prepared is settled with the database (:func:`.prepared.settle_prepared`; one
    whose transaction did not commit is deleted, and the key claimed again). Raises
    ``RedisUnavailable`` (``RedisOutcomeUnknown`` when the key may be claimed), and
    ``StoreUnavailable`` while a prepared record's outcome is unknown."""
    lease = to_ms(attempt.lock_timeout)
    call = claim or store.claim
    for _ in range(CLAIM_ATTEMPTS):
        token = new_token()
        won, record = resend_once(
            partial(call, redis_scope(attempt), attempt.key, attempt.fingerprint, token, lease),
            "claim",
        )
        if won or (record is not None and ours(record, token)):
            return make(token), None
        if record is not None and record.prepared:
            settled = settle_prepared(store, attempt, record)
            if settled is None:
                continue  # its transaction did not commit: the record is gone, claim again
            return settled, record
        if record is not None:
            return outcome_for(record, attempt), record
    # The holder kept finishing between our SET and GET: report it as busy.
    return InProgress(), None


class RedisStrategy(Strategy):
    """Keys in Redis (a node or a cluster); see docs/redis.md."""

    name = "redis"

    def __init__(self) -> None:
        self.fallback: Strategy = DatabaseStrategy()

    def listener(self, attempt: Attempt) -> waiting.Listener | None:
        try:
            return waiting.redis_listener(get_store())
        except Exception:  # Redis not configured or unreachable: the waiters poll
            return None

    def claim(self, attempt: Attempt) -> Outcome:
        try:
            store = get_store()
            if discards.due(redis_scope(attempt), attempt.key):
                discards.flush(store)
            outcome, _record = redis_claim(
                store, attempt, lambda token: RedisClaim(store, attempt, token)
            )
        except RedisUnavailable as exc:
            return self.unavailable(attempt, exc)
        self.reached_redis()
        return outcome

    def reached_redis(self) -> None:
        """A claim got its answer from Redis: a fallback episode, if any, is over."""
        if monitor.active:
            monitor.reached(self.name)

    def unavailable(self, attempt: Attempt, exc: RedisUnavailable) -> Outcome:
        """Redis cannot be reached: the ``db`` strategy takes the request (counted in the
        fallback episode, see ``redis_health``), or 503. Always 503 (with ``Retry-After``)
        when the claim's outcome is unknown: Redis may hold the key for this request or
        for another, so no other store may run the view."""
        monitor.fell_back(self.name, exc)
        if isinstance(exc, RedisOutcomeUnknown):
            logger.warning(
                "the outcome of the Redis claim of idempotency key %s (scope %s) is "
                "unknown (%s): answered 503",
                attempt.key,
                attempt.scope,
                exc,
                extra={
                    "idempotency_scope": attempt.scope,
                    "idempotency_key": attempt.key,
                    "idempotency_outcome": "redis_unknown",
                    "idempotency_strategy": self.name,
                },
            )
            raise StoreUnavailable(retry_after=retry_after()) from exc
        if conf.REDIS_FAILURE_MODE != "db":
            raise StoreUnavailable() from exc
        logger.warning(
            "Redis is unavailable (%s); idempotency key %s (scope %s) is handled by "
            "the db strategy",
            exc,
            attempt.key,
            attempt.scope,
            extra={
                "idempotency_scope": attempt.scope,
                "idempotency_key": attempt.key,
                "idempotency_outcome": "redis_fallback",
                "idempotency_strategy": self.name,
            },
        )
        return Delegate(self.fallback)
