"""Keeping leases alive while views run.

One daemon thread per process (the scheduler) hands every registered claim whose
renewal is due to a renewer thread, which renews it on its own database connection, so
that only a crashed owner's lease ever expires. The threads start on first use (after
a fork too). A renewal that has not answered within :func:`renewal_bound` (a hung
server, a silent network: the query was sent and the socket stays open) is not waited
for: its renewer is retired (it ends once its query returns, if ever) and a new renewer,
on a new connection, renews that lease and every other one due. A renewal that is
merely late still keeps the lease: the claim is the owner's until another execution
takes it over, which it may only once the lease has lapsed by the database's clock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from django.db import close_old_connections, connections

from ..strategies.base import Claim

logger = logging.getLogger("django_idempotency")

#: The least time (seconds) a renewal is waited for before a new connection renews again.
MIN_RENEWAL_BOUND = 0.5


def renewal_bound(interval: float) -> float:
    """How long a renewal of a lease renewed every ``interval`` seconds is waited for: half
    an interval (at least :data:`MIN_RENEWAL_BOUND`). With the default interval, a third of
    ``LOCK_TIMEOUT``, the renewal on a new connection starts half an interval after the
    stalled one, an interval and a half before the lease could lapse."""
    return max(interval / 2, MIN_RENEWAL_BOUND)


@dataclass(eq=False)
class Lease:
    claim: Claim
    interval: float
    due: float = field(default=0.0)
    lost: bool = False
    renewals: int = 0
    #: Handed to a renewer and not renewed yet (under the keeper's lock).
    pending: bool = False


class _Renewer:
    """A thread that renews leases one at a time on its own connection; ``retired`` once
    a renewal of its stalled, after which it takes no more leases."""

    def __init__(self, keeper: LeaseKeeper) -> None:
        self.keeper = keeper
        #: The lease being renewed and since when (monotonic), under the keeper's lock.
        self.lease: Lease | None = None
        self.since = 0.0
        self.retired = False
        self.thread = threading.Thread(
            target=self._run, name="django-idempotency-lease-renewer", daemon=True
        )

    def _run(self) -> None:
        keeper = self.keeper
        try:
            while True:
                lease = keeper._next(self)
                if lease is None:
                    return
                try:
                    keeper._renew(lease)
                finally:
                    keeper._renewed(self, lease)
        finally:
            # This thread's connection: given back when idle, or left by a stalled renewal.
            connections.close_all()


class LeaseKeeper:
    def __init__(self) -> None:
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        #: Whether the thread's loop runs (set before it starts, cleared when it ends): a
        #: flag read on every claim instead of asking the thread (Thread.is_alive()).
        self._running = False
        # When the scheduler will look at its leases next (monotonic); under _lock. A
        # request wakes the thread only when its lease falls due before that.
        self._deadline = float("inf")
        #: The leases due, waiting for a renewer, and the renewer that takes them.
        self._queue: deque[Lease] = deque()
        self._ready = threading.Condition(self._lock)
        self._renewer: _Renewer | None = None

    def _ensure_thread(self) -> None:
        if self._running and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._deadline = float("inf")
        self._queue.clear()
        self._renewer = None  # a renewer of the parent process does not run here
        self._running = True
        self._thread = threading.Thread(
            target=self._run, name="django-idempotency-lease-keeper", daemon=True
        )
        try:
            self._thread.start()
        except BaseException:
            self._running = False  # no thread: the next claim tries again
            raise

    def keep(self, claim: Claim, interval: float) -> Keeping:
        """Renew ``claim`` every ``interval`` seconds from the ``with`` block's start until
        its end (or :meth:`Keeping.stop`)."""
        return Keeping(self, Lease(claim, interval, due=time.monotonic() + interval))

    def _add(self, lease: Lease) -> None:
        with self._lock:
            self._leases.add(lease)
            self._ensure_thread()
            wake = lease.due < self._deadline
        if wake:
            self._wake.set()

    def _discard(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)
            if not self._leases:
                self._ready.notify_all()  # so that an idle renewer gives its connection back

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._running = False

    def _loop(self) -> None:
        while True:
            with self._lock:
                timeout = self._schedule(time.monotonic())
                self._deadline = time.monotonic() + timeout
            self._wake.wait(timeout)
            self._wake.clear()

    def _schedule(self, now: float) -> float:
        """Hand the leases due to the renewer (a new one when the renewer's renewal has
        stalled or there is none); the seconds until the next look. Under ``_lock``."""
        self._retire_stalled(now)
        renewer = self._renewer
        for lease in self._leases:
            if lease.due <= now and not lease.pending:
                lease.pending = True
                self._queue.append(lease)
        if self._queue:
            if renewer is None:
                renewer = self._renewer = _Renewer(self)
                renewer.thread.start()
            self._ready.notify_all()
        waits = [lease.due - now for lease in self._leases if not lease.pending]
        if renewer is not None and renewer.lease is not None:
            waits.append(renewer.since + renewal_bound(renewer.lease.interval) - now)
        return max(min(waits), 0.01) if waits else 60.0

    def _retire_stalled(self, now: float) -> None:
        """Retire the renewer whose renewal has not answered within its bound; its lease
        is due again at once, for the next renewer. Under ``_lock``."""
        renewer = self._renewer
        lease = None if renewer is None else renewer.lease
        if renewer is None or lease is None:
            return
        if now - renewer.since < renewal_bound(lease.interval):
            return
        logger.warning(
            "idempotency lease renewal has not answered for %.1f s; renewing on a new connection",
            now - renewer.since,
        )
        renewer.retired = True
        lease.pending = False
        lease.due = now
        self._renewer = None

    def _next(self, renewer: _Renewer) -> Lease | None:
        """The next lease for ``renewer`` to renew; None when it is to end (retired, or no
        lease is kept: an idle connection also keeps a database from being dropped)."""
        with self._lock:
            self._ready.wait_for(lambda: renewer.retired or self._queue or not self._leases)
            if renewer.retired or not self._queue:
                if self._renewer is renewer:
                    self._renewer = None
                return None
            lease = self._queue.popleft()
            renewer.lease, renewer.since = lease, time.monotonic()
            return lease

    def _renewed(self, renewer: _Renewer, lease: Lease) -> None:
        with self._lock:
            renewer.lease = None
            if not renewer.retired:
                lease.pending = False
        self._wake.set()  # the scheduler's next look counts from this renewal

    def _renew(self, lease: Lease) -> None:
        lease.due = time.monotonic() + lease.interval
        with self._lock:
            if lease not in self._leases:
                return
        try:
            close_old_connections()
            renewed = lease.claim.renew()
        except Exception:
            if self._ended(lease):
                logger.debug("idempotency lease renewal failed after its request ended")
                return
            logger.warning("idempotency lease renewal failed; retrying", exc_info=True)
            lease.due = time.monotonic() + min(lease.interval, 1.0)
            return
        lease.renewals += 1
        if renewed or lease.lost:
            return
        if self._ended(lease):
            # The key was completed or released under this renewal: the request's own
            # end, whose completion checks the token itself.
            logger.debug("idempotency lease renewal met the end of its request")
            return
        lease.lost = True
        logger.warning("idempotency lease lost while the view was running")

    def _ended(self, lease: Lease) -> bool:
        """Whether ``lease`` was given up (its view ended) while a renewal was on its way."""
        with self._lock:
            return lease not in self._leases


class Keeping:
    """One lease kept by a :class:`LeaseKeeper`: registered when the ``with`` block starts,
    given up at its end or at :meth:`stop`, whichever comes first. A plain class rather
    than a generator: it is entered and left on every claimed request."""

    __slots__ = ("_keeper", "_kept", "lease")

    def __init__(self, keeper: LeaseKeeper, lease: Lease) -> None:
        self._keeper = keeper
        self.lease = lease
        self._kept = False

    def __enter__(self) -> Lease:
        lease = self.lease
        if lease.claim.renewable and lease.interval > 0:
            self._keeper._add(lease)
            self._kept = True
        return lease

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """No more renewals (again: nothing)."""
        if self._kept:
            self._kept = False
            self._keeper._discard(self.lease)


keeper = LeaseKeeper()
