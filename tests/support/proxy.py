"""A TCP proxy between the application and a store, with faults a test can switch on.

``FaultProxy(host, port)`` listens on a free loopback port and forwards every connection
it accepts to ``(host, port)``, both ways, as it comes. The test then turns the network
grey instead of down:

* ``latency(seconds, jitter)``: each chunk waits ``seconds`` plus up to ``jitter`` more
  (uniformly drawn) before it is passed on, in both directions;
* ``silence()``: nothing is passed on any more, on every connection and on those accepted
  meanwhile, and the sockets stay open: a client that sent a query waits for an answer
  that does not come (the kernel acknowledges what it sends, so neither TCP keepalives
  nor ``tcp_user_timeout`` notice); what was held back flows again at ``heal()``, as a
  network that heals delivers what its peers retransmit;
* ``lose_replies()``: what the server sends is thrown away, on every connection, while
  what the clients send still reaches it: a command is applied and its reply never comes
  (an outcome the client cannot know);
* ``reset()``: every connection is ended with an RST to both of its peers;
* ``heal()``: no latency, no silence.

``links()`` are the connections open now; each can be silenced or reset alone
(``Link.silence()``, ``Link.reset()``), found by the port the server sees it come from
(PostgreSQL's ``pg_stat_activity.client_port``: ``link_from(port)``).
``through_proxy(alias)`` points a Django database alias at a new proxy for a block.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

#: How often the accepting thread looks whether the proxy was stopped (seconds).
ACCEPT_POLL = 0.1

#: The jitter's own generator: the pumps run in threads of their own, and drawing from the
#: ``random`` module's would change its state under whatever the test's thread draws
#: (Hypothesis warns of that, for a proxy's pump still running while a later test draws).
_JITTER = random.Random()


class Link:
    """One proxied connection: the client's socket and the proxy's to the server."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        #: The client's address, and the proxy's own towards the server (what the server
        #: sees as its client).
        self.client_address: tuple[str, int] = client.getpeername()
        self.upstream_address: tuple[str, int] = upstream.getsockname()
        self.silent = False
        self.closed = False
        self._ended = 0

    def silence(self) -> None:
        """Nothing more is passed on over this connection (until ``heal()``)."""
        with self.proxy._changed:
            self.silent = True

    def heal(self) -> None:
        with self.proxy._changed:
            self.silent = False
            self.proxy._changed.notify_all()

    def reset(self) -> None:
        """End the connection with an RST to both peers."""
        with self.proxy._changed:
            if self.closed:
                return
            self.closed = True
            self.proxy._changed.notify_all()
        for sock in (self.client, self.upstream):
            with suppress(OSError):
                # Linger 0: close() sends an RST instead of a FIN.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RD)  # wakes the pump blocked in recv()
            with suppress(OSError):
                sock.close()
        self.proxy._forget(self)

    def _held(self) -> bool:
        return (self.silent or self.proxy._silent) and not self.closed

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        proxy = self.proxy
        try:
            while True:
                data = source.recv(65536)
                with proxy._changed:
                    proxy._changed.wait_for(lambda: not self._held())
                    delay = proxy._latency + _JITTER.uniform(0.0, proxy._jitter)
                if self.closed:
                    return
                if delay > 0:
                    time.sleep(delay)
                if data and proxy._losing_replies and source is self.upstream:
                    continue  # the reply is lost on its way
                if not data:
                    target.shutdown(socket.SHUT_WR)  # pass the FIN on
                    return
                target.sendall(data)
        except OSError:
            if not self.closed:
                self.reset()  # one side failed: the other learns it as an RST
        finally:
            with proxy._changed:
                self._ended += 1
                done = self._ended == 2
            if done and not self.closed:
                self.closed = True
                for sock in (self.client, self.upstream):
                    with suppress(OSError):
                        sock.close()
                proxy._forget(self)


class FaultProxy:
    """A proxy in front of ``(host, port)``; ``port`` is its own (after ``start()``)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._changed = threading.Condition()
        self._links: list[Link] = []
        self._silent = False
        self._losing_replies = False
        self._latency = 0.0
        self._jitter = 0.0
        #: Every connection accepted so far.
        self.accepted = 0

    # -- life --------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.settimeout(ACCEPT_POLL)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and reset every connection."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._listener is not None:
            self._listener.close()
        self.heal()
        for link in self.links():
            link.reset()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = Link(self, client, upstream)
            with self._changed:
                self._links.append(link)
                self.accepted += 1
                self._changed.notify_all()
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=link._pump, args=(source, target), name="fault-proxy-pump", daemon=True
                ).start()

    def _forget(self, link: Link) -> None:
        with self._changed:
            if link in self._links:
                self._links.remove(link)
            self._changed.notify_all()

    # -- faults ------------------------------------------------------------------------------

    def links(self) -> list[Link]:
        with self._changed:
            return list(self._links)

    def link_from(self, port: int) -> Link:
        """The connection that reaches the server from the proxy's port ``port``."""
        for link in self.links():
            if link.upstream_address[1] == port:
                return link
        raise LookupError(f"no connection of the proxy comes from port {port}")

    def latency(self, seconds: float, jitter: float = 0.0) -> None:
        with self._changed:
            self._latency, self._jitter = seconds, jitter

    def silence(self) -> None:
        with self._changed:
            self._silent = True

    def lose_replies(self) -> None:
        with self._changed:
            self._losing_replies = True

    def reset(self) -> None:
        for link in self.links():
            link.reset()

    def heal(self) -> None:
        with self._changed:
            self._silent = self._losing_replies = False
            self._latency = self._jitter = 0.0
            for link in self._links:
                link.silent = False
            self._changed.notify_all()

    @contextmanager
    def silenced(self) -> Iterator[None]:
        """Silent for the block, healed after it."""
        self.silence()
        try:
            yield
        finally:
            self.heal()


@contextmanager
def through_proxy(alias: str = "default") -> Iterator[FaultProxy]:
    """The Django database ``alias`` reached through a new proxy for the block (every
    thread's connections: their settings are one dict); its connections are closed
    before and after, so that each is made anew through the proxy, then without it."""
    from django.db import connections

    settings = connections[alias].settings_dict
    host, port = settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432)
    saved = settings["HOST"], settings["PORT"]
    connections[alias].close()
    with FaultProxy(host, port) as proxy:
        settings["HOST"], settings["PORT"] = "127.0.0.1", str(proxy.port)
        try:
            yield proxy
        finally:
            settings["HOST"], settings["PORT"] = saved
            proxy.heal()
            with suppress(Exception):
                connections[alias].close()


def renewing_link(proxy: FaultProxy, timeout: float) -> Link:
    """The proxy's connection the lease keeper renews on (the only one that UPDATEs), once
    PostgreSQL shows it renewing (the proxy sits in front of the test's ``default``)."""
    from django.db import connections

    from .waiting import wait_until

    found: list[int] = []

    def renewing() -> bool:
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT client_port FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND query LIKE 'UPDATE %%'"
            )
            found[:] = [int(port) for (port,) in cursor.fetchall()]
        return len(found) == 1

    wait_until(renewing, timeout=timeout)
    return proxy.link_from(found[0])
