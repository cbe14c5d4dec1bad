"""A bound on the library's own statements on PostgreSQL: ``DATABASE_TIMEOUT``.

libpq has no read timeout. A statement whose server hangs (a stopped process, a proxy or
network path that holds the traffic while the kernel still acknowledges it) waits for its
answer forever: TCP keepalives and ``tcp_user_timeout`` notice a path that drops packets,
not one that holds them, and ``statement_timeout`` is the server's, which does not run.
:func:`bounded` gives a block ``DATABASE_TIMEOUT`` seconds; when they run out, one
watchdog thread per process shuts the connection's socket down, psycopg reports the
connection lost, and the statement's outcome is *unknown*: it may have been applied (a
claim, a completion and its COMMIT). The callers answer it so (``503
database-unavailable``, whose retry is replayed when the completion committed), never as
a claim that did not happen.

Connecting is not covered: libpq's ``connect_timeout`` bounds it (docs/operations.md).
Other vendors have their driver's own read timeout (``read_timeout`` of mysqlclient).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ...conf import conf

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


def _socket_of(connection: BaseDatabaseWrapper) -> int | None:
    """The file descriptor of a PostgreSQL connection's socket (psycopg 3 or 2), or None."""
    raw: Any = connection.connection
    pgconn = getattr(raw, "pgconn", None)
    try:
        if pgconn is not None:
            return int(pgconn.socket)
        return int(raw.fileno())
    except Exception:  # closed, or a driver without a socket to show
        return None


def _cut(fd: int) -> None:
    """Shut the socket ``fd`` down (both ways): the statement waiting on it fails at once.
    Through a duplicate of the descriptor, so that the driver's stays its own to close."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


class Watchdog:
    """Cuts the connections whose statements outlive their deadline; one thread, started on
    first use (after a fork too)."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        #: Armed statements: token -> (deadline (monotonic), socket).
        self._armed: dict[int, tuple[float, int]] = {}
        self._tokens = itertools.count()
        self._pid = 0
        #: When the thread looks next (monotonic; inf: when a statement is armed).
        self._wakes_at = float("inf")
        #: Statements cut so far (tests, logs).
        self.cut = 0

    def arm(self, fd: int, seconds: float) -> int:
        with self._changed:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._armed.clear()
                self._wakes_at = float("inf")
                threading.Thread(
                    target=self._run, name="django-idempotency-watchdog", daemon=True
                ).start()
            token = next(self._tokens)
            deadline = time.monotonic() + seconds
            self._armed[token] = (deadline, fd)
            if deadline < self._wakes_at:
                self._changed.notify()  # sooner than the thread means to look
            return token

    def disarm(self, token: int) -> None:
        # Under the lock: once this returns, the socket is never cut (its descriptor may
        # be closed and reused by then).
        with self._changed:
            self._armed.pop(token, None)

    def _run(self) -> None:
        pid = os.getpid()
        while True:
            with self._changed:
                if self._pid != pid:
                    return  # a forked child runs its own
                now = time.monotonic()
                for token, (deadline, fd) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[token]
                        _cut(fd)
                        self.cut += 1
                earliest = min((deadline for deadline, _fd in self._armed.values()), default=None)
                self._wakes_at = float("inf") if earliest is None else earliest
                self._changed.wait(None if earliest is None else max(earliest - now, 0.001))


watchdog = Watchdog()


@contextmanager
def bounded(connection: BaseDatabaseWrapper, extra: float = 0.0) -> Iterator[None]:
    """The block's statements on ``connection`` cut after ``DATABASE_TIMEOUT`` seconds,
    plus ``extra`` for a wait the block means to make (a lock's); on PostgreSQL only:
    elsewhere, or with the setting None, the block is not bounded. A connection not opened
    yet is opened first, outside a transaction (inside one, it is not opened here)."""
    seconds = conf.DATABASE_TIMEOUT
    if seconds is None or connection.vendor != "postgresql":
        yield
        return
    if connection.connection is None and not connection.in_atomic_block:
        connection.ensure_connection()
    fd = None if connection.connection is None else _socket_of(connection)
    if fd is None:
        yield
        return
    token = watchdog.arm(fd, seconds + extra)
    try:
        yield
    finally:
        watchdog.disarm(token)
