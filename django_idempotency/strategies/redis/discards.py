"""Records the ``redis`` strategy must still delete: its own, whose transaction did not commit.

The ``redis`` strategy stores the response in Redis just before the view's transaction
commits. When that transaction then does not commit (the completion's outcome was unknown,
or the ``COMMIT`` failed), the record is deleted again (``DISCARD_LUA``, on the claim token),
so that the retry runs the view instead of replaying a response whose writes were rolled
back. When Redis does not answer that deletion either, the record may still be there (a
completion sent to a hung server is applied once it runs again), so the deletion is kept
here and sent again before this process's next claim in Redis. A confirmation after COMMIT
that Redis did not answer is kept here the same way (``confirm``). What it does not cover: a
process that ends first takes its pending operations with it; a retry that finds the record
prepared meanwhile settles it with the database (``prepared.py``, docs/redis.md, "What it
does not guarantee").
"""

from __future__ import annotations

import logging
import threading
import time

from .outcome import RedisUnavailable
from .store import RedisStore

logger = logging.getLogger("django_idempotency")


class Discards:
    """This process's pending deletions, by (redis scope, key, token); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (redis scope, key, token) -> until when (``time.monotonic()``) the record may live.
        self._items: dict[tuple[str, str, str], float] = {}
        #: The items to confirm (COMMIT landed) rather than delete.
        self._confirm: set[tuple[str, str, str]] = set()
        #: No attempt before this (``time.monotonic()``) after one that failed, but for the
        #: key being claimed: a Redis that hangs costs a timeout per second, not per request.
        self._next_try = 0.0

    #: Seconds between two attempts while Redis does not answer them.
    retry_interval = 1.0

    def due(self, scope: str, key: str) -> bool:
        """Whether to send the pending deletions before a claim of (scope, key): any are
        pending, and the last attempt is old enough or one of them is that key's."""
        if not self._items:
            return False
        if time.monotonic() >= self._next_try:
            return True
        return any(item[:2] == (scope, key) for item in list(self._items))

    @property
    def pending(self) -> bool:
        """Whether deletions wait for Redis (the hot path's one read)."""
        return bool(self._items)

    def add(
        self, scope: str, key: str, token: str, seconds: float, *, confirm: bool = False
    ) -> None:
        """Delete the record of (scope, key) held by ``token`` once Redis answers (with
        ``confirm``: confirm it, its COMMIT landed); pointless after ``seconds`` (the record's
        time to live)."""
        with self._lock:
            self._items[(scope, key, token)] = time.monotonic() + seconds
            if confirm:
                self._confirm.add((scope, key, token))

    def flush(self, store: RedisStore) -> bool:
        """Send the pending deletions to ``store``; False when Redis did not answer them all
        (the rest stay pending). A record another claim holds now is left alone (the
        deletion is fenced by the token)."""
        now = time.monotonic()
        with self._lock:
            batch = [item for item, until in self._items.items() if until > now]
            self._items = {item: self._items[item] for item in batch}
            self._confirm &= set(batch)
            confirming = set(self._confirm)
        for scope, key, token in batch:
            try:
                if (scope, key, token) in confirming:
                    store.confirm(scope, key, token)
                    deleted = False
                else:
                    deleted = store.discard(scope, key, token)
            except RedisUnavailable as exc:
                logger.debug("could not discard a record of key %s yet: %s", key, exc)
                self._next_try = time.monotonic() + self.retry_interval
                return False
            with self._lock:
                self._items.pop((scope, key, token), None)
                self._confirm.discard((scope, key, token))
            if deleted:
                logger.warning(
                    "idempotency key %s (scope %s): deleted from Redis the response of a "
                    "request whose transaction did not commit",
                    key,
                    scope,
                )
        return True

    def forget(self) -> None:
        """Forget everything, as a new process would (tests)."""
        with self._lock:
            self._items.clear()
            self._confirm.clear()


discards = Discards()
