"""Keeping leases alive while views run.

One daemon thread per process renews every registered claim whose renewal is
due, so that only a crashed owner's lease ever expires. The thread starts on
first use (after a fork too) and holds its own database connection.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from django.db import close_old_connections, connections

from ..strategies.base import Claim

logger = logging.getLogger("django_idempotency")


@dataclass(eq=False)
class Lease:
    claim: Claim
    interval: float
    due: float = field(default=0.0)
    lost: bool = False
    renewals: int = 0


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
        # When the keeper thread will look at its leases next (monotonic), and whether it
        # holds a database connection; both under _lock. A request wakes the thread only
        # when its lease falls due before that, or to give an idle connection back.
        self._deadline = float("inf")
        self._connected = False

    def _ensure_thread(self) -> None:
        if self._running and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._deadline = float("inf")
        self._connected = False
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
            idle = not self._leases and self._connected
        if idle:
            self._wake.set()  # so that the keeper gives its connection back now

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._running = False

    def _loop(self) -> None:
        while True:
            with self._lock:
                leases = list(self._leases)
            now = time.monotonic()
            due = [lease for lease in leases if lease.due <= now]
            for lease in due:
                self._renew(lease)
            with self._lock:
                pending = [lease.due for lease in self._leases]
                release = not pending and self._connected
                timeout = max(min(pending) - time.monotonic(), 0.01) if pending else 60.0
                self._deadline = time.monotonic() + timeout
            if release:
                # Idle: close this thread's connection rather than hold it until the next
                # request (an idle connection also keeps a database from being dropped).
                connections.close_all()
                with self._lock:
                    self._connected = False
            self._wake.wait(timeout)
            self._wake.clear()

    def _renew(self, lease: Lease) -> None:
        lease.due = time.monotonic() + lease.interval
        with self._lock:
            if lease not in self._leases:
                return
        with self._lock:
            self._connected = True
        try:
            close_old_connections()
            renewed = lease.claim.renew()
        except Exception:
            logger.warning("idempotency lease renewal failed; retrying", exc_info=True)
            lease.due = time.monotonic() + min(lease.interval, 1.0)
            return
        lease.renewals += 1
        if not renewed and not lease.lost:
            lease.lost = True
            logger.warning("idempotency lease lost while the view was running")


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
