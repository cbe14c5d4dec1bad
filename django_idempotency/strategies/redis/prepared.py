"""A completion found prepared: replayed only once the database says its COMMIT landed.

The ``redis`` strategy writes the response to Redis before the view's transaction commits,
as a *prepared* record that names the transaction, and confirms it (``completed``) once
COMMIT has returned (``RedisClaim.after_commit``). A claim that finds a record still
prepared meets one of: an owner between its completion and its COMMIT; an owner killed
there (its writes never committed: replaying its response would answer for a charge that
does not exist); an owner killed after its COMMIT, or whose confirmation never reached
Redis (the writes committed: running the view again would charge twice); a COMMIT whose
answer never came (``DATABASE_TIMEOUT``). Redis alone cannot tell them apart; the database
can (``store.sql.xact``):

* committed: the record is confirmed and replayed;
* rolled back (or its session ended before COMMIT): the record is deleted and the key
  claimed again, so the view runs (its first run left nothing);
* still in progress: ``409``, as for any key in progress;
* not known (a database that cannot tell, MariaDB, MySQL, SQLite; a transaction too old
  for PostgreSQL's log): ``503`` with ``Retry-After``, until the owner confirms or deletes
  the record or it expires, never a replay or a second run.

See docs/redis.md, "The window between Redis and COMMIT".
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connections
from django.utils.translation import gettext_lazy as _

from ...conf import conf
from ...errors import StoreUnavailable
from ...store.errors import store_unavailable
from ...store.sql import xact
from ..base import Attempt, InProgress, Mismatch, Outcome, Replay
from .outcome import RedisUnavailable
from .store import RedisRecord, RedisStore, redis_scope

logger = logging.getLogger("django_idempotency")

#: The detail of the 503 for a completion whose COMMIT cannot be known yet.
UNKNOWN_DETAIL = _(
    "An earlier request with this Idempotency-Key may have completed, but whether its "
    "changes were committed cannot be known yet. Retry later with the same Idempotency-Key."
)


def _unknown(attempt: Attempt, why: str) -> StoreUnavailable:
    logger.warning(
        "idempotency key %s (scope %s): its completion in Redis is prepared and %s: answered 503",
        attempt.key,
        attempt.scope,
        why,
        extra={
            "idempotency_scope": attempt.scope,
            "idempotency_key": attempt.key,
            "idempotency_outcome": "commit_unknown",
            "idempotency_strategy": "redis",
        },
    )
    retry_after = conf.RETRY_AFTER
    return StoreUnavailable(UNKNOWN_DETAIL, retry_after=1 if retry_after is None else retry_after)


def settle_prepared(store: RedisStore, attempt: Attempt, record: RedisRecord) -> Outcome | None:
    """What a claim that found ``record`` prepared answers (see the module doc); None when
    the record's transaction did not commit and the record was deleted: claim again.
    Raises ``StoreUnavailable`` (503) while the outcome is unknown."""
    connection = connections[attempt.database]
    try:
        outcome = xact.transaction_outcome(connection, record.xid)
    except DatabaseError as exc:
        raise store_unavailable(exc) from exc
    if outcome == xact.COMMITTED:
        try:
            store.confirm(redis_scope(attempt), attempt.key, record.token, notify=attempt.wait > 0)
        except RedisUnavailable:
            logger.debug("could not confirm the record of key %s", attempt.key, exc_info=True)
        if record.fingerprint != attempt.fingerprint:
            return Mismatch()
        assert record.response is not None
        return Replay(record.response)
    if outcome == xact.IN_PROGRESS:
        return Mismatch() if record.fingerprint != attempt.fingerprint else InProgress()
    if outcome == xact.UNKNOWN:
        raise _unknown(attempt, "the database cannot tell whether its COMMIT landed")
    try:
        store.discard(redis_scope(attempt), attempt.key, record.token)
    except RedisUnavailable as exc:
        raise _unknown(attempt, "its deletion did not reach Redis") from exc
    logger.warning(
        "idempotency key %s (scope %s): deleted from Redis the prepared response of a "
        "request whose transaction did not commit (its process died before COMMIT); "
        "the view runs again",
        attempt.key,
        attempt.scope,
    )
    return None
