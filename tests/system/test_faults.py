"""The fault matrix: every strategy against every fault point, on the real servers.

Each cell sends real requests through the DRF mixin (and, where the entry point
matters, the ``@idempotent`` decorator) and asserts the invariant, not a status
alone (:func:`check`):

* at most one execution per key has committed its writes;
* every replay, and every success the client was told about, is the response of the
  execution that committed;
* no 5xx but the documented 503s (and the view's own error where the view raised).

docs/how-it-works.md has the table of what the client sees in each cell; the docs
build checks it against ``CELLS`` below.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from redis.cluster import RedisCluster
from rest_framework.test import APIClient

from django_idempotency import strategies
from django_idempotency.models import IdempotencyKey
from django_idempotency.store import partitions
from django_idempotency.store.status import IN_PROGRESS
from django_idempotency.strategies.hybrid import HybridStrategy
from django_idempotency.strategies.redis import store as redis_store
from django_idempotency.strategies.redis.store import RedisRecord, encode_record, get_store
from tests.testapp.models import SideEffect

from ..support import faults
from ..support.api import replayed
from ..support.assertions import problem_slug
from ..support.faults import post
from ..support.mariadb import with_mariadb
from ..support.proxy import FaultProxy, through_proxy
from ..support.redis_servers import RedisClusterNodes, RedisServer
from ..support.waiting import wait_until

pytestmark = [
    pytest.mark.urls("tests.support.faults"),
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
]

#: Hourly partitions of the key table for the ``db-partitioned`` column.
PARTITION_INTERVAL = 3600

#: The documented 503 problem types.
DOCUMENTED_503 = {"store-unavailable", "transient-conflict", "database-unavailable"}

#: Every cell of the matrix, as docs/how-it-works.md names it (checked by docs/hooks.py).
CELLS = (
    "unstorable-response",
    "on-commit-hook-raises",
    "api-exception",
    "api-exception-then-duplicate",
    "exception-in-view",
    "lease-lost",
    "redis-lost-during-view",
    "redis-lost-after-completion",
    "redis-down-during-view",
    "redis-down-after-completion",
    "reuse-after-redis-lost",
    "connection-lost-during-view",
    "connection-lost-during-commit",
    "worker-killed-during-view",
    "strategy-switch-undrained",
    "database-slow",
    "database-silent-during-claim",
    "database-silent-during-completion",
    "database-reset-during-completion",
    "redis-slow",
    "redis-cluster-slow",
    "redis-silent-during-claim",
    "redis-hung-during-claim",
    "redis-reply-lost-during-claim",
    "redis-reply-lost-during-completion",
    "redis-cluster-hung-during-claim",
    "redis-cluster-silent-during-claim",
    "redis-cluster-reply-lost-during-claim",
)


@dataclass
class Setup:
    name: str
    alias: str
    redis: Any = None

    @property
    def uses_redis(self) -> bool:
        return self.name.startswith(("redis", "hybrid"))

    @property
    def steps(self) -> bool:
        """The view runs in steps (docs/steps.md): its write is a local step, which
        commits with the key's recovery point before the view goes on."""
        return self.name.endswith("-steps")


def _param(name: str, *marks: Any) -> Any:
    return pytest.param(name, marks=list(marks), id=name)


ALL = [
    _param("db-postgres", pytest.mark.postgres),
    # The key table partitioned by expiry (PARTITION_INTERVAL): the claim and the takeover
    # under the key's advisory lock, a takeover into a new row.
    _param("db-partitioned", pytest.mark.postgres),
    _param("db-sqlite"),
    # MariaDB's database only for its own cells (a flush of MariaDB after every test of the
    # matrix would cost more than the cells themselves).
    _param(
        "db-mariadb",
        pytest.mark.mariadb,
        pytest.mark.django_db(transaction=True, databases=with_mariadb("default", "sqlite")),
    ),
    _param("advisory_lock", pytest.mark.postgres),
    _param("redis", pytest.mark.redis, pytest.mark.postgres),
    _param("redis-cluster", pytest.mark.redis_cluster, pytest.mark.postgres),
    _param("hybrid", pytest.mark.redis, pytest.mark.postgres),
    _param("hybrid-after-loss", pytest.mark.redis, pytest.mark.postgres),
    _param("hybrid-cluster", pytest.mark.redis_cluster, pytest.mark.postgres),
    _param("custom", pytest.mark.postgres),  # tests/examples/custom_strategy.py, in docs/api.md
    # The views in steps (tests/support/faults.py): the two strategies that run them.
    _param("db-steps", pytest.mark.postgres),
    _param("advisory_lock-steps", pytest.mark.postgres),
]
#: The strategies on the private Redis node (which a test may flush or kill).
NODE = [p for p in ALL if p.values[0] in ("redis", "hybrid", "hybrid-after-loss")]
#: The strategies on the private Redis Cluster.
CLUSTER = [p for p in ALL if p.values[0].endswith("-cluster")]
#: The same and the cluster ones (which a test may flush, primary by primary).
REDIS = [*NODE, *CLUSTER]


def configure(request: pytest.FixtureRequest, settings: Any, prefix: str, name: str) -> Setup:
    value: dict[str, Any] = {"MAX_STORED_BODY_SIZE": faults.LIMIT}
    alias = "default"
    server: Any = None
    faults.stepped = name.endswith("-steps")
    if name in ("db-postgres", "db-steps"):
        value["STRATEGY"] = "db"
    elif name == "db-partitioned":
        value.update(STRATEGY="db", PARTITION_INTERVAL=PARTITION_INTERVAL)
    elif name == "db-sqlite":
        value.update(STRATEGY="db", DATABASE="sqlite")
        alias = "sqlite"
    elif name == "db-mariadb":
        value.update(STRATEGY="db", DATABASE="mariadb")
        alias = "mariadb"
    elif name in ("advisory_lock", "advisory_lock-steps"):
        value["STRATEGY"] = "advisory_lock"
    elif name == "custom":
        value["STRATEGY"] = "tests.examples.custom_strategy.MemoryStrategy"
    else:
        if name.endswith("-cluster"):
            server = request.getfixturevalue("redis_cluster")
            value["REDIS_CLUSTER"] = True
        else:
            server = request.getfixturevalue("running_private_redis")
        value.update(
            STRATEGY="redis" if name.startswith("redis") else "hybrid",
            REDIS_URL=server.url,
            REDIS_KEY_PREFIX=prefix,
            REDIS_SOCKET_TIMEOUT=0.25,
            HYBRID_DB_CHECK="after_loss" if name == "hybrid-after-loss" else "always",
        )
    settings.IDEMPOTENCY = value
    strategies.reset()
    redis_store.reset_clients()
    if name == "db-partitioned":
        assert partitions.convert(alias, interval=PARTITION_INTERVAL)
        request.addfinalizer(lambda: partitions.undo(alias))
    return Setup(name, alias, server)


@pytest.fixture(params=ALL)
def setup(
    request: pytest.FixtureRequest,
    settings: Any,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Setup]:
    monkeypatch.setattr(HybridStrategy, "queue_drain", False)  # no Celery traffic here
    faults.reset()
    yield configure(request, settings, redis_prefix, str(request.param))
    faults.reset()
    strategies.reset()
    redis_store.reset_clients()


@pytest.fixture
def client(api: APIClient) -> APIClient:
    """The ``api`` client, answering a view's exception with a 500 instead of raising it."""
    api.raise_request_exception = False
    return api


def committed(setup: Setup, key: str) -> list[int]:
    return list(
        SideEffect.objects.using(setup.alias).filter(label=key).values_list("pk", flat=True)
    )


def check(setup: Setup, key: str, *responses: Any, view_failed: bool = False) -> int | None:
    """The invariant over every response a key got; returns the committed execution."""
    effects = committed(setup, key)
    assert len(effects) <= 1, f"{len(effects)} committed executions of one key"
    effect = effects[0] if effects else None
    for response in responses:
        status = response.status_code
        if status >= 500:
            if status == 503:
                assert problem_slug(response) in DOCUMENTED_503, response.content
            else:
                assert view_failed, f"{status} although the view did not fail"
                continue
        if problem_slug(response) == "response-not-stored":
            assert effect is not None, "response-not-stored for a key whose writes rolled back"
            continue
        if problem_slug(response) is not None:
            continue
        named = faults.body_of(response).get("effect")
        named = None if named is None else int(named)  # DRF's error details are strings
        if replayed(response):
            assert named == effect or effect is None, "a replay of another execution"
        elif 200 <= status < 300:
            assert named == effect, "the client was told of a success that did not commit"
    return effect


# -- the view's own faults -------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["drf", "fn"])
@pytest.mark.parametrize("kind", ["stream", "file", "large"])
def test_unstorable_response(setup: Setup, client: APIClient, kind: str, entry: str) -> None:
    """The view's writes commit; a retry is told the response was not kept, never runs."""
    key = faults.new_key()
    faults.plan.append(kind)
    first = post(client, key, entry)
    assert first.status_code == 201
    assert faults.body_of(first)["effect"] is not None
    retry = post(client, key, entry)
    assert retry.status_code == 409 and problem_slug(retry) == "response-not-stored"
    assert json.loads(retry.content)["original_status"] == 201
    assert "Retry-After" not in retry.headers
    assert check(setup, key, first, retry) is not None


@pytest.mark.parametrize("entry", ["drf", "fn"])
def test_on_commit_hook_raises(setup: Setup, client: APIClient, entry: str) -> None:
    """A hook that raises after COMMIT surfaces as the view's error; the key stays
    completed and the retry replays the committed response."""
    key = faults.new_key()
    faults.plan.append("hook")
    first = post(client, key, entry)
    assert first.status_code == 500
    retry = post(client, key, entry)
    assert retry.status_code == 201 and replayed(retry)
    effect = check(setup, key, first, retry, view_failed=True)
    assert effect is not None and faults.body_of(retry)["effect"] == effect


@pytest.mark.parametrize("atomic_requests", [False, True], ids=["plain", "atomic_requests"])
def test_api_exception(
    setup: Setup, client: APIClient, monkeypatch: pytest.MonkeyPatch, atomic_requests: bool
) -> None:
    """A DRF APIException is stored and replayed; with ATOMIC_REQUESTS DRF rolls the
    view's writes back, and the response is stored after the rollback. A view in steps
    keeps the write its step committed before the exception."""
    monkeypatch.setitem(connections[setup.alias].settings_dict, "ATOMIC_REQUESTS", atomic_requests)
    key = faults.new_key()
    faults.plan.append("refuse")
    first = post(client, key)
    assert first.status_code == 409 and problem_slug(first) is None
    retry = post(client, key)
    assert retry.status_code == 409 and replayed(retry)
    assert retry.content == first.content
    effect = check(setup, key, first, retry)
    assert (effect is None) is (atomic_requests and not setup.steps)


def test_api_exception_then_duplicate(
    setup: Setup, client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's view refuses after a second (DRF rolls it back); duplicate B is sent once A's
    view has begun (a fixed delay let B claim first on a loaded machine). Whatever B gets
    (409 while A holds the key, or, under advisory_lock, a run of its own after A's
    rollback), A's late store never overwrites a record another execution completed, and
    C replays the execution that committed. In steps, A's write committed with its step
    before the refusal: A completed the key, and B and C see A's."""
    monkeypatch.setitem(connections[setup.alias].settings_dict, "ATOMIC_REQUESTS", True)
    key = faults.new_key()
    faults.plan.extend(["slow_refuse", "ok"])
    results: dict[str, Any] = {}

    def send(name: str) -> None:
        try:
            results[name] = post(client, key)
        finally:
            connections.close_all()

    a = threading.Thread(target=send, args=("a",))
    b = threading.Thread(target=send, args=("b",))
    a.start()
    assert faults.view_started.wait(30), "A's view never ran"
    b.start()
    a.join(30)
    b.join(30)
    c = post(client, key)
    effect = check(setup, key, results["a"], results["b"], c)
    if setup.steps:
        assert effect is not None and results["b"].status_code == 409
        assert c.status_code == 409 and replayed(c) and c.content == results["a"].content
    elif effect is not None:  # B ran after A's rollback: C replays B's 201
        assert results["b"].status_code == 201
        assert c.status_code == 201 and replayed(c)
    else:
        assert c.status_code == 409 and replayed(c) and c.content == results["a"].content


@pytest.mark.parametrize("entry", ["drf", "fn"])
@pytest.mark.parametrize("step", ["raise_before", "raise_after"])
def test_exception_in_view(setup: Setup, client: APIClient, step: str, entry: str) -> None:
    """An exception before or after the view's writes rolls them back and releases the
    key: the retry runs the view once, the next one replays it. In steps, a write whose
    step committed before the exception stays, the key is given back with it, and the
    retry resumes after it (the step's stored result, not a second write)."""
    key = faults.new_key()
    faults.plan.append(step)
    first = post(client, key, entry)
    assert first.status_code == 500
    kept = committed(setup, key)
    assert len(kept) == (1 if setup.steps and step == "raise_after" else 0), kept
    second = post(client, key, entry)
    assert second.status_code == 201 and not replayed(second)
    third = post(client, key, entry)
    assert third.status_code == 201 and replayed(third)
    effect = check(setup, key, first, second, third, view_failed=True)
    assert effect is not None and kept in ([], [effect])


@pytest.mark.parametrize(
    "setup", [p for p in ALL if not p.values[0].startswith("advisory_lock")], indirect=True
)  # advisory_lock has no lease to lose: the lock holds the key (in steps, the session's)
def test_lease_lost(setup: Setup, client: APIClient) -> None:
    """Another owner takes the key while the view runs: this request's writes never
    commit beside the other owner's."""
    key = faults.new_key()

    def steal(key: str) -> None:
        if setup.name == "custom":
            memory: Any = strategies.get_strategy()
            for (_scope, name), record in memory.records.items():
                if name == key:
                    record.token = uuid.uuid4().hex
        elif setup.uses_redis:
            store = get_store()
            row = IdempotencyKey.objects.using(setup.alias).filter(key=key).first()
            scope = row.scope if row is not None else _scope_of(client)
            record = RedisRecord(IN_PROGRESS, "f" * 64, uuid.uuid4().hex, None)
            store.client.set(store.record_key(scope, key), encode_record(record), px=60_000)
        else:

            def other_owner() -> None:
                IdempotencyKey.objects.using(setup.alias).filter(key=key).update(
                    claim_token=uuid.uuid4(), locked_at=timezone.now()
                )
                connections.close_all()

            thread = threading.Thread(target=other_owner)
            thread.start()
            thread.join(10)

    faults.interference.append(steal)
    faults.plan.append("interfere")
    first = post(client, key)
    effect = check(setup, key, first)
    if setup.name.startswith("hybrid"):
        # The outbox, not the Redis token, fences hybrid: this commit came first and wins.
        assert first.status_code == 201 and effect is not None
    else:
        assert first.status_code == 409 and problem_slug(first) == "lease-lost"
        assert effect is None


def _scope_of(client: APIClient) -> str:
    user = client.handler._force_user  # type: ignore[attr-defined]  # DRF internals
    return f"user:{user.pk}"


# -- Redis loses or refuses the key ----------------------------------------------------------


def _flush(setup: Setup) -> None:
    import redis

    if setup.name.endswith("-cluster"):
        for port in setup.redis.primaries():
            redis.Redis(host="127.0.0.1", port=port).flushall()
        return
    redis.Redis.from_url(setup.redis.url).flushall()


@pytest.mark.parametrize("setup", REDIS, indirect=True)
def test_redis_lost_during_view(setup: Setup, client: APIClient) -> None:
    key = faults.new_key()
    faults.interference.append(lambda key: _flush(setup))
    faults.plan.append("interfere")
    first = post(client, key)
    retry = post(client, key)
    effect = check(setup, key, first, retry)
    if setup.name.startswith("redis"):
        # The completion's compare-and-set finds no claim: rolled back, the retry runs.
        assert first.status_code == 409 and problem_slug(first) == "lease-lost"
        assert retry.status_code == 201 and not replayed(retry) and effect is not None
    else:
        assert first.status_code == 201 and retry.status_code == 201 and replayed(retry)


@pytest.mark.parametrize("setup", REDIS, indirect=True)
def test_redis_lost_after_completion(setup: Setup, client: APIClient) -> None:
    key = faults.new_key()
    first = post(client, key)
    _flush(setup)
    retry = post(client, key)
    if setup.name.startswith("redis"):
        # Documented limit (docs/redis.md): a key that Redis forgets runs again.
        assert retry.status_code == 201 and not replayed(retry)
        assert len(committed(setup, key)) == 2
        return
    assert retry.status_code == 201 and replayed(retry)
    check(setup, key, first, retry)


@pytest.mark.parametrize("setup", NODE, indirect=True)
def test_redis_down_during_view(setup: Setup, client: APIClient) -> None:
    server: RedisServer = setup.redis
    key = faults.new_key()
    faults.interference.append(lambda key: server.kill())
    faults.plan.append("interfere")
    try:
        first = post(client, key)
        retry = post(client, key)  # Redis still down: the db strategy takes the request
    finally:
        server.start()
        redis_store.reset_clients()
    effect = check(setup, key, first, retry)
    if setup.name == "redis":
        assert first.status_code == 503 and problem_slug(first) == "store-unavailable"
        assert retry.status_code == 201 and not replayed(retry) and effect is not None
    else:
        after = post(client, key)  # Redis is back, without the key: found in the database
        assert first.status_code == 201 and effect is not None
        assert retry.status_code == 201 and replayed(retry)
        assert after.status_code == 201 and replayed(after)
        check(setup, key, first, retry, after)


@pytest.mark.parametrize("setup", NODE, indirect=True)
def test_redis_down_after_completion(setup: Setup, client: APIClient) -> None:
    server: RedisServer = setup.redis
    key = faults.new_key()
    first = post(client, key)
    server.kill()
    try:
        retry = post(client, key)
    finally:
        server.start()
        redis_store.reset_clients()
    if setup.name == "redis":
        # Documented limit (docs/redis.md): the db fallback does not see Redis's keys.
        assert retry.status_code == 201 and not replayed(retry)
        assert len(committed(setup, key)) == 2
        return
    assert retry.status_code == 201 and replayed(retry)
    check(setup, key, first, retry)


@pytest.mark.parametrize(
    "setup", [p for p in REDIS if p.values[0].startswith("hybrid")], indirect=True
)
def test_reuse_after_redis_lost(setup: Setup, client: APIClient) -> None:
    """Redis lost a completed key, and a reuse of the key (another body) claimed it in
    Redis first: the original's retry still gets its replay, never a 422, because the
    database's completed record wins over a foreign in-progress claim."""
    key = faults.new_key()
    first = post(client, key)
    _flush(setup)
    store = get_store()
    reuse = RedisRecord(IN_PROGRESS, "e" * 64, uuid.uuid4().hex, None)
    store.client.set(store.record_key(_scope_of(client), key), encode_record(reuse), px=60_000)
    retry = post(client, key)
    assert retry.status_code == 201 and replayed(retry)
    check(setup, key, first, retry)


#: The servers whose connection a test can terminate (not SQLite's file).
SERVERS = [p for p in ALL if p.values[0] not in ("db-sqlite",)]
#: The same on PostgreSQL (the slow COMMIT is a PostgreSQL trigger).
POSTGRES = [p for p in SERVERS if p.values[0] != "db-mariadb"]


def after_connection_loss(setup: Setup, client: APIClient, key: str, first: Any) -> None:
    """``first`` lost its connection: a 503, nothing committed; the retries run the view
    once, or get 409 while a claim the dead connection could not give back waits for its
    lease to go stale, and never replay writes that rolled back."""
    connections[setup.alias].close_if_unusable_or_obsolete()  # as request_finished does
    assert first.status_code == 503 and problem_slug(first) == "database-unavailable"
    assert committed(setup, key) == []
    retry = post(client, key)
    again = post(client, key)
    assert retry.status_code in (201, 409)
    assert not replayed(retry), "a replay of writes that rolled back"
    check(setup, key, first, retry, again)


@pytest.mark.parametrize("setup", SERVERS, indirect=True)
def test_connection_lost_during_view(setup: Setup, client: APIClient) -> None:
    """The view's PostgreSQL backend (MariaDB connection) is terminated while it runs: 503
    database-unavailable, nothing committed; the retry never runs it twice."""

    def terminate(key: str) -> None:
        with connections[setup.alias].cursor() as cursor:
            if connections[setup.alias].vendor != "mysql":
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
                return
            cursor.execute("SELECT CONNECTION_ID()")
            (thread_id,) = cursor.fetchone()
        from ..support.mariadb import database_url_of, mysql_connect

        with closing(mysql_connect(database_url_of(setup.alias))) as admin:
            admin.cursor().execute(f"KILL CONNECTION {int(thread_id)}")

    faults.interference.append(terminate)
    faults.plan.append("interfere")
    key = faults.new_key()
    after_connection_loss(setup, client, key, post(client, key))


SLOW_COMMIT = """
CREATE OR REPLACE FUNCTION idem_test_slow_commit() RETURNS trigger AS $$
BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS idem_test_slow_commit ON {table};
CREATE CONSTRAINT TRIGGER idem_test_slow_commit AFTER INSERT ON {table}
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.label LIKE 'fault-commit-%') EXECUTE FUNCTION idem_test_slow_commit();
"""


@pytest.fixture
def slow_commit() -> Iterator[None]:
    """COMMIT of a transaction that wrote a ``fault-commit-*`` SideEffect row takes 2 s
    (a deferred constraint trigger), long enough to terminate the backend inside it."""
    table = SideEffect._meta.db_table
    with connections["default"].cursor() as cursor:
        cursor.execute(SLOW_COMMIT.format(table=table))
    yield
    with connections["default"].cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS idem_test_slow_commit ON {table}")


def _terminate_the_commit(done: threading.Event) -> None:
    """From another connection: terminate the backend that is running COMMIT."""
    import psycopg

    from ..support.services import postgres_url

    name = connections["default"].settings_dict["NAME"]
    url = postgres_url()
    assert url is not None
    with psycopg.connect(url, autocommit=True) as admin:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not done.is_set():
            row = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND state = 'active' "
                # Django's COMMIT, or the completion that also commits (``WITH … stored AS
                # (…) …; COMMIT``, which pg_stat_activity may show cut short)
                "AND (query = 'COMMIT' OR query LIKE 'WITH %%stored AS (%%') "
                "AND pid <> pg_backend_pid()",
                [name],
            ).fetchone()
            if row is not None:
                admin.execute("SELECT pg_terminate_backend(%s)", [row[0]])
                return
            time.sleep(0.02)


@pytest.mark.parametrize("setup", POSTGRES, indirect=True)
def test_connection_lost_during_commit(setup: Setup, client: APIClient, slow_commit: None) -> None:
    """The backend is terminated while COMMIT runs (a deferred trigger holds it there):
    the transaction did not commit, the client gets a 503, and no retry ever sees a
    completed record for writes that rolled back."""
    key = "fault-commit-" + uuid.uuid4().hex
    done = threading.Event()
    killer = threading.Thread(target=_terminate_the_commit, args=(done,))
    killer.start()
    try:
        first = post(client, key)
    finally:
        done.set()
        killer.join(30)
    after_connection_loss(setup, client, key, first)


# -- PostgreSQL slow or silent (a proxy between the application and the server) -----------------

#: The strategies whose claim and completion are the library's statements on PostgreSQL.
SILENT = [
    p
    for p in ALL
    if p.values[0]
    in ("db-postgres", "db-partitioned", "advisory_lock", "db-steps", "advisory_lock-steps")
]
#: The same, and those whose view and outbox write there.
SLOW = [*SILENT, *(p for p in ALL if p.values[0] in ("redis", "hybrid"))]


@pytest.fixture
def proxied(
    setup: Setup, settings: Any, client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FaultProxy, faults.Requester]]:
    """PostgreSQL through a proxy, on persistent connections with libpq's connect_timeout;
    DATABASE_TIMEOUT 1 s and a 3 s lease; a requester connected through the proxy."""
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "DATABASE_TIMEOUT": 1, "LOCK_TIMEOUT": 3}
    strategies.reset()
    database = connections["default"].settings_dict
    monkeypatch.setitem(database, "CONN_MAX_AGE", 600)
    with through_proxy("default") as proxy:
        # Its first connection is made while the proxy still answers, however long a busy
        # machine takes; the connections made after it are bounded by connect_timeout.
        requester = faults.Requester(client)
        monkeypatch.setitem(database, "OPTIONS", {**database["OPTIONS"], "connect_timeout": 2})
        try:
            yield proxy, requester
        finally:
            proxy.heal()
            requester.stop()


def runs_once_when_slow(setup: Setup, proxy: FaultProxy, requester: faults.Requester) -> None:
    """Every round trip through ``proxy`` 20 to 60 ms late: the view runs once, the retry
    replays it."""
    proxy.latency(0.02, jitter=0.04)
    key = faults.new_key()
    first = requester.ask(key)
    retry = requester.ask(key)
    assert first.status_code == 201 and not replayed(first)
    assert retry.status_code == 201 and replayed(retry)
    assert faults.runs[key] == 1
    check(setup, key, first, retry)


@pytest.mark.parametrize("setup", SLOW, indirect=True)
def test_database_slow(setup: Setup, proxied: tuple[FaultProxy, faults.Requester]) -> None:
    """Every round trip to PostgreSQL 20 to 60 ms late: the view runs once, the retry
    replays it."""
    runs_once_when_slow(setup, *proxied)


@pytest.mark.parametrize("setup", SILENT, indirect=True)
def test_database_silent_during_claim(
    setup: Setup, proxied: tuple[FaultProxy, faults.Requester]
) -> None:
    """PostgreSQL falls silent (the sockets open) before the claim: a 503 after
    DATABASE_TIMEOUT, the duplicate's new connection a 503 after connect_timeout; after the
    network heals the view runs once."""
    proxy, requester = proxied
    key = faults.new_key()
    proxy.silence()
    first = requester.ask(key)
    duplicate = requester.ask(key)
    proxy.heal()
    final = faults.settle(requester, key)
    again = requester.ask(key)
    assert first.status_code == 503 and duplicate.status_code == 503
    assert final.status_code == 201 and not replayed(final)
    assert again.status_code == 201 and replayed(again)
    assert faults.runs[key] == 1
    check(setup, key, first, duplicate, final, again)


@pytest.mark.parametrize("setup", SILENT, indirect=True)
def test_database_silent_during_completion(
    setup: Setup, proxied: tuple[FaultProxy, faults.Requester]
) -> None:
    """PostgreSQL falls silent after the view's write, before its completion and COMMIT
    are answered: a 503 database-unavailable after DATABASE_TIMEOUT (the COMMIT's outcome
    is unknown, and the answer says a committed request is replayed). When the network
    heals, the held COMMIT and the end of the client's connection (which gave up) reach
    the server in an order no one chooses: the COMMIT lands
    and the retry replays the one run of the view, or it does not and the retry runs the
    view once more, which commits. Either way one execution commits and every success
    names it."""
    proxy, requester = proxied
    key = faults.new_key()
    faults.interference.append(lambda _key: proxy.silence())
    faults.plan.append("interfere_late")
    first = requester.ask(key)
    duplicate = requester.ask(key)
    proxy.heal()
    final = faults.settle(requester, key)
    assert first.status_code == 503 and problem_slug(first) == "database-unavailable"
    assert duplicate.status_code in (409, 503)
    assert final.status_code == 201, final.content
    effect = check(setup, key, first, duplicate, final)
    assert effect is not None
    # The first run committed and is replayed, or it rolled back and the retry's committed.
    assert faults.runs[key] == (1 if replayed(final) else 2), final.content


@pytest.mark.parametrize("setup", SILENT, indirect=True)
def test_database_reset_during_completion(
    setup: Setup, proxied: tuple[FaultProxy, faults.Requester]
) -> None:
    """The connection is reset (an RST from the path) after the view's write, before its
    completion is sent: a 503 database-unavailable, nothing committed; the retries run the
    view once more, and only that run commits. In steps, the write committed with its
    step before the reset: the retry resumes after it, and writes nothing more."""
    proxy, requester = proxied
    key = faults.new_key()
    faults.interference.append(lambda _key: proxy.reset())
    faults.plan.append("interfere_late")
    first = requester.ask(key)
    assert first.status_code == 503 and problem_slug(first) == "database-unavailable"
    assert len(committed(setup, key)) == (1 if setup.steps else 0)
    final = faults.settle(requester, key)
    again = requester.ask(key)
    assert final.status_code == 201 and not replayed(final), final.content
    assert again.status_code == 201 and replayed(again)
    assert faults.runs[key] == 2 and len(committed(setup, key)) == 1
    check(setup, key, first, final, again)


# -- Redis slow, silent or hung --------------------------------------------------------------


@pytest.fixture
def redis_proxied(
    setup: Setup, settings: Any, client: APIClient
) -> Iterator[tuple[FaultProxy, faults.Requester]]:
    """The private Redis reached through a proxy; a requester (its database direct)."""
    with FaultProxy("127.0.0.1", setup.redis.port) as proxy:
        settings.IDEMPOTENCY = {
            **settings.IDEMPOTENCY,
            "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0",
            "LOCK_TIMEOUT": 3,
        }
        strategies.reset()
        redis_store.reset_clients()
        requester = faults.Requester(client)
        try:
            yield proxy, requester
        finally:
            proxy.heal()
            requester.stop()
            redis_store.reset_clients()


def after_redis_fault(setup: Setup, requester: faults.Requester, key: str, *early: Any) -> None:
    """Once Redis answers again: the key settles to one run of the view, replayed after;
    under ``redis``, whose ``db`` fallback ran the view in the outage (for a request whose
    claim was never sent), the documented limit instead (docs/redis.md): Redis does not see
    that key afterwards, so it runs once more."""
    final = faults.settle(requester, key)
    again = requester.ask(key)
    for answer in early:
        assert answer.status_code in (201, 409, 503), answer.content
    assert final.status_code == 201, final.content
    assert again.status_code == 201 and replayed(again)
    fell_back = any(answer.status_code == 201 and not replayed(answer) for answer in early)
    if setup.name.startswith("redis") and fell_back:
        assert faults.runs[key] == 2 and not replayed(final)
        return
    assert faults.runs[key] == 1, f"the view ran {faults.runs[key]} times"
    check(setup, key, *early, final, again)


@pytest.mark.parametrize("setup", NODE, indirect=True)
def test_redis_reply_lost_during_claim(
    setup: Setup, redis_proxied: tuple[FaultProxy, faults.Requester]
) -> None:
    """Redis applies the claim and its duplicate's, and their replies are lost (the
    connections then reset): unknown outcomes, never "not claimed". The view runs once
    across the request, its duplicate and the retries."""
    proxy, requester = redis_proxied
    key = faults.new_key()
    redis_store.get_store().client.ping()  # connected: the claim is sent, and applied
    proxy.lose_replies()
    first = requester.ask(key)
    duplicate = requester.ask(key)
    proxy.reset()
    proxy.heal()
    assert first.status_code == 503 and problem_slug(first) == "store-unavailable"
    after_redis_fault(setup, requester, key, first, duplicate)


@pytest.mark.parametrize("setup", NODE, indirect=True)
def test_redis_reply_lost_during_completion(
    setup: Setup, redis_proxied: tuple[FaultProxy, faults.Requester]
) -> None:
    """The view has written; the replies of Redis are lost from then on. ``redis``: its
    prepared record, written before COMMIT, has an unknown outcome, so the view's
    transaction rolls back and the request answers 503; the retry runs the view again, the
    one run that commits. ``hybrid``: the outbox row commits with the view's writes, the
    refill of Redis is what goes unanswered; 201, and the retry replays it from PostgreSQL."""
    proxy, requester = redis_proxied
    key = faults.new_key()
    faults.interference.append(lambda _key: proxy.lose_replies())
    faults.plan.append("interfere_late")
    first = requester.ask(key)
    proxy.reset()
    proxy.heal()
    if setup.name == "redis":
        assert first.status_code == 503 and problem_slug(first) == "store-unavailable"
        assert committed(setup, key) == []
    else:
        assert first.status_code == 201 and not replayed(first), first.content
    final = faults.settle(requester, key)
    again = requester.ask(key)
    assert final.status_code == 201, final.content
    assert again.status_code == 201 and replayed(again)
    assert replayed(final) is (setup.name != "redis")
    assert faults.runs[key] == (2 if setup.name == "redis" else 1)
    check(setup, key, first, final, again)


#: REDIS_SOCKET_TIMEOUT of the slow cells: far above their latency, on a busy machine too.
SLOW_REDIS_TIMEOUT = 2


@pytest.mark.parametrize("setup", NODE, indirect=True)
def test_redis_slow(
    setup: Setup, settings: Any, redis_proxied: tuple[FaultProxy, faults.Requester]
) -> None:
    """Every round trip to Redis 20 to 60 ms late (below REDIS_SOCKET_TIMEOUT): the view
    runs once, the retry replays it."""
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "REDIS_SOCKET_TIMEOUT": SLOW_REDIS_TIMEOUT}
    redis_store.reset_clients()
    runs_once_when_slow(setup, *redis_proxied)


def on_cluster(settings: Any, cluster: RedisClusterNodes, **more: Any) -> None:
    """The settings' Redis is ``cluster`` (through its proxies when it has them), with
    ``more``; the client connected to every primary, so that a claim is sent on a
    connection already open."""
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "REDIS_URL": cluster.url, **more}
    strategies.reset()
    redis_store.reset_clients()
    redis_store.get_store().client.ping(target_nodes=RedisCluster.PRIMARIES)


@pytest.mark.parametrize("setup", CLUSTER, indirect=True)
def test_redis_cluster_slow(
    setup: Setup, settings: Any, client: APIClient, proxied_redis_cluster: RedisClusterNodes
) -> None:
    """Every round trip to every node of the Cluster 20 to 60 ms late: the view runs once,
    the retry replays it."""
    on_cluster(settings, proxied_redis_cluster, REDIS_SOCKET_TIMEOUT=SLOW_REDIS_TIMEOUT)
    requester = faults.Requester(client)
    try:
        for proxy in proxied_redis_cluster.proxies.values():
            proxy.latency(0.02, jitter=0.04)
        key = faults.new_key()
        first = requester.ask(key)
        retry = requester.ask(key)
        assert first.status_code == 201 and not replayed(first), first.content
        assert retry.status_code == 201 and replayed(retry)
        assert faults.runs[key] == 1
        check(setup, key, first, retry)
    finally:
        requester.stop()
        for proxy in proxied_redis_cluster.proxies.values():
            proxy.heal()


@pytest.mark.parametrize("setup", NODE, indirect=True)
def test_redis_silent_during_claim(
    setup: Setup, redis_proxied: tuple[FaultProxy, faults.Requester]
) -> None:
    """The path to Redis falls silent (the sockets open) before the claim and its
    duplicate; the claims reach Redis once it heals. The view runs once across them all."""
    proxy, requester = redis_proxied
    key = faults.new_key()
    proxy.silence()
    first = requester.ask(key)
    duplicate = requester.ask(key)
    proxy.heal()
    after_redis_fault(setup, requester, key, first, duplicate)


@pytest.mark.parametrize("setup", NODE, indirect=True)
def test_redis_hung_during_claim(
    setup: Setup, redis_proxied: tuple[FaultProxy, faults.Requester]
) -> None:
    """The Redis server is stopped (SIGSTOP) during the claim and its duplicate, and
    applies them when it runs again. The view runs once across them all."""
    _proxy, requester = redis_proxied
    key = faults.new_key()
    server: RedisServer = setup.redis
    with server.paused():
        first = requester.ask(key)
        duplicate = requester.ask(key)
    after_redis_fault(setup, requester, key, first, duplicate)


def cluster_claims_during(setup: Setup, client: APIClient, fault: Any) -> None:
    """A request and its duplicate sent while ``fault`` (a context manager) holds the
    Cluster: the first claim, sent on a connection already open, has an unknown outcome
    (503, never "Redis is down"); once the fault is over the key settles as
    :func:`after_redis_fault` says."""
    requester = faults.Requester(client)
    try:
        key = faults.new_key()
        with fault:
            first = requester.ask(key)
            duplicate = requester.ask(key)
        assert first.status_code == 503 and problem_slug(first) == "store-unavailable"
        after_redis_fault(setup, requester, key, first, duplicate)
    finally:
        requester.stop()


@pytest.mark.parametrize("setup", CLUSTER, indirect=True)
def test_redis_cluster_hung_during_claim(setup: Setup, settings: Any, client: APIClient) -> None:
    """Every primary of the Cluster stopped (SIGSTOP) during the claim and its duplicate,
    and applying them when they run again (no replica takes over meanwhile). The view runs
    once across them all (under ``redis``, the limit of its ``db`` fallback)."""
    on_cluster(settings, setup.redis, LOCK_TIMEOUT=3)
    cluster_claims_during(setup, client, setup.redis.paused())


@pytest.mark.parametrize("setup", CLUSTER, indirect=True)
def test_redis_cluster_silent_during_claim(
    setup: Setup, settings: Any, client: APIClient, proxied_redis_cluster: RedisClusterNodes
) -> None:
    """The path to every node of the Cluster falls silent (a proxy in front of each, which
    the nodes announce as their address), the sockets open, during the claim and its
    duplicate, which reach the nodes when it heals. The view runs once across them all
    (under ``redis``, the limit of its ``db`` fallback)."""
    on_cluster(settings, proxied_redis_cluster, LOCK_TIMEOUT=3)
    cluster_claims_during(setup, client, proxied_redis_cluster.silenced())


@pytest.mark.parametrize("setup", CLUSTER, indirect=True)
def test_redis_cluster_reply_lost_during_claim(
    setup: Setup, settings: Any, client: APIClient, proxied_redis_cluster: RedisClusterNodes
) -> None:
    """Every node of the Cluster applies what it is sent, and its replies are lost, during
    the claim and its duplicate. The view runs once across them all (under ``redis``, the
    limit of its ``db`` fallback for a request whose connection never opened)."""
    on_cluster(settings, proxied_redis_cluster, LOCK_TIMEOUT=3)
    cluster_claims_during(setup, client, proxied_redis_cluster.replies_lost())


# -- the worker process dies ----------------------------------------------------------------

KILLED = [
    pytest.param("postgres", "db", marks=[pytest.mark.postgres], id="db-postgres"),
    pytest.param("postgres", "db-partitioned", marks=[pytest.mark.postgres], id="db-partitioned"),
    pytest.param("sqlite", "db", id="db-sqlite"),
    pytest.param("mariadb", "db", marks=[pytest.mark.mariadb], id="db-mariadb"),
    pytest.param("postgres", "advisory_lock", marks=[pytest.mark.postgres], id="advisory_lock"),
    pytest.param("postgres", "redis", marks=[pytest.mark.postgres, pytest.mark.redis], id="redis"),
    pytest.param(
        "postgres", "hybrid", marks=[pytest.mark.postgres, pytest.mark.redis], id="hybrid"
    ),
]


@pytest.mark.server
@pytest.mark.parametrize(("backend", "strategy"), KILLED)
def test_worker_killed_during_view(
    request: pytest.FixtureRequest, backend: str, strategy: str, tmp_path: Path
) -> None:
    """``kill -9`` of the gunicorn worker in the middle of the view (a payment call of the
    example API that lasts until the test ends it, ``PSP_HOLD_MARKER``; the worker is
    killed once the call has begun): nothing of it commits, and once its claim is dead
    (lease expired, or the lock gone with its connection) exactly one retry runs the
    view."""
    from ..support.databases import count_rows
    from ..support.example import example_server, race, scratch_database
    from ..support.example import request as http

    env: dict[str, str] = {}
    partitioned = strategy == "db-partitioned"
    if partitioned:
        strategy, env = "db", {"IDEMPOTENCY_PARTITION_INTERVAL": str(PARTITION_INTERVAL)}
    if strategy in ("redis", "hybrid"):
        private: RedisServer = request.getfixturevalue("running_private_redis")
        env = {"REDIS_URL": private.url, "IDEMPOTENCY_REDIS_PREFIX": "killed-" + uuid.uuid4().hex}
    charge = {"amount": 1999, "currency": "EUR"}
    hold, calls = tmp_path / "hold", tmp_path / "calls"
    hold.touch()
    calls.write_text("")
    env = {**env, "PSP_HOLD_MARKER": str(hold), "PSP_CALL_LOG": str(calls)}
    with (
        scratch_database(backend) as db,
        _partitioned(db, env) if partitioned else nullcontext(),
        example_server(
            db, strategy=strategy, lock_timeout=1, workers=1, threads=4, env=env
        ) as server,
    ):
        url = server.url + "/api/charges/"
        outcome: list[object] = []

        def doomed() -> None:
            try:
                outcome.append(http(url, key="crash", body=charge))
            except OSError as exc:
                outcome.append(exc)

        runner = threading.Thread(target=doomed)
        runner.start()
        wait_until(lambda: bool(calls.read_text().strip()), timeout=60)  # in the payment call
        (worker,) = server.worker_pids()
        os.kill(worker, signal.SIGKILL)
        hold.unlink()  # the retries' payment calls answer
        runner.join(60)
        assert isinstance(outcome[0], OSError) or outcome[0][0] >= 500  # type: ignore[index]
        assert count_rows(db, "payments_charge") == 0
        killed_at = time.monotonic()
        while True:  # the master starts a new worker
            try:
                if http(url, method="GET")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < killed_at + 60, "gunicorn did not start a new worker"
            time.sleep(0.1)
        time.sleep(max(0.0, killed_at + 1.3 - time.monotonic()))  # the dead lease is stale now
        retries = race(url, n=8, key="crash", body=charge)
        fresh = [
            body
            for status, body in retries
            if status == 201 and body["_headers"].get("idempotent-replayed") != "true"
        ]
        assert len(fresh) == 1, retries
        assert {status for status, _ in retries} <= {201, 409}
        for status, body in retries:
            if status == 201:
                assert body["id"] == fresh[0]["id"]
        assert count_rows(db, "payments_charge") == 1


@contextmanager
def _partitioned(database_url: str, env: dict[str, str]) -> Iterator[None]:
    """The example project's key table in ``database_url`` partitioned by its own command."""
    from ..support.example import manage

    manage(database_url, "partition_idempotency_keys", env=env)
    yield


# -- changing strategy -----------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.parametrize("target", ["db", "advisory_lock"])
def test_strategy_switch_undrained(
    request: pytest.FixtureRequest,
    settings: Any,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    client: APIClient,
    target: str,
) -> None:
    """Keys a hybrid deployment completed and has not drained yet are replayed after
    the switch to another strategy, never run again."""
    monkeypatch.setattr(HybridStrategy, "queue_drain", False)
    faults.reset()
    setup = configure(request, settings, redis_prefix, "hybrid")
    key = faults.new_key()
    first = post(client, key)
    assert first.status_code == 201
    try:
        settings.IDEMPOTENCY = {"STRATEGY": target}
        strategies.reset()
        retry = post(client, key)
    finally:
        strategies.reset()
        redis_store.reset_clients()
    assert retry.status_code == 201 and replayed(retry)
    check(setup, key, first, retry)
