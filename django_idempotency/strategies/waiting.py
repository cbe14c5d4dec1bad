"""Duplicates that wait for the first request's answer (``IDEMPOTENCY["WAIT"]``).

A duplicate that finds its key in progress subscribes to the key in this process's
:data:`hub` *before* it claims (so that a notification between the claim and the wait
is not lost), then sleeps until the key is woken, the poll interval passes or its
wait runs out, and claims again: a completed key replays, a released key is claimed by
exactly one waiter (the claim is atomic), the others find it in progress again.

The wake-ups come from the store: one listener thread per process and store feeds the
hub (PostgreSQL ``LISTEN``, Redis ``SUBSCRIBE``), and the request that completes or
releases a key sends the notification (``NOTIFY`` in its transaction, so that it is
delivered at COMMIT; ``PUBLISH`` after the commit) only when its own wait is > 0. The
bounded poll (``WAIT_POLL_INTERVAL``) covers a lost notification, a listener that is
reconnecting, and SQLite, which has no notifications. See docs/waiting.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from django.db import connections

from ..conf import conf
from ..store.sql.statements import features_of
from ..values.keys import key_digest

logger = logging.getLogger("django_idempotency")

#: The PostgreSQL channel (and the suffix of the Redis channel) of the wake-ups.
CHANNEL = "django_idempotency"


class Hub:
    """The waiters of this process, by key digest; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, set[threading.Event]] = {}

    @contextlib.contextmanager
    def subscribe(self, digest: str) -> Iterator[threading.Event]:
        """An event that is set whenever the key is woken, until the block ends."""
        event = threading.Event()
        with self._lock:
            self._waiting.setdefault(digest, set()).add(event)
        try:
            yield event
        finally:
            with self._lock:
                events = self._waiting.get(digest)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._waiting[digest]

    def wake(self, digest: str) -> None:
        with self._lock:
            events = list(self._waiting.get(digest, ()))
        for event in events:
            event.set()

    def wake_all(self) -> None:
        """Every waiter claims again (after a listener reconnected: it may have missed some)."""
        with self._lock:
            events = [event for events in self._waiting.values() for event in events]
        for event in events:
            event.set()

    def waiters(self) -> int:
        with self._lock:
            return sum(len(events) for events in self._waiting.values())


hub = Hub()


class Slots:
    """At most ``WAIT_MAX_WAITERS`` duplicates wait at once in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def acquire(self) -> bool:
        with self._lock:
            if self.taken >= conf.WAIT_MAX_WAITERS:
                return False
            self.taken += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.taken -= 1


slots = Slots()


# -- listeners -------------------------------------------------------------------------------


class _Ready(threading.Event):
    """Set while the listener listens; ``settled`` is set too, and also when an attempt to
    listen ended without it (the store down, refusing, or not direct)."""

    def __init__(self) -> None:
        super().__init__()
        self.settled = threading.Event()

    def set(self) -> None:
        super().set()
        self.settled.set()


class Listener:
    """A daemon thread that listens to one store and wakes the hub; (re)started lazily in
    each process (a forked worker starts its own)."""

    #: Seconds to wait after a failure before connecting again.
    reconnect_delay = 1.0

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._pid = 0
        self._thread: threading.Thread | None = None
        self._ready = _Ready()
        self._stop = threading.Event()
        #: The pid of the process in which the listener found it must not listen (its
        #: connection may be a transaction pooler's): its waiters poll until it restarts.
        self.gave_up = 0

    def ensure(self, timeout: float = 2.0) -> bool:
        """Start the thread in this process if needed; whether it is listening. The call
        that starts it waits up to ``timeout`` for its first attempt to listen, and no
        longer than that attempt; every other call answers at once. So a store that is
        down, refusing or hanging costs one request that wait, not each request: a waiter
        whose listener is not ready polls."""
        if self.gave_up == os.getpid():
            return False
        started = False
        if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                    self._pid = os.getpid()
                    self._ready = _Ready()
                    self._stop = threading.Event()
                    self._thread = threading.Thread(
                        target=self._run, name=f"idempotency-{self.name}", daemon=True
                    )
                    self._thread.start()
                    started = True
        if started:
            self._ready.settled.wait(timeout)
        if self.gave_up == os.getpid():
            return False
        return self._ready.is_set()

    def stop(self, timeout: float = 3.0) -> None:
        """Stop the thread and wait for it to close its connection (up to ``timeout``)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and self._pid == os.getpid():
            thread.join(timeout)

    def _run(self) -> None:
        ready, stop = self._ready, self._stop
        while not stop.is_set():
            try:
                self.listen(ready, stop)
            except NoDirectConnection as exc:
                logger.warning(
                    "waiting duplicates poll every WAIT_POLL_INTERVAL: %s. Set "
                    "IDEMPOTENCY['WAIT_LISTEN_DATABASE'] to a direct connection to PostgreSQL "
                    "for their wake-ups (docs/operations.md, Behind PgBouncer)",
                    exc,
                )
                self.gave_up = os.getpid()
                ready.clear()
                ready.settled.set()
                return
            except Exception:
                logger.warning(
                    "the %s listener of waiting duplicates failed; they poll until it is back",
                    self.name,
                    exc_info=True,
                )
            ready.clear()
            ready.settled.set()
            stop.wait(self.reconnect_delay)

    def listen(self, ready: threading.Event, stop: threading.Event) -> None:
        """Connect, subscribe, set ``ready`` (and wake every waiter), then dispatch to the hub
        until ``stop`` is set or the connection fails."""
        raise NotImplementedError


class NoDirectConnection(Exception):
    """The listener's connection is not proven to reach a PostgreSQL backend directly."""


class PostgresListener(Listener):
    """``LISTEN django_idempotency`` on a connection of its own (not the request's).

    ``LISTEN`` is session state: through a transaction pooler (PgBouncer with
    ``pool_mode = transaction``) it stays on a server connection that other clients then
    get, and the listener hears nothing. So the listener listens on
    ``WAIT_LISTEN_DATABASE`` when it is set (the operator's word that it is direct),
    else on the keys' database only when the connection is proven direct
    (:func:`direct_connection`); otherwise it gives up and the waiters poll."""

    def __init__(self, alias: str) -> None:
        super().__init__(f"postgresql:{alias}")
        self.alias = alias

    def listen(self, ready: threading.Event, stop: threading.Event) -> None:
        import psycopg

        trusted, dsn, params = listen_connection(self.alias)
        with psycopg.connect(dsn, **params, autocommit=True) as conn:
            if not trusted:
                reason = direct_connection(conn)
                if reason:
                    raise NoDirectConnection(reason)
            conn.execute(f"LISTEN {CHANNEL}")
            ready.set()
            hub.wake_all()
            while not stop.is_set():
                for notify in conn.notifies(timeout=1.0):
                    hub.wake(notify.payload)


def listen_connection(alias: str) -> tuple[bool, str, dict[str, Any]]:
    """(trusted, DSN, keyword parameters) of the listener's connection: those of
    ``WAIT_LISTEN_DATABASE`` (an alias of DATABASES, or a libpq DSN or URI; trusted), else
    those of the keys' database ``alias`` (not trusted: checked first)."""
    configured = conf.WAIT_LISTEN_DATABASE
    if configured is not None and configured not in connections.settings:
        return True, configured, {}
    source = configured if configured is not None else alias
    params: dict[str, Any] = dict(connections[source].get_connection_params())
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    return configured is not None, "", params


_PEER = """SELECT client_addr::text, client_port, pid FROM pg_stat_activity
WHERE pid = pg_backend_pid()"""


def direct_connection(conn: Any) -> str:
    """Why ``conn`` is not proven to be a direct session with a PostgreSQL backend, or
    "" when it is: the backend's own view of its client (``pg_stat_activity``) must be
    this very socket. Over TCP its client address and port are this socket's local ones
    (through a pooler or a proxy they are the pooler's); over a Unix-domain socket the
    process at the other end (``SO_PEERCRED``) is the backend's parent, the postmaster
    (through a pooler it is the pooler). Anything unproven counts as a pooler: a silent
    ``LISTEN`` on a shared server connection is worse than polling."""
    import socket

    row = conn.execute(_PEER).fetchone()
    sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
    try:
        if sock.family == socket.AF_UNIX:
            return _direct_unix(sock, row)
        host, port = sock.getsockname()[:2]
    finally:
        sock.close()
    if row is None or row[0] is None or row[1] is None:
        return "the server does not show this connection's client address"
    import ipaddress

    seen = ipaddress.ip_address(str(row[0]).split("/")[0])
    if (seen, int(row[1])) != (ipaddress.ip_address(host), port):
        return (
            f"the server sees this connection coming from {seen} port {row[1]}, not from "
            f"{host} port {port}: a pooler or a proxy is in between"
        )
    return ""


def _direct_unix(sock: Any, row: Any) -> str:
    import socket
    import struct

    if row is None or row[1] is None or int(row[1]) != -1:
        return "the server does not see this connection as a Unix-domain socket"
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    peer = struct.unpack("3i", creds)[0]
    backend = int(row[2])
    try:
        with open(f"/proc/{backend}/status") as status:
            parent = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
    except (OSError, StopIteration, ValueError):
        return "the backend's parent process cannot be seen from here"
    if parent != peer:
        return f"the socket's peer (pid {peer}) is not the postmaster: a pooler is in between"
    return ""


class RedisListener(Listener):
    """``SUBSCRIBE <prefix>:django_idempotency`` on the store's client (a node, or a cluster,
    where PUBLISH reaches every node's subscribers)."""

    def __init__(self, store: Any) -> None:
        super().__init__(f"redis:{store.prefix}")
        self.store = store

    def listen(self, ready: threading.Event, stop: threading.Event) -> None:
        pubsub = self.store.client.pubsub()
        try:
            pubsub.subscribe(self.store.wake_channel)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the subscription is confirmed
                message = pubsub.get_message(timeout=0.2)
                if message is not None and message["type"] == "subscribe":
                    break
            else:
                raise TimeoutError("no confirmation of SUBSCRIBE")
            ready.set()
            hub.wake_all()
            while not stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is not None and message["type"] == "message":
                    data = message["data"]
                    hub.wake(data.decode() if isinstance(data, bytes) else str(data))
        finally:
            with contextlib.suppress(Exception):
                pubsub.close()


_listeners: dict[tuple[str, str, int], Listener] = {}
_listeners_lock = threading.Lock()


def postgres_listener(alias: str) -> PostgresListener:
    ident = ("postgresql", alias, 0)
    with _listeners_lock:
        listener = _listeners.get(ident)
        if listener is None:
            listener = _listeners[ident] = PostgresListener(alias)
    assert isinstance(listener, PostgresListener)
    return listener


def redis_listener(store: Any) -> RedisListener:
    ident = ("redis", store.prefix, id(store.client))
    with _listeners_lock:
        listener = _listeners.get(ident)
        if listener is None or not isinstance(listener, RedisListener):
            listener = _listeners[ident] = RedisListener(store)
    assert isinstance(listener, RedisListener)
    return listener


def reset_listeners() -> None:
    """Stop and forget the listeners (tests, or after changing connection settings)."""
    with _listeners_lock:
        listeners = list(_listeners.values())
        _listeners.clear()
    for listener in listeners:
        listener.stop()


# -- notifications ---------------------------------------------------------------------------


def notify_database(alias: str, scope: str, key: str) -> None:
    """Wake the key's waiters in every process: ``NOTIFY`` on PostgreSQL, sent in the
    current transaction (delivered at its COMMIT, dropped at a ROLLBACK); nothing on
    other databases, whose waiters poll. Raises ``DatabaseError``: inside a transaction
    the caller must not carry on as if the statement had not failed."""
    connection = connections[alias]
    if not features_of(connection).notifies:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, key_digest(scope, key)])
