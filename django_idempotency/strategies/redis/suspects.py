"""Keys whose record Redis may not have: the hybrid strategy looks them up in PostgreSQL.

A key that the hybrid strategy handed to the ``db`` strategy while Redis refused it, or whose
completed record could not be written to Redis after its commit, lives in PostgreSQL only:
Redis knows nothing of it, and its next claim there would succeed and run the view again
(PostgreSQL then refuses the commit). So each such key is remembered, in two places:

* in this process, until its record can no longer live (its ``TTL``, and the lease of a
  claim still running): the claim path of this process looks it up in PostgreSQL;
* in Redis, as a *suspect mark* next to the key's record (same hash slot), written by this
  process right after its first claim that Redis answers again; the claim script reads it
  with the loss marker, so a claim in any process looks the key up in PostgreSQL while it
  exists.

What this does not cover (docs/hybrid.md, "Fallback episodes"): a mark not yet written when
the process ends (a restart during the episode, or before its next claim after it) is lost;
until the process that fell back reaches Redis again, another process's claim of the key in
Redis does not see it (PostgreSQL still refuses that claim's commit). Marks are lost with
Redis's data, which the loss check sees (a flush, a restart). Cheap when nothing fell back:
one attribute read per claim.
"""

from __future__ import annotations

import logging
import threading
import time

from .outcome import RedisUnavailable
from .store import RedisStore

logger = logging.getLogger("django_idempotency")


class Suspects:
    """This process's keys that Redis may not know; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (redis scope, key) -> until when (``time.monotonic()``) it is looked up.
        self._known: dict[tuple[str, str], float] = {}
        #: Those whose mark is not in Redis yet: (redis scope, key) -> the same deadline.
        self._pending: dict[tuple[str, str], float] = {}
        self._next_prune = 0.0

    @property
    def pending(self) -> bool:
        """Whether marks wait for Redis (the hot path's one read)."""
        return bool(self._pending)

    def add(self, scope: str, key: str, seconds: float) -> None:
        """Remember (scope, key) for ``seconds`` from now (never for less than before)."""
        now = time.monotonic()
        deadline = now + seconds
        with self._lock:
            if now >= self._next_prune:  # once a minute: an add stays O(1) in an episode
                self._prune(now)
                self._next_prune = now + 60.0
            entry = (scope, key)
            if self._known.get(entry, 0.0) < deadline:
                self._known[entry] = deadline
                self._pending[entry] = deadline

    def holds(self, scope: str, key: str) -> bool:
        """Whether (scope, key) is remembered in this process and may still live."""
        if not self._known:
            return False
        deadline = self._known.get((scope, key))
        return deadline is not None and deadline > time.monotonic()

    def flush(self, store: RedisStore) -> bool:
        """Write the pending marks to ``store`` (a ``RedisStore``), each living as long as its
        key may; False when Redis did not take them all (they stay pending)."""
        with self._lock:
            batch = dict(self._pending)
        if not batch:
            return True
        now = time.monotonic()
        marks = [(scope, key, deadline - now) for (scope, key), deadline in batch.items()]
        try:
            store.put_suspects([m for m in marks if m[2] > 0])
        except RedisUnavailable as exc:
            logger.debug("could not write the hybrid strategy's suspect marks: %s", exc)
            return False
        with self._lock:
            for entry, deadline in batch.items():
                if self._pending.get(entry) == deadline:
                    del self._pending[entry]
        return True

    def _prune(self, now: float) -> None:
        for table in (self._known, self._pending):
            for entry in [e for e, deadline in table.items() if deadline <= now]:
                del table[entry]

    def forget(self) -> None:
        """Forget everything, as a new process would (tests)."""
        with self._lock:
            self._known.clear()
            self._pending.clear()


suspects = Suspects()
