"""Keys whose record Redis may not have: the hybrid strategy looks them up in PostgreSQL.

A key that the hybrid strategy handed to the ``db`` strategy while Redis refused it, or whose
completed record could not be written to Redis after its commit, lives in PostgreSQL only:
Redis knows nothing of it, and its next claim there would succeed and run the view again
(PostgreSQL then refuses the commit). So each such key is remembered, in three places:

* in this process, until its record can no longer live (its ``TTL``, and the lease of a
  claim still running): the claim path of this process looks it up in PostgreSQL;
* in the key's database, as an ``IdempotencySuspect`` row (``store/suspects.py``), which
  every process reads when it claims a key new in Redis, at most once every
  ``read_interval`` seconds, and so learns of the keys another process handled, even one
  that ended since;
* in Redis, as a *suspect mark* next to the key's record (same hash slot), written by the
  first process whose claim Redis answers again while it knows of the key; the claim script
  reads it with the loss marker, so a claim in any process looks the key up in PostgreSQL
  while it exists. The rows whose marks are written are deleted.

What this does not cover (docs/hybrid.md, "Fallback episodes"): a process that reaches Redis
does not see a key another process handled until its next read of the rows (at most
``read_interval`` seconds, and PostgreSQL still refuses that claim's commit). Marks are lost
with Redis's data, which the loss check sees (a flush, a restart). Cheap when nothing fell
back: one attribute read per claim, and one ``SELECT`` of an empty table per process and
``read_interval``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ...store.suspects import SuspectRow
from .outcome import RedisUnavailable
from .store import RedisStore

logger = logging.getLogger("django_idempotency")


class Suspects:
    """This process's keys that Redis may not know; thread-safe."""

    #: Seconds between two reads of the key databases' rows (``read_due``).
    read_interval: float = 1.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        #: The process's clock for deadlines (seconds, monotonic); tests drive their own.
        self.clock = clock
        self._lock = threading.Lock()
        #: (redis scope, key) -> until when (``time.monotonic()``) it is looked up.
        self._known: dict[tuple[str, str], float] = {}
        #: Those whose mark is not in Redis yet: (redis scope, key) -> the same deadline.
        self._pending: dict[tuple[str, str], float] = {}
        self._next_prune = 0.0
        #: The database row of a remembered key: deleted once its mark is in Redis.
        self._rows: dict[tuple[str, str], SuspectRow] = {}
        #: Rows whose marks Redis took, for the caller to delete (``settled``).
        self._settled: list[SuspectRow] = []
        #: When (``clock()``) the rows are read next: at the first claim, then every
        #: ``read_interval`` seconds.
        self.next_read = 0.0

    @property
    def pending(self) -> bool:
        """Whether marks wait for Redis (the hot path's one read)."""
        return bool(self._pending)

    def read_due(self) -> bool:
        """Whether this process reads the database's rows now (the first call, then at most
        once every ``read_interval`` seconds); True starts the next interval."""
        now = self.clock()
        with self._lock:
            if now < self.next_read:
                return False
            self.next_read = now + self.read_interval
            return True

    def add(self, scope: str, key: str, seconds: float, row: SuspectRow | None = None) -> None:
        """Remember (scope, key) for ``seconds`` from now (never for less than before);
        ``row``: its database row, deleted once its mark is written."""
        now = self.clock()
        deadline = now + seconds
        with self._lock:
            if now >= self._next_prune:  # once a minute: an add stays O(1) in an episode
                self._prune(now)
                self._next_prune = now + 60.0
            entry = (scope, key)
            if self._known.get(entry, 0.0) < deadline:
                self._known[entry] = deadline
                self._pending[entry] = deadline
            if row is not None:
                # Its mark is (written again and) the row deleted at the next flush.
                self._rows[entry] = row
                self._pending.setdefault(entry, self._known[entry])

    def holds(self, scope: str, key: str) -> bool:
        """Whether (scope, key) is remembered in this process and may still live."""
        if not self._known:
            return False
        deadline = self._known.get((scope, key))
        return deadline is not None and deadline > self.clock()

    def flush(self, store: RedisStore) -> bool:
        """Write the pending marks to ``store`` (a ``RedisStore``), each living as long as its
        key may; False when Redis did not take them all (they stay pending)."""
        with self._lock:
            batch = dict(self._pending)
        if not batch:
            return True
        now = self.clock()
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
                row = self._rows.pop(entry, None)
                if row is not None:
                    self._settled.append(row)
        return True

    def settled(self) -> list[SuspectRow]:
        """The rows whose marks Redis took since the last call (for the caller to delete)."""
        with self._lock:
            rows, self._settled = self._settled, []
        return rows

    def _prune(self, now: float) -> None:
        for entry in [e for e, deadline in self._known.items() if deadline <= now]:
            self._rows.pop(entry, None)
        for table in (self._known, self._pending):
            for entry in [e for e, deadline in table.items() if deadline <= now]:
                del table[entry]

    def forget(self) -> None:
        """Forget everything, as a new process would (tests)."""
        with self._lock:
            self._known.clear()
            self._pending.clear()
            self._rows.clear()
            self._settled.clear()
            self.next_read = 0.0


suspects = Suspects()
