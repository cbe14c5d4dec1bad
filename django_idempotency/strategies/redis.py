"""The ``redis`` strategy: the key lives in Redis, the view's writes in the database.

Claim: one ``SET key value NX PX lock_timeout`` (see :mod:`django_idempotency.redis_store`).
A duplicate gets 409 while the lease lives, the stored response once the key is
completed, 422 for a different request. The lease is renewed by the heartbeat
while the view runs and expires by itself when the worker dies, so a crashed
request's key is free again after ``LOCK_TIMEOUT``. The completed record lives
``TTL`` seconds.

**What it guarantees, and what it does not.** Redis and the database are two
stores, and no commit spans both. With ``ATOMIC`` (the default) the view runs in
``transaction.atomic(using=DATABASE)`` and the response is stored in Redis as the
*last step before COMMIT*, with a compare-and-set on the claim token:

* if the claim was lost (the lease expired and another request took the key), the
  compare-and-set fails, the transaction rolls back and this request answers 409
  ``lease-lost``: two owners never both commit;
* if Redis fails at that moment, the transaction rolls back and the request
  answers 503: the retry runs the view again, once;
* if the COMMIT itself fails after Redis stored the response, the record is
  deleted again (compare-and-delete on the token) so that a retry runs the view.
  Should Redis fail in that same instant, the stored response is replayed for
  writes that were rolled back. This window (between two network round trips)
  is the price of keeping the key outside the database.

Without ``ATOMIC`` the view's writes are committed as it makes them and a lost
claim is reported after the fact (409 ``lease-lost``; the writes stay).

Redis itself is the last limit: a key is only as durable as Redis makes it. A
restart without persistence, an eviction (use ``maxmemory-policy noeviction`` or
``volatile-*`` with room to spare), or a failover to a replica that had not yet
received the write forgets keys, and a retry of a forgotten key runs the view
again. Use this strategy for traffic where that is acceptable, and the ``db``,
``advisory_lock`` or ``hybrid`` strategies for payments.

**When Redis fails** (connection refused, timeout after ``REDIS_SOCKET_TIMEOUT``,
cluster down) at claim time:

* ``REDIS_FAILURE_MODE = "db"`` (default): a warning is logged and this request
  runs under the ``db`` strategy instead. The two stores do not see each other's
  keys, so a duplicate that reached Redis while the first request fell back (or
  the other way round) is not recognised; availability is bought with the
  guarantee during the outage.
* ``REDIS_FAILURE_MODE = "fail_closed"``: the request is answered 503
  ``store-unavailable`` (problem+json) and the view does not run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..conf import conf
from ..errors import LeaseLost, StoreUnavailable
from ..redis_store import (
    RedisRecord,
    RedisStore,
    RedisUnavailable,
    get_store,
    new_token,
    to_ms,
)
from ..responses import StoredResponse
from .base import (
    Attempt,
    Delegate,
    InFlight,
    Mismatch,
    Outcome,
    Replay,
    Strategy,
    TransactionalClaim,
)
from .db import DatabaseStrategy

logger = logging.getLogger("django_idempotency")

#: How often a claim is tried again when the holder's record vanished between SET and GET.
CLAIM_ATTEMPTS = 3


class RedisClaim(TransactionalClaim):
    """A key this request holds in Redis under ``token``."""

    def __init__(self, store: RedisStore, attempt: Attempt, token: str) -> None:
        super().__init__(attempt)
        self.store = store
        self.token = token

    def renew(self) -> bool:
        a = self.attempt
        return self.store.renew(a.scope, a.key, self.token, to_ms(a.lock_timeout))

    def _store(self, response: StoredResponse) -> None:
        a = self.attempt
        try:
            stored = self.store.complete(a.scope, a.key, self.token, response, to_ms(a.ttl))
        except RedisUnavailable as exc:
            raise StoreUnavailable(
                "The response could not be stored, so this request's changes were rolled back. "
                "Retry with the same Idempotency-Key."
            ) from exc
        if not stored:
            raise LeaseLost()

    def delete(self) -> bool:
        """Delete this claim's in-progress record, if it is still ours."""
        return self._redis_delete(self.store.release)

    def discard(self) -> None:
        """The transaction did not commit: delete our record, completed or not."""
        self._redis_delete(self.store.discard)

    def _redis_delete(self, operation: Callable[[str, str, str], bool]) -> bool:
        a = self.attempt
        try:
            return operation(a.scope, a.key, self.token)
        except RedisUnavailable:
            logger.warning(
                "could not release idempotency key in Redis; it will expire after the lock timeout",
                exc_info=True,
                extra={"idempotency_scope": a.scope, "idempotency_key": a.key},
            )
            return False


def outcome_for(record: RedisRecord, attempt: Attempt) -> Outcome:
    """What a record found in Redis means for ``attempt``."""
    if record.fingerprint != attempt.fingerprint:
        return Mismatch()
    if record.completed and record.response is not None:
        return Replay(record.response)
    return InFlight()


def redis_claim(
    store: RedisStore, attempt: Attempt, make: Callable[[str], Outcome]
) -> tuple[Outcome, RedisRecord | None]:
    """One claim in Redis: ``make(token)`` when won, else the outcome of the record
    found (and the record); raises ``RedisUnavailable``."""
    lease = to_ms(attempt.lock_timeout)
    for _ in range(CLAIM_ATTEMPTS):
        token = new_token()
        won, record = store.claim(attempt.scope, attempt.key, attempt.fingerprint, token, lease)
        if won:
            return make(token), None
        if record is not None:
            return outcome_for(record, attempt), record
    # The holder kept finishing between our SET and GET: report it as busy.
    return InFlight(), None


class RedisStrategy(Strategy):
    """Keys in Redis (a node or a cluster); see docs/redis.md."""

    name = "redis"

    def __init__(self) -> None:
        self.fallback: Strategy = DatabaseStrategy()

    def claim(self, attempt: Attempt) -> Outcome:
        try:
            store = get_store()
            outcome, _record = redis_claim(
                store, attempt, lambda token: RedisClaim(store, attempt, token)
            )
        except RedisUnavailable as exc:
            return self.unavailable(attempt, exc)
        return outcome

    def unavailable(self, attempt: Attempt, exc: RedisUnavailable) -> Outcome:
        """Redis cannot be reached: the ``db`` strategy takes the request, or 503."""
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
