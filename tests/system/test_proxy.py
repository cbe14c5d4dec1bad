"""The fault layer (tests/support/proxy.py) in front of the real PostgreSQL and Redis."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ..support.proxy import FaultProxy
from ..support.services import POSTGRES_URL, REDIS_URL
from ..support.waiting import wait_until

pytestmark = pytest.mark.postgres


def _connect(proxy: FaultProxy) -> Any:
    import psycopg

    return psycopg.connect(
        host="127.0.0.1", port=proxy.port, user="postgres", dbname="postgres", autocommit=True
    )


def _postgres() -> FaultProxy:
    from urllib.parse import urlsplit

    parts = urlsplit(POSTGRES_URL)
    return FaultProxy(parts.hostname or "127.0.0.1", parts.port or 5432)


def test_forwards_both_ways() -> None:
    with _postgres() as proxy, _connect(proxy) as conn:
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)
        (port,) = conn.execute(
            "SELECT client_port FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        assert proxy.link_from(port).client_address[0] == "127.0.0.1"


def test_latency_delays_each_round_trip() -> None:
    with _postgres() as proxy, _connect(proxy) as conn:
        proxy.latency(0.2, jitter=0.1)
        started = time.monotonic()
        conn.execute("SELECT 1").fetchone()
        assert time.monotonic() - started >= 0.4  # there and back, each at least 0.2 s
        proxy.heal()
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_silence_holds_the_answer_until_heal() -> None:
    """A query sent into the silence waits (the socket stays open) and is answered once
    the network heals."""
    with _postgres() as proxy, _connect(proxy) as conn:
        conn.execute("SELECT 1")
        proxy.silence()
        answer: list[Any] = []
        thread = threading.Thread(target=lambda: answer.append(conn.execute("SELECT 3").fetchone()))
        thread.start()
        thread.join(1.0)
        assert thread.is_alive() and not answer, "answered through the silence"
        proxy.heal()
        thread.join(30)
        assert answer == [(3,)]


def test_a_single_link_is_silenced_alone() -> None:
    with _postgres() as proxy, _connect(proxy) as quiet, _connect(proxy) as other:
        (port,) = quiet.execute(
            "SELECT client_port FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        proxy.link_from(port).silence()
        done = threading.Event()

        def query() -> None:
            quiet.execute("SELECT 1")
            done.set()

        thread = threading.Thread(target=query)
        thread.start()
        assert other.execute("SELECT 4").fetchone() == (4,)
        assert not done.is_set()
        proxy.heal()
        thread.join(30)
        assert done.is_set()


def test_reset_breaks_the_connection_and_new_ones_work() -> None:
    import psycopg

    with _postgres() as proxy:
        conn = _connect(proxy)
        conn.execute("SELECT 1")
        proxy.reset()
        wait_until(lambda: not proxy.links())
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        conn.close()
        with _connect(proxy) as again:
            assert again.execute("SELECT 5").fetchone() == (5,)


def _redis_proxy() -> FaultProxy:
    from urllib.parse import urlsplit

    parts = urlsplit(REDIS_URL)
    return FaultProxy(parts.hostname or "127.0.0.1", parts.port or 6379)


def _redis_through(proxy: FaultProxy) -> Any:
    """A client of the shared Redis (its database) through ``proxy``; half a second to
    wait for a reply."""
    from urllib.parse import urlsplit

    import redis

    through = urlsplit(REDIS_URL)._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    return redis.Redis.from_url(through, socket_timeout=0.5)


def _heal_and_reconnect(proxy: FaultProxy, client: Any) -> None:
    """The proxy healed, its connections reset; the client answers on a new one."""
    proxy.heal()
    proxy.reset()
    client.connection_pool.disconnect()
    assert client.ping()


@pytest.mark.redis
def test_redis_through_the_proxy() -> None:
    import redis

    with _redis_proxy() as proxy:
        client = _redis_through(proxy)
        try:
            assert client.ping()
            proxy.silence()
            with pytest.raises(redis.TimeoutError):
                client.ping()
            _heal_and_reconnect(proxy, client)
        finally:
            client.close()


@pytest.mark.redis
def test_lost_replies_leave_the_command_applied(redis_prefix: str) -> None:
    """``lose_replies()``: the command reaches Redis and is applied, its reply never comes."""
    import redis

    direct = redis.Redis.from_url(REDIS_URL)
    with _redis_proxy() as proxy:
        client = _redis_through(proxy)
        try:
            assert client.ping()
            proxy.lose_replies()
            with pytest.raises(redis.TimeoutError):
                client.set(redis_prefix + ":lost", b"applied")
            wait_until(lambda: direct.get(redis_prefix + ":lost") == b"applied")
            _heal_and_reconnect(proxy, client)
        finally:
            client.close()
            direct.close()
