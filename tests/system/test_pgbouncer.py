"""The library behind a real PgBouncer in transaction pooling (tests/support/pgbouncer.py).

In ``pool_mode = transaction`` a server connection serves one client per transaction:
whatever session state a request leaves on it (a ``SET``, a session advisory lock, a
``LISTEN``, a prepared statement, a ``WITH HOLD`` cursor) the next client inherits.
With ``pool_size = 1`` every client gets the same server connection, so the tests see
any leak: after requests through the pooler, for every strategy with and without
``WAIT``, each server connection has no channel, no advisory lock, no prepared statement,
no cursor, and the settings the library changes (``synchronous_commit``,
``lock_timeout``, ``statement_timeout``) at the server's values. The waiters' listener
must not ``LISTEN`` through the pooler: its waiters poll (and still get the replay), or
it listens on ``WAIT_LISTEN_DATABASE``, a direct connection, and NOTIFY wakes them.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest
from django.db import connections
from django.http import HttpResponse
from django.test import override_settings

from django_idempotency.protocol.engine import handle
from django_idempotency.protocol.replay import REPLAYED_HEADER
from django_idempotency.strategies import waiting
from tests.testapp.models import SideEffect

from ..protocol.test_engine import request
from ..support.pgbouncer import PrivatePgBouncer
from ..support.redis_servers import closed_port_url
from ..support.services import REDIS_URL

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.pgbouncer,
    pytest.mark.django_db(transaction=True),
]

#: The settings the library changes in its transactions (SET LOCAL / set_config(.., true)).
SETTINGS = ("synchronous_commit", "lock_timeout", "statement_timeout")


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PrivatePgBouncer]:
    """One server connection for every client: a leak shows in the next client."""
    server = PrivatePgBouncer(pool_size=1).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def wide_bouncer() -> Iterator[PrivatePgBouncer]:
    """Three server connections: a view's transaction holds one while a waiter polls."""
    server = PrivatePgBouncer(pool_size=3).start()
    yield server
    server.stop()


def through(server: PrivatePgBouncer) -> Iterator[str]:
    """The ``default`` alias points at the pooler (in every thread) for the test; yields
    the test database's name."""
    shared = connections.settings["default"]
    saved = (shared["HOST"], shared["PORT"])
    connections.close_all()
    shared["HOST"], shared["PORT"] = "127.0.0.1", str(server.port)
    try:
        yield str(shared["NAME"])
    finally:
        waiting.reset_listeners()
        connections.close_all()
        shared["HOST"], shared["PORT"] = saved


@pytest.fixture
def pooled(bouncer: PrivatePgBouncer, transactional_db: None) -> Iterator[str]:
    yield from through(bouncer)


@pytest.fixture
def widely_pooled(wide_bouncer: PrivatePgBouncer, transactional_db: None) -> Iterator[str]:
    yield from through(wide_bouncer)


def direct_url(database: str) -> str:
    return f"postgresql://postgres@127.0.0.1:5432/{database}"


def server_defaults(database: str) -> dict[str, str]:
    with psycopg.connect(direct_url(database), autocommit=True) as conn:
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in SETTINGS}  # type: ignore[index]


def session_state(server: PrivatePgBouncer, database: str) -> list[dict[str, Any]]:
    """What each of the pooler's server connections carries: ``pool_size`` clients each
    hold a transaction open at once, so each has a server connection of its own."""
    states = []
    with ExitStack() as stack:
        for _ in range(server.pool_size):
            conn = stack.enter_context(
                psycopg.connect(server.url(database), prepare_threshold=None)
            )
            row = conn.execute(
                "SELECT pg_backend_pid(), ARRAY(SELECT pg_listening_channels()),"
                " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                "  AND database = (SELECT oid FROM pg_database"
                "   WHERE datname = current_database())),"
                " (SELECT count(*) FROM pg_prepared_statements),"
                " (SELECT count(*) FROM pg_cursors)"
            ).fetchone()
            assert row is not None
            values = {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in SETTINGS}  # type: ignore[index]
            states.append(
                {
                    "pid": row[0],
                    "channels": list(row[1]),
                    "advisory_locks": row[2],
                    "prepared": row[3],
                    "cursors": row[4],
                    "settings": values,
                }
            )
    assert len({state.pop("pid") for state in states}) == server.pool_size
    return states


def clean(database: str) -> dict[str, Any]:
    return {
        "channels": [],
        "advisory_locks": 0,
        "prepared": 0,
        "cursors": 0,
        "settings": server_defaults(database),
    }


def created(label: str) -> Callable[[], HttpResponse]:
    def run() -> HttpResponse:
        SideEffect.objects.create(label=label)
        return HttpResponse(b'{"id": 1}', status=201, content_type="application/json")

    return run


STRATEGIES = [
    pytest.param({"STRATEGY": "db"}, id="db"),
    pytest.param({"STRATEGY": "advisory_lock"}, id="advisory_lock"),
    pytest.param(
        {"STRATEGY": "hybrid", "REDIS_URL": REDIS_URL}, marks=pytest.mark.redis, id="hybrid"
    ),
    pytest.param(
        {"STRATEGY": "redis", "REDIS_URL": REDIS_URL}, marks=pytest.mark.redis, id="redis"
    ),
    pytest.param({"STRATEGY": "redis", "REDIS_URL": closed_port_url()}, id="redis-db-fallback"),
]


@pytest.mark.usefixtures("forget_queued_drains")
@pytest.mark.parametrize("wait", [0, 0.3], ids=["no-wait", "wait"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_session_state_survives_a_request(
    pooled: str, bouncer: PrivatePgBouncer, strategy: dict[str, Any], wait: float
) -> None:
    """New keys (more than psycopg's prepare threshold), replays, a mismatch: afterwards
    the one server connection is as clean as a new one."""
    prefix = "pgb-" + uuid.uuid4().hex
    setting = {**strategy, "WAIT": wait, "WAIT_POLL_INTERVAL": 0.1, "REDIS_KEY_PREFIX": prefix}
    with override_settings(IDEMPOTENCY=setting):
        for number in range(7):
            key = f"{prefix}-{number}"
            assert handle(request(key), created(key)).status_code == 201
            replay = handle(request(key), created(key))
            assert replay.status_code == 201 and replay[REPLAYED_HEADER] == "true"
        assert handle(request(key, body={"amount": 1}), created(key)).status_code == 422
        connections.close_all()
        assert SideEffect.objects.filter(label__startswith=prefix).count() == 7
    connections.close_all()
    assert session_state(bouncer, pooled) == [clean(pooled)]


def test_the_listener_does_not_listen_through_the_pooler(
    pooled: str, bouncer: PrivatePgBouncer
) -> None:
    """It finds the pooler between itself and the backend, gives up (its waiters poll)
    and leaves no LISTEN on the server connection."""
    listener = waiting.postgres_listener("default")
    assert listener.ensure(timeout=5) is False
    waiting_until = time.monotonic() + 5
    while listener.gave_up != os.getpid() and time.monotonic() < waiting_until:
        time.sleep(0.01)
    assert listener.gave_up == os.getpid()
    assert listener.ensure(timeout=5) is False  # at once: no new connection
    assert session_state(bouncer, pooled)[0]["channels"] == []


def race_a_waiter(setting: dict[str, Any], hold: float) -> tuple[Any, float]:
    """A first request holds its key (its view runs ``hold`` seconds after the duplicate
    came); the duplicate WAITs. Returns the duplicate's response and its wait."""
    key = "pgb-wait-" + uuid.uuid4().hex
    entered, go = threading.Event(), threading.Event()
    answers: dict[str, Any] = {}

    def first() -> HttpResponse:
        entered.set()
        go.wait(20)
        return created(key)()

    def call(name: str, view: Callable[[], HttpResponse]) -> None:
        try:
            answers[name] = handle(request(key), view)
        finally:
            connections.close_all()

    # Once, here: override_settings entered and left by two threads at once restores the
    # settings out of order, and leaves ``setting`` in place for the tests that follow.
    with override_settings(IDEMPOTENCY=setting):
        owner = threading.Thread(target=call, args=("first", first))
        owner.start()
        assert entered.wait(20)
        duplicate = threading.Thread(target=call, args=("duplicate", created(key)))
        started = time.monotonic()
        duplicate.start()
        time.sleep(hold)
        go.set()
        owner.join(30)
        duplicate.join(30)
        waited = time.monotonic() - started
    assert answers["first"].status_code == 201
    assert SideEffect.objects.filter(label=key).count() == 1
    return answers["duplicate"], waited


def test_a_waiter_behind_the_pooler_gets_the_replay_by_polling(
    widely_pooled: str, wide_bouncer: PrivatePgBouncer
) -> None:
    response, waited = race_a_waiter({"WAIT": 10, "WAIT_POLL_INTERVAL": 0.2}, hold=1.0)
    assert response.status_code == 201 and response[REPLAYED_HEADER] == "true"
    assert waited < 5
    assert waiting.postgres_listener("default").gave_up == os.getpid()
    assert session_state(wide_bouncer, widely_pooled) == [clean(widely_pooled)] * 3


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize("how", ["dsn", "alias"])
def test_a_direct_listener_is_woken_by_notify_through_the_pooler(
    widely_pooled: str, wide_bouncer: PrivatePgBouncer, how: str, settings: Any
) -> None:
    """WAIT_LISTEN_DATABASE: the listener LISTENs on the direct connection; the NOTIFY
    sent through the pooler in the completing transaction wakes the waiter long before
    its 30-second poll."""
    value = direct_url(widely_pooled)
    if how == "alias":
        settings.DATABASES = {
            **settings.DATABASES,
            "listen": {**connections.settings["default"], "HOST": "127.0.0.1", "PORT": "5432"},
        }
        connections.settings["listen"] = settings.DATABASES["listen"]
        value = "listen"
    setting = {"WAIT": 20, "WAIT_POLL_INTERVAL": 30, "WAIT_LISTEN_DATABASE": value}
    try:
        listener = direct_listener_runs(setting, widely_pooled)
        response, waited = race_a_waiter(setting, hold=1.0)
    finally:
        waiting.reset_listeners()
        connections.settings.pop("listen", None)
    assert response.status_code == 201 and response[REPLAYED_HEADER] == "true"
    assert waited < 10
    assert listener.gave_up == 0
    assert session_state(wide_bouncer, widely_pooled) == [clean(widely_pooled)] * 3


def direct_listener_runs(setting: dict[str, Any], database: str) -> waiting.Listener:
    """The listener is ready, and its LISTEN is on a direct backend of the database."""
    with override_settings(IDEMPOTENCY=setting):
        listener = waiting.postgres_listener("default")
        assert listener.ensure(timeout=10) is True
        with psycopg.connect(direct_url(database), autocommit=True) as conn:
            listening = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query = %s",
                [f"LISTEN {waiting.CHANNEL}"],
            ).fetchone()
        assert listening == (1,)
    return listener


def test_the_connection_is_told_direct_or_pooled(bouncer: PrivatePgBouncer) -> None:
    """Against the real servers: direct over TCP and over the Unix socket is direct;
    PgBouncer over TCP and over its Unix socket is not."""
    with psycopg.connect(direct_url("postgres"), autocommit=True) as conn:
        assert waiting.direct_connection(conn) == ""
    with psycopg.connect(bouncer.url("postgres"), autocommit=True) as conn:
        assert "pooler" in waiting.direct_connection(conn)
    unix = dict(port=bouncer.port, user="postgres", dbname="postgres", autocommit=True)
    with psycopg.connect(host=bouncer.socket_dir, **unix) as conn:  # type: ignore[arg-type]
        assert waiting.direct_connection(conn) != ""
    if os.path.exists("/var/run/postgresql/.s.PGSQL.5432"):
        direct = {**unix, "port": 5432}
        with psycopg.connect(host="/var/run/postgresql", **direct) as conn:  # type: ignore[arg-type]
            assert waiting.direct_connection(conn) == ""
