"""Connections redis-py opens, counted: a claim about "no retry loop, no back-off" is a
count of connection attempts, not a duration (which depends on the machine's speed)."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest


def port_of(url: str) -> int:
    """The port of a ``redis://host:port/db`` URL."""
    port = urlsplit(url).port
    assert port is not None, url
    return port


class Connects:
    """The connections redis-py opens (refused or not), by port, counted per thread: a
    request runs on one thread, so the difference around it is the request's own; and
    the most connections to one port that one ask for the master's address
    (``Sentinel.discover_master``) opened."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.total: Counter[int] = Counter()
        self.per_discovery: Counter[int] = Counter()

    def mine(self) -> Counter[int]:
        counted = getattr(self._local, "counted", None)
        if counted is None:
            counted = self._local.counted = Counter()
        return counted

    def count(self, port: int) -> None:
        self.mine()[port] += 1
        with self._lock:
            self.total[port] += 1

    def around(self, send: Callable[[], Any]) -> tuple[Any, Counter[int]]:
        """``send()``'s result and what it opened."""
        before = Counter(self.mine())
        result = send()
        return result, self.mine() - before

    @contextlib.contextmanager
    def opened(self) -> Iterator[Counter[int]]:
        """What the block opened (on this thread), filled in when it ends."""
        before = Counter(self.mine())
        opened: Counter[int] = Counter()
        try:
            yield opened
        finally:
            opened.update(self.mine() - before)

    def discovered(self, opened: Counter[int]) -> None:
        with self._lock:
            for port, n in opened.items():
                self.per_discovery[port] = max(self.per_discovery[port], n)


def counting(monkeypatch: pytest.MonkeyPatch) -> Connects:
    """Every TCP connection redis-py opens, and every discovery of the master, counted
    (until ``monkeypatch`` undoes it)."""
    from redis.connection import Connection
    from redis.sentinel import Sentinel

    counter = Connects()
    connect, discover = Connection._connect, Sentinel.discover_master

    def counted_connect(self: Connection) -> Any:
        counter.count(int(self.port))
        return connect(self)

    def counted_discover(self: Sentinel, service_name: str) -> Any:
        before = Counter(counter.mine())
        try:
            return discover(self, service_name)
        finally:
            counter.discovered(counter.mine() - before)

    monkeypatch.setattr(Connection, "_connect", counted_connect)
    monkeypatch.setattr(Sentinel, "discover_master", counted_discover)
    return counter
