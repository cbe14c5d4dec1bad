"""The ``hybrid`` strategy on real Redis servers and the real PostgreSQL database.

Redis losses are real: ``FLUSHALL`` on a private ``redis-server``, or a private server
killed with SIGKILL and started again (without persistence, so its data is gone).
Side effects are counted in ``SideEffect`` rows (the test views) and ``Charge`` rows
(the example API).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.protocol.lifecycle import Lifecycle
from django_idempotency.protocol.problems import PROBLEM_CONTENT_TYPE
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.status import COMPLETED
from django_idempotency.strategies import load_strategy
from django_idempotency.strategies.base import Attempt, InProgress, Replay
from django_idempotency.strategies.hybrid import HybridClaim, HybridStrategy
from django_idempotency.strategies.redis.store import get_client, get_store
from django_idempotency.strategies.redis.suspects import suspects
from example_project.payments.models import Charge
from tests.testapp import holds
from tests.testapp.models import SideEffect

from ..support.api import (
    api_client,
    post_json,
    race_held,
    replayed,
    token_client,
    wait_in_progress,
)
from ..support.factories import StaleKeyFactory, UserFactory
from ..support.redis_servers import (
    RedisClusterNodes,
    RedisServer,
    closed_port_url,
    wait_replicated,
)
from ..support.threads import in_background
from ..support.waiting import wait_until

pytestmark = [
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("forget_queued_drains"),
]


@pytest.fixture(autouse=True)
def _suspect_rows_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's read of the suspect rows (one a second, test_hybrid_episodes.py) is
    not due during a test: the statements counted here are the requests' own (and no mark
    is pending from an earlier test: tests/conftest.py forgets them before each test)."""
    monkeypatch.setattr(suspects, "next_read", math.inf)


#: REDIS_SOCKET_TIMEOUT of this module's tests, about a Redis that answers: at the suite's
#: 0.25 s, a reply late on a busy machine is an unknown outcome, which the loss check takes
#: for "cannot tell" (True, and no marker written: make stress-test, seed 393910240), and
#: which the tests of unknown outcomes (tests/strategies/redis/, test_faults.py) are about.
ANSWERING_REDIS_TIMEOUT = 10.0


@pytest.fixture
def hybrid(redis_settings: Any, running_private_redis: RedisServer) -> Any:
    """``hybrid(**more)``: the hybrid strategy on the private Redis server, which is given
    :data:`ANSWERING_REDIS_TIMEOUT` to answer (no test here hangs it)."""

    def apply(**more: Any) -> dict[str, Any]:
        more.setdefault("STRATEGY", "hybrid")
        more.setdefault("REDIS_SOCKET_TIMEOUT", ANSWERING_REDIS_TIMEOUT)
        return redis_settings(running_private_redis.url, **more)

    apply(HYBRID_DB_CHECK="always")
    return apply


def _record(key: str) -> Any:
    """The Redis record of ``key`` (the test views' scope is the user)."""
    outbox = IdempotencyOutbox.objects.filter(key=key).first()
    row = IdempotencyKey.objects.filter(key=key).first()
    scope = (outbox or row).scope  # type: ignore[union-attr]
    return get_store().get(scope, key)


# -- the hot path ----------------------------------------------------------------------------


def test_registered_under_its_name(hybrid: Any) -> None:
    assert isinstance(load_strategy("hybrid"), HybridStrategy)


def test_new_key_runs_once_writes_only_the_outbox_and_replays_from_redis(
    hybrid: Any, api: APIClient
) -> None:
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 5})
    assert first.status_code == 201 and not replayed(first)
    assert SideEffect.objects.count() == 1
    # The request wrote its outbox row in the view's transaction, and no IdempotencyKey row.
    assert IdempotencyKey.objects.count() == 0
    row = IdempotencyOutbox.objects.get(key=key)
    assert (row.response_status, bytes(row.response_body)) == (201, first.content)
    record = _record(key)
    assert record is not None and record.status == COMPLETED
    assert record.response.body == first.content

    # The replay is served from Redis: no SQL at all.
    with CaptureQueriesContext(connection) as queries:
        again = post_json(api, key, {"amount": 5})
    assert again.status_code == 201 and replayed(again)
    assert again.content == first.content
    assert again["Content-Type"] == first["Content-Type"]
    assert not [q for q in queries.captured_queries if "idempotency" in q["sql"]]
    assert SideEffect.objects.count() == 1


def test_same_key_other_request_is_422(hybrid: Any, api: APIClient) -> None:
    key = uuid.uuid4().hex
    assert post_json(api, key, {"amount": 5}).status_code == 201
    other = post_json(api, key, {"amount": 6})
    assert other.status_code == 422
    assert other["Content-Type"] == PROBLEM_CONTENT_TYPE
    assert other.json()["status"] == 422
    assert SideEffect.objects.count() == 1


def test_duplicate_while_the_view_runs_is_409(hybrid: Any, api: APIClient) -> None:
    key = uuid.uuid4().hex
    user = UserFactory()
    body = {"hold": key}  # the view runs until the test releases it
    running = in_background(lambda: post_json(api_client(user), key, body))
    try:
        wait_in_progress(f"user:{user.pk}", key)
        client = api_client(user)
        duplicate = post_json(client, key, body)
    finally:
        holds.release(key)
    slow = running.result(60)
    assert duplicate.status_code == 409
    assert duplicate["Content-Type"] == PROBLEM_CONTENT_TYPE
    assert int(duplicate["Retry-After"]) >= 1
    assert slow.status_code == 201
    assert replayed(post_json(client, key, body))
    assert SideEffect.objects.filter(label="drf").count() == 1


def test_error_in_the_view_rolls_back_and_releases_the_key(hybrid: Any, api: APIClient) -> None:
    key = uuid.uuid4().hex
    with pytest.raises(RuntimeError):
        post_json(api, key, {"raise": True})
    assert SideEffect.objects.count() == 0
    assert IdempotencyOutbox.objects.count() == 0
    retry = post_json(api, key, {"raise": False})
    assert retry.status_code == 201 and not replayed(retry)
    assert SideEffect.objects.count() == 1


def test_a_client_error_is_stored_and_replayed(hybrid: Any, api: APIClient) -> None:
    key = uuid.uuid4().hex
    first = post_json(api, key, {"invalid": True})
    assert first.status_code == 400
    again = post_json(api, key, {"invalid": True})
    assert again.status_code == 400 and replayed(again)
    assert again.content == first.content
    assert SideEffect.objects.count() == 1


def test_example_charge_view_charges_once(hybrid: Any) -> None:
    user = UserFactory()
    client = token_client(user)
    key = uuid.uuid4().hex
    body = {"amount": 1999, "currency": "EUR"}
    first = post_json(client, key, body, path="/api/charges/")
    assert first.status_code == 201, first.content
    again = post_json(client, key, body, path="/api/charges/")
    assert again.status_code == 201 and replayed(again)
    assert again.json()["id"] == first.json()["id"]
    assert post_json(client, key, {**body, "amount": 1}, path="/api/charges/").status_code == 422
    assert Charge.objects.count() == 1


def test_racing_threads_run_the_view_once(hybrid: Any) -> None:
    user = UserFactory()
    key = uuid.uuid4().hex
    clients = [api_client(user) for _ in range(10)]
    responses = race_held(10, lambda i, body: post_json(clients[i], key, body), key)
    statuses = [response.status_code for response in responses]
    assert sorted(statuses) == [201] + [409] * 9, statuses  # the others came while it ran
    assert SideEffect.objects.count() == 1


def _attempt(key: str, *, atomic: bool = True) -> Attempt:
    return Attempt(
        scope="user:1",
        key=key,
        fingerprint="f" * 64,
        ttl=60,
        lock_timeout=5,
        method="POST",
        path="/t/",
        atomic=atomic,
    )


def test_a_view_that_rolls_back_has_its_response_stored_afterwards(hybrid: Any) -> None:
    strategy = load_strategy("hybrid")
    attempt = _attempt(uuid.uuid4().hex)
    with Lifecycle(strategy, attempt) as outcome_life:
        outcome = outcome_life.outcome
        assert isinstance(outcome, HybridClaim)
        SideEffect.objects.create(label="undone")
        transaction.set_rollback(True)  # what DRF does with ATOMIC_REQUESTS on an APIException
        outcome_life.complete(StoredResponse(400, {"Content-Type": "application/json"}, b"{}"))
    assert SideEffect.objects.count() == 0
    assert IdempotencyOutbox.objects.get(key=attempt.key).response_status == 400
    with Lifecycle(strategy, attempt) as again_life:
        again = again_life.outcome
        assert isinstance(again, Replay) and again.response.status == 400


def test_without_atomic_the_outbox_row_commits_on_its_own(hybrid: Any) -> None:
    strategy = load_strategy("hybrid")
    attempt = _attempt(uuid.uuid4().hex, atomic=False)
    with Lifecycle(strategy, attempt) as outcome_life:
        outcome = outcome_life.outcome
        assert isinstance(outcome, HybridClaim)
        SideEffect.objects.create(label="kept")
        outcome_life.complete(StoredResponse(201, {}, b"ok"))
    assert SideEffect.objects.count() == 1
    assert IdempotencyOutbox.objects.filter(key=attempt.key).exists()
    with Lifecycle(strategy, attempt) as again_life:
        again = again_life.outcome
        assert isinstance(again, Replay) and again.response.body == b"ok"


def test_released_claim_lets_the_next_request_run(hybrid: Any) -> None:
    strategy = load_strategy("hybrid")
    attempt = _attempt(uuid.uuid4().hex)
    with Lifecycle(strategy, attempt) as outcome_life:
        outcome = outcome_life.outcome
        assert isinstance(outcome, HybridClaim)
        SideEffect.objects.create(label="undone")
        outcome_life.release()  # e.g. a 5xx response
    assert SideEffect.objects.count() == 0
    assert get_store().get(attempt.scope, attempt.key) is None
    with Lifecycle(strategy, attempt) as again_life:
        again = again_life.outcome
        assert isinstance(again, HybridClaim)
        again_life.release()
    with Lifecycle(strategy, attempt) as holder_life:
        holder = holder_life.outcome
        assert isinstance(holder, HybridClaim)
        with Lifecycle(strategy, attempt) as duplicate_life:
            duplicate = duplicate_life.outcome
            assert isinstance(duplicate, InProgress)
        holder_life.release()


# -- Redis loses data ------------------------------------------------------------------------


@pytest.mark.parametrize("drained", [False, True], ids=["in-outbox", "drained"])
def test_flushall_then_retry_replays_from_the_database(
    hybrid: Any, api: APIClient, running_private_redis: RedisServer, drained: bool
) -> None:
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 5})
    assert first.status_code == 201
    if drained:
        assert IdempotencyOutbox.objects.drain(100).drained == 1
        assert IdempotencyKey.objects.get(key=key).status == COMPLETED
    get_client().flushall()
    assert _record(key) is None

    retry = post_json(api, key, {"amount": 5})
    assert retry.status_code == 201 and replayed(retry)
    assert retry.content == first.content
    assert SideEffect.objects.count() == 1
    # Redis was refilled: the next retry needs no SQL.
    record = _record(key)
    assert record is not None and record.status == COMPLETED
    with CaptureQueriesContext(connection) as queries:
        assert replayed(post_json(api, key, {"amount": 5}))
    assert not [q for q in queries.captured_queries if "idempotency" in q["sql"]]
    assert post_json(api, key, {"amount": 6}).status_code == 422
    assert SideEffect.objects.count() == 1


def test_redis_killed_and_restarted_then_retry_replays(
    hybrid: Any, api: APIClient, running_private_redis: RedisServer
) -> None:
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 5})
    assert first.status_code == 201
    running_private_redis.kill()
    running_private_redis.start()  # same port, no persistence: everything is gone

    retry = post_json(api, key, {"amount": 5})
    if retry.status_code == 503 or not replayed(retry):  # pragma: no cover - diagnostics
        pytest.fail(f"{retry.status_code} {retry.content!r}")
    assert retry.content == first.content
    assert SideEffect.objects.count() == 1
    assert replayed(post_json(api, key, {"amount": 5}))
    record = _record(key)
    assert record is not None and record.status == COMPLETED
    assert SideEffect.objects.count() == 1


def test_redis_losing_a_claim_mid_view_cannot_commit_twice(
    hybrid: Any, running_private_redis: RedisServer
) -> None:
    """A flush while the first owner is in its view lets a second owner in; the outbox's
    unique constraint refuses the slower commit, whose writes roll back."""
    user = UserFactory()
    key = uuid.uuid4().hex
    body = {"hold": key}  # both views run until the test releases them
    running = in_background(lambda: post_json(api_client(user), key, body))
    client = api_client(user)
    try:
        wait_until(lambda: holds.arrived(key) == 1, timeout=60)  # the first is in its view
        get_client().flushall()
        second = in_background(lambda: post_json(client, key, body))
        wait_until(lambda: holds.arrived(key) == 2, timeout=60)  # the second is in its view
    finally:
        holds.release(key)
    fast, slow = second.result(60), running.result(60)
    statuses = sorted([fast.status_code, slow.status_code])
    assert statuses == [201, 409], statuses
    loser = fast if fast.status_code == 409 else slow
    assert loser.json()["type"].endswith("lease-lost")
    assert SideEffect.objects.count() == 1
    assert IdempotencyOutbox.objects.filter(key=key).count() == 1
    retry = post_json(client, key, body)
    assert retry.status_code == 201 and replayed(retry)


# -- HYBRID_DB_CHECK = "after_loss" ----------------------------------------------------------


def _quiet(client: Any, store: Any) -> None:
    """The loss marker as a server that has lost nothing for a while holds it: its run id
    and eviction count, no suspicion window."""
    info = client.info("server") | client.info("stats")
    marker, _checked, suspect = store.loss_keys()
    client.set(marker, f"{info['run_id']} {info['evicted_keys']}")
    client.delete(suspect)


def _expire_the_check(client: Any, store: Any) -> None:
    """What ``loss_check_interval`` does on its own once it has passed: the next claim
    compares the marker with INFO."""
    client.delete(store.loss_keys()[1])


def test_after_loss_detects_a_flush_and_a_restart(
    hybrid: Any, api: APIClient, running_private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check interval is the test's (ten minutes, not 10 ms): it passes when
    ``_expire_the_check`` says so, never while a busy machine runs the next line."""
    hybrid(HYBRID_DB_CHECK="after_loss")
    strategy = load_strategy("hybrid")
    assert isinstance(strategy, HybridStrategy)
    monkeypatch.setattr(strategy, "loss_check_interval", 600.0)
    store = get_store()
    client = get_client()
    marker, _checked, suspect = store.loss_keys()
    run_id = client.info("server")["run_id"]

    assert strategy.loss_suspected(store, 60)  # no marker yet: written now
    written = client.get(marker)
    assert isinstance(written, bytes) and written.decode().split()[0] == run_id
    assert strategy.loss_suspected(store, 60)  # within the window after the loss
    assert 0 < client.pttl(suspect) <= 24 * 3600 * 1000
    _quiet(client, store)
    assert not strategy.loss_suspected(store, 60)  # quiet: no database check
    client.set(marker, f"{'ab' * 20} 0")  # written by another server run
    assert not strategy.loss_suspected(store, 60)  # not compared before the interval...
    _expire_the_check(client, store)
    assert strategy.loss_suspected(store, 60)  # ...then seen: a restart / failover
    assert client.get(marker) == written
    client.set(marker, "{not a marker}")
    _expire_the_check(client, store)
    assert strategy.loss_suspected(store, 60)  # unreadable: written again

    # A flush removes the marker: the key is looked up and replayed.
    _quiet(client, store)
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 5})
    client.flushall()
    retry = post_json(api, key, {"amount": 5})
    assert retry.status_code == 201 and replayed(retry) and retry.content == first.content
    assert SideEffect.objects.count() == 1


def test_after_loss_detects_an_eviction(hybrid: Any, api: APIClient, redis_prefix: str) -> None:
    """Redis evicts records under memory pressure: the marker stays (``volatile-lru``
    evicts only keys with a TTL, which the marker has not), but its eviction count is no
    longer the server's, so new keys are looked up again and a retry of an evicted key
    replays instead of running the view a second time. A server that may evict is compared
    at every claim: the retry right after the eviction is already looked up."""
    server = RedisServer(extra=("--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru"))
    server.start()
    try:
        hybrid(HYBRID_DB_CHECK="after_loss", REDIS_URL=server.url, TTL=600)
        store = get_store()
        client = get_client()
        _quiet(client, store)
        key = uuid.uuid4().hex
        first = post_json(api, key, {"amount": 5})
        assert first.status_code == 201 and _record(key) is not None
        # Fill the server past maxmemory: the oldest keys, the record among them, go.
        filler = b"x" * 100_000
        for i in range(200):
            client.set(f"filler:{i}", filler, ex=3600)
        assert _record(key) is None and int(client.info("stats")["evicted_keys"]) > 0
        assert client.exists(store.loss_keys()[0])
        # The very next claim sees the eviction: no check interval on such a server.
        with CaptureQueriesContext(connection) as queries:
            retry = post_json(api, key, {"amount": 5})
        # Looked up in the database (the outbox) before the view: the eviction was seen.
        assert any("django_idempotency_idempotencyoutbox" in q["sql"] for q in queries)
        assert retry.status_code == 201 and replayed(retry) and retry.content == first.content
        assert SideEffect.objects.count() == 1
    finally:
        server.stop()


def _commandstats(client: Any, run: Any) -> dict[str, int]:
    """The commands the server ran during ``run()`` (``INFO commandstats``), by name; the
    first INFO, which the second counts, left out."""
    before = client.info("commandstats")
    run()
    after = client.info("commandstats")
    calls = {name: stats["calls"] for name, stats in after.items()}
    calls["cmdstat_info"] -= 1
    for name, stats in before.items():
        calls[name] -= stats["calls"]
    return {name.removeprefix("cmdstat_"): n for name, n in calls.items() if n}


def test_after_loss_claims_and_checks_the_marker_in_one_round_trip(
    hybrid: Any, api: APIClient
) -> None:
    """A quiet server: a new key is one Redis script before the view (SET NX PX GET, one
    MGET of the loss keys and the key's suspect and held marks, and the SET of its held
    mark) and one SET after the commit, and
    the only idempotency statement in PostgreSQL is the outbox insert; a replay is the
    script's SET alone. The
    counts are the server's own (``INFO commandstats``, which counts the commands a script
    runs besides the EVALSHA)."""
    hybrid(HYBRID_DB_CHECK="after_loss", TTL=600)
    store = get_store()
    client = get_client()
    _quiet(client, store)
    post_json(api, uuid.uuid4().hex, {"amount": 1})  # warm: connections, scripts loaded
    client.set(store.loss_keys()[1], "1", px=600_000)  # the INFO check is not due
    key = uuid.uuid4().hex
    with CaptureQueriesContext(connection) as queries:
        calls = _commandstats(client, lambda: post_json(api, key, {"amount": 5}))
    assert calls == {"evalsha": 1, "set": 3, "mget": 1}, calls
    ours = [q["sql"] for q in queries.captured_queries if "django_idempotency" in q["sql"]]
    assert len(ours) == 1 and ours[0].startswith("WITH fenced AS")
    replay = _commandstats(client, lambda: post_json(api, key, {"amount": 5}))
    assert replay == {"evalsha": 1, "set": 1}, replay
    # Once per loss_check_interval per server, the claim also compares with INFO (server,
    # stats and memory: whether the server may evict).
    client.delete(store.loss_keys()[1])
    calls = _commandstats(client, lambda: post_json(api, uuid.uuid4().hex, {"amount": 5}))
    assert calls == {"evalsha": 1, "set": 4, "mget": 1, "info": 3}, calls


def _admin(server: RedisServer) -> Any:
    """A client of the test's own (the app's pooled connections stay as they are)."""
    return redis.Redis.from_url(server.url, socket_timeout=5)


def test_after_loss_sees_a_restart_that_brought_back_an_older_snapshot(
    hybrid: Any, api: APIClient, running_private_redis: RedisServer
) -> None:
    """Redis restarts with its data (an RDB snapshot, as AOF ``everysec`` loses its last
    second): the marker comes back, the records written after the snapshot do not. The
    server must load the claim script again (NOSCRIPT), and that is when the claim compares
    the marker with INFO: the run id changed, so the lost key is looked up and replayed."""
    hybrid(HYBRID_DB_CHECK="after_loss", TTL=600)
    store = get_store()
    admin = _admin(running_private_redis)
    _quiet(admin, store)
    post_json(api, uuid.uuid4().hex, {"amount": 1})  # the process's first claim compared
    # The 10 ms interval alone would not compare again for ten minutes.
    admin.set(store.loss_keys()[1], "1", px=600_000)
    admin.save()
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 5})
    assert first.status_code == 201 and not store.verify_due
    running_private_redis.kill()
    running_private_redis.start()
    admin = _admin(running_private_redis)
    marker, checked, _suspect = store.loss_keys()
    assert admin.exists(marker, checked) == 2 and admin.get(store.record_key(*_scope(key))) is None
    with contextlib.suppress(redis.ConnectionError):
        get_client().ping()  # the app's connection notices the restart and reconnects
    assert not store.verify_due

    retry = post_json(api, key, {"amount": 5})
    assert retry.status_code == 201 and replayed(retry) and retry.content == first.content
    assert SideEffect.objects.count() == 2
    assert admin.exists(store.loss_keys()[2])  # new keys are looked up for the window


def _scope(key: str) -> tuple[str, str]:
    outbox = IdempotencyOutbox.objects.filter(key=key).first()
    row = IdempotencyKey.objects.filter(key=key).first()
    return (outbox or row).scope, key  # type: ignore[union-attr]


@pytest.mark.parametrize("drained", [False, True], ids=["in-outbox", "drained"])
def test_a_refill_lives_what_the_record_has_left_by_the_database_clock(
    hybrid: Any,
    api: APIClient,
    running_private_redis: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    drained: bool,
) -> None:
    """A key flushed from Redis is refilled from the database for what its record has
    left by the database's clock: an app server 90 s ahead with ``TTL`` 60 no longer
    refills it for a millisecond (as if it had expired), nor one behind for longer than the
    record lives."""
    hybrid(TTL=60)
    key = uuid.uuid4().hex
    assert post_json(api, key, {"amount": 5}).status_code == 201
    if drained:
        assert IdempotencyOutbox.objects.drain(100).drained == 1
    get_client().flushall()
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=90))
    assert replayed(post_json(api, key, {"amount": 5}))
    assert 30_000 < get_store().pttl(*_scope(key)) <= 60_000
    assert SideEffect.objects.count() == 1


def test_after_loss_sees_a_failover_to_a_replica_that_missed_the_last_writes(
    hybrid: Any, api: APIClient
) -> None:
    """A replica is promoted after it missed the last key the primary committed: it has
    the marker (replicated, with the old primary's run id) and a fresh ``checked``, but
    not the claim script (Redis 7 does not replicate the script cache), so the first claim
    there compares the marker with INFO, sees another run id, and the missed key is
    replayed from PostgreSQL instead of running again."""
    with RedisServer().start() as primary:
        replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(primary.port)))
        with replica.start():
            hybrid(HYBRID_DB_CHECK="after_loss", REDIS_URL=primary.url, TTL=600)
            store = get_store()
            admin = _admin(primary)
            _quiet(admin, store)
            replicated, missed = uuid.uuid4().hex, uuid.uuid4().hex
            first = post_json(api, replicated, {"amount": 1})
            admin.set(store.loss_keys()[1], "1", px=600_000)
            wait_replicated(primary.port)
            _admin(replica).execute_command("REPLICAOF", "NO", "ONE")  # promoted
            lost = post_json(api, missed, {"amount": 2})  # on the old primary only
            assert first.status_code == lost.status_code == 201

            # The clients follow the failover (DNS, a proxy, Sentinel): a new connection.
            hybrid(HYBRID_DB_CHECK="after_loss", REDIS_URL=replica.url, TTL=600)
            store = get_store()
            store.verify_due = False  # only the missing script tells
            promoted = _admin(replica)
            assert promoted.exists(*store.loss_keys()[:2]) == 2
            assert promoted.get(store.record_key(*_scope(missed))) is None

            retry = post_json(api, missed, {"amount": 2})
            assert replayed(retry) and retry.content == lost.content
            assert replayed(post_json(api, replicated, {"amount": 1}))
            assert SideEffect.objects.count() == 2
            assert promoted.exists(store.loss_keys()[2])


def test_after_loss_sees_its_marker_evicted(hybrid: Any, api: APIClient) -> None:
    """Under an ``allkeys-*`` policy the marker itself can be evicted (here: deleted, as an
    eviction would): a claim that finds it missing compares at once, whatever the
    interval, and looks the key up."""
    hybrid(HYBRID_DB_CHECK="after_loss", TTL=600)
    store = get_store()
    client = get_client()
    _quiet(client, store)
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 5})
    client.set(store.loss_keys()[1], "1", px=600_000)
    client.delete(store.loss_keys()[0], store.record_key(*_scope(key)))
    retry = post_json(api, key, {"amount": 5})
    assert retry.status_code == 201 and replayed(retry) and retry.content == first.content
    assert SideEffect.objects.count() == 1
    marker, _checked, suspect = store.loss_keys()
    assert client.exists(marker, suspect) == 2  # written again, and the window open


def _outbox_reads(queries: CaptureQueriesContext) -> list[str]:
    """The idempotency statements that are not the outbox insert (the lookups)."""
    ours = [q["sql"] for q in queries.captured_queries if "django_idempotency" in q["sql"]]
    return [sql for sql in ours if not sql.startswith("WITH fenced AS")]


def test_hybrid_redis_ttl_keeps_the_hot_window_and_replays_from_postgresql_after_it(
    hybrid: Any, api: APIClient
) -> None:
    """``HYBRID_REDIS_TTL``: a completed record lives that long in Redis, then a replay is
    answered from PostgreSQL and refills Redis for another hot window; and every key new in
    Redis is looked up (Redis cannot tell one it let expire from a new one)."""
    hybrid(HYBRID_DB_CHECK="after_loss", TTL=600, HYBRID_REDIS_TTL=1)
    store = get_store()
    key = uuid.uuid4().hex
    with CaptureQueriesContext(connection) as queries:
        first = post_json(api, key, {"amount": 5})
    assert first.status_code == 201 and len(_outbox_reads(queries)) == 1
    assert 0 < store.pttl(*_scope(key)) <= 1000
    assert replayed(post_json(api, key, {"amount": 5}))  # from Redis, in the window
    deadline = time.monotonic() + 5
    while _record(key) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _record(key) is None

    with CaptureQueriesContext(connection) as queries:
        retry = post_json(api, key, {"amount": 5})
    assert retry.status_code == 201 and replayed(retry) and retry.content == first.content
    assert len(_outbox_reads(queries)) == 1
    assert 0 < store.pttl(*_scope(key)) <= 1000  # refilled for one hot window
    assert post_json(api, key, {"amount": 6}).status_code == 422
    assert SideEffect.objects.count() == 1


# -- "after_loss" on a Redis Cluster: the loss keys of each hash slot ----------------------


@pytest.fixture
def on_cluster(redis_settings: Any, redis_cluster: RedisClusterNodes) -> Any:
    redis_settings(
        redis_cluster.url,
        STRATEGY="hybrid",
        REDIS_CLUSTER=True,
        HYBRID_DB_CHECK="after_loss",
        TTL=600,
        REDIS_SOCKET_TIMEOUT=2.0,
    )
    return redis_cluster


def _slot_node(key_name: str) -> Any:
    """A plain client of the primary that serves ``key_name``'s slot."""
    node = get_client().get_node_from_key(key_name)  # type: ignore[union-attr]
    return redis.Redis(host=node.host, port=node.port, socket_timeout=5)


def _quiet_slot(scope: str, key: str) -> tuple[str, str, str]:
    """The loss keys of the slot of (scope, key), as on a node that lost nothing lately,
    with the INFO comparison not due for ten minutes."""
    keys = get_store().loss_keys_for(scope, key)
    node = _slot_node(keys[0])
    info = node.info("server") | node.info("stats")
    node.set(keys[0], f"{info['run_id']} {info['evicted_keys']}")
    node.set(keys[1], "1", px=600_000)
    node.delete(keys[2])
    return keys


@pytest.mark.redis_cluster
def test_after_loss_on_a_cluster_a_quiet_slot_reads_nothing_in_postgresql(on_cluster: Any) -> None:
    """Each slot has its loss keys, in the record's slot (one script per claim): a new key
    on a quiet slot is not looked up, as on a single node; its replay is Redis alone."""
    user = UserFactory()
    client = api_client(user)
    key = uuid.uuid4().hex
    loss_keys = _quiet_slot(f"user:{user.pk}", key)
    cluster: Any = get_client()
    names = [*loss_keys, get_store().record_key(f"user:{user.pk}", key)]
    assert len({cluster.keyslot(name) for name in names}) == 1  # one slot: one script
    with CaptureQueriesContext(connection) as queries:
        first = post_json(client, key, {"amount": 5})
    assert first.status_code == 201 and _outbox_reads(queries) == []
    with CaptureQueriesContext(connection) as queries:
        assert replayed(post_json(client, key, {"amount": 5}))
    assert not [q for q in queries.captured_queries if "idempotency" in q["sql"]]
    assert SideEffect.objects.count() == 1


@pytest.mark.redis_cluster
@pytest.mark.parametrize("loss", ["flushed", "failed-over"])
def test_after_loss_on_a_cluster_sees_a_slot_that_lost_its_records(
    on_cluster: Any, loss: str
) -> None:
    """The node of a slot was flushed (its marker is gone with the record) or another node
    now serves it (its marker holds another run id, compared once ``checked`` expired): the
    lost key is looked up in PostgreSQL and replayed, and the slot stays suspect."""
    user = UserFactory()
    client = api_client(user)
    scope, key = f"user:{user.pk}", uuid.uuid4().hex
    marker, checked, suspect = _quiet_slot(scope, key)
    first = post_json(client, key, {"amount": 5})
    assert first.status_code == 201
    node = _slot_node(marker)
    node.delete(get_store().record_key(scope, key))
    if loss == "flushed":
        node.delete(marker)
    else:
        node.set(marker, f"{'ab' * 20} 0")
        node.delete(checked)
    with CaptureQueriesContext(connection) as queries:
        retry = post_json(client, key, {"amount": 5})
    assert retry.status_code == 201 and replayed(retry) and retry.content == first.content
    assert len(_outbox_reads(queries)) == 1
    assert SideEffect.objects.count() == 1
    assert node.exists(suspect) and node.get(marker) != f"{'ab' * 20} 0".encode()


def test_after_loss_without_a_check_still_refuses_a_second_commit(
    hybrid: Any, api: APIClient
) -> None:
    """A loss the marker cannot see (a record deleted by hand, and its held mark with it;
    the record alone is looked up, through the mark): the view runs again, but its commit
    is refused and rolled back, Redis is refilled, the next retry replays."""
    hybrid(HYBRID_DB_CHECK="after_loss", TTL=60)
    store = get_store()
    client = get_client()
    _quiet(client, store)

    for drained in (False, True):
        key = uuid.uuid4().hex
        before = SideEffect.objects.count()
        first = post_json(api, key, {"amount": 5})
        assert first.status_code == 201
        if drained:
            IdempotencyOutbox.objects.drain(100)
        scope = IdempotencyKey.objects.filter(key=key).values_list("scope", flat=True).first()
        scope = scope or IdempotencyOutbox.objects.get(key=key).scope
        client.delete(store.record_key(scope, key))
        found = post_json(api, key, {"amount": 5})  # the held mark: looked up, replayed
        assert found.status_code == 201 and replayed(found) and found.content == first.content
        client.delete(store.record_key(scope, key), store.held_key(scope, key))

        refused = post_json(api, key, {"amount": 5})
        assert refused.status_code == 409, refused.content
        assert refused.json()["type"].endswith("lease-lost")
        assert SideEffect.objects.count() == before + 1  # the second run was rolled back
        retry = post_json(api, key, {"amount": 5})
        assert retry.status_code == 201 and replayed(retry) and retry.content == first.content


# -- Redis down -------------------------------------------------------------------------------


def test_redis_down_falls_back_to_the_db_strategy(hybrid: Any, api: APIClient) -> None:
    hybrid(REDIS_URL=closed_port_url())
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 5})
    assert first.status_code == 201 and not replayed(first)
    row = IdempotencyKey.objects.get(key=key)
    assert row.status == COMPLETED
    # The fallback writes the outbox row too (it excludes a hybrid commit of the key).
    assert IdempotencyOutbox.objects.filter(key=key).count() == 1
    again = post_json(api, key, {"amount": 5})
    assert again.status_code == 201 and replayed(again)
    assert post_json(api, key, {"amount": 6}).status_code == 422
    assert SideEffect.objects.count() == 1


def test_redis_down_fail_closed_is_503(hybrid: Any, api: APIClient) -> None:
    hybrid(REDIS_URL=closed_port_url(), REDIS_FAILURE_MODE="fail_closed")
    response = post_json(api, uuid.uuid4().hex, {"amount": 5})
    assert response.status_code == 503
    assert response["Content-Type"] == PROBLEM_CONTENT_TYPE
    assert response.json()["type"].endswith("store-unavailable")
    assert SideEffect.objects.count() == 0
    assert IdempotencyKey.objects.count() == IdempotencyOutbox.objects.count() == 0


def test_key_committed_by_hybrid_replays_when_redis_goes_down(hybrid: Any, api: APIClient) -> None:
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 5})
    assert first.status_code == 201
    assert IdempotencyKey.objects.count() == 0  # only in the outbox
    hybrid(REDIS_URL=closed_port_url())
    retry = post_json(api, key, {"amount": 5})
    assert retry.status_code == 201 and replayed(retry) and retry.content == first.content
    assert post_json(api, key, {"amount": 6}).status_code == 422
    assert SideEffect.objects.count() == 1
    # The fallback's claim was given back; the outbox row still holds the key.
    assert IdempotencyKey.objects.count() == 0


def test_db_strategy_replays_a_key_found_only_in_the_outbox(hybrid: Any, api: APIClient) -> None:
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 5})
    hybrid(STRATEGY="db")
    retry = post_json(api, key, {"amount": 5})
    assert retry.status_code == 201 and replayed(retry) and retry.content == first.content
    assert post_json(api, key, {"amount": 6}).status_code == 422
    assert SideEffect.objects.count() == 1


def test_a_db_claim_in_progress_is_left_to_the_db_strategy(hybrid: Any) -> None:
    """A key that a db claim holds (made while Redis was down) answers 409 while its lease
    is fresh, then replays; a stale one is taken over through the db strategy."""
    user = UserFactory()
    scope = f"user:{user.pk}"
    key = uuid.uuid4().hex
    body = {"hold": key}  # the view runs until the test releases it
    working = hybrid()
    hybrid(REDIS_URL=closed_port_url())
    running = in_background(lambda: post_json(api_client(user), key, body))
    try:
        # The fallback's claim committed; its view is running.
        wait_until(lambda: IdempotencyKey.objects.filter(key=key).exists(), timeout=60)
        hybrid(**{k: v for k, v in working.items() if k != "STRATEGY"})
        client = api_client(user)
        duplicate = post_json(client, key, body)
    finally:
        holds.release(key)
    slow = running.result(60)
    assert duplicate.status_code == 409, duplicate.content
    assert slow.status_code == 201
    retry = post_json(client, key, body)
    assert retry.status_code == 201 and replayed(retry)
    assert retry.content == slow.content
    record = get_store().get(scope, key)
    assert record is not None and record.status == COMPLETED  # refilled
    assert SideEffect.objects.count() == 1

    # A stale db claim (its owner crashed) with this request's fingerprint is taken over.
    fingerprint = IdempotencyKey.objects.get(key=key).fingerprint
    stale = StaleKeyFactory(scope=scope, fingerprint=fingerprint)
    taken = post_json(client, stale.key, body)
    assert taken.status_code == 201 and not replayed(taken)
    assert IdempotencyKey.objects.get(key=stale.key).status == COMPLETED
    assert SideEffect.objects.count() == 2


# -- end to end: the example API under gunicorn ---------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_race_through_the_example_server_charges_once(
    running_private_redis: RedisServer, backend: str
) -> None:
    from ..support.databases import count_rows
    from ..support.example import (
        assert_one_execution,
        example_server,
        race,
        request,
        scratch_database,
    )

    key = f"pay-{uuid.uuid4().hex[:8]}"
    charge = {"amount": 1999, "currency": "EUR"}
    with (
        scratch_database(backend) as db,
        example_server(
            db,
            strategy="hybrid",
            psp_delay_ms=300,
            env={
                "REDIS_URL": running_private_redis.url,
                # The drain messages go to the private server too.
                "CELERY_BROKER_URL": running_private_redis.url,
            },
        ) as server,
    ):
        url = server.url + "/api/charges/"
        results = race(url, n=20, key=key, body=charge)
        fresh = assert_one_execution(results, n=20)
        # Redis loses everything; the retry is replayed from the outbox.
        import redis

        redis.Redis.from_url(running_private_redis.url).flushall()
        status, body = request(url, key=key, body=charge)
        assert status == 201 and body["_headers"]["idempotent-replayed"] == "true"
        assert body["id"] == fresh[0]["id"]
        assert count_rows(db, "payments_charge") == 1
        assert count_rows(db, "django_idempotency_idempotencyoutbox") == 1
        assert "Traceback" not in server.log()


@pytest.mark.server
def test_a_broker_that_is_down_never_fails_the_request(running_private_redis: RedisServer) -> None:
    """The drain is queued from a background thread: with the Celery broker refusing
    connections the requests still succeed and replay, and the log says why nothing
    was queued (the beat entry drains the outbox later)."""
    from ..support.databases import count_rows
    from ..support.example import example_server, request, scratch_database

    charge = {"amount": 1999, "currency": "EUR"}
    with (
        scratch_database("postgres") as db,
        example_server(
            db,
            strategy="hybrid",
            workers=1,
            env={
                "REDIS_URL": running_private_redis.url,
                "CELERY_BROKER_URL": closed_port_url(),
                "IDEMPOTENCY_LOG_LEVEL": "WARNING",
            },
        ) as server,
    ):
        url = server.url + "/api/charges/"
        for _ in range(3):
            key = uuid.uuid4().hex
            started = time.monotonic()
            status, body = request(url, key=key, body=charge)
            assert status == 201, body
            assert time.monotonic() - started < 2, "the request waited for the broker"
            status, body = request(url, key=key, body=charge)
            assert status == 201 and body["_headers"]["idempotent-replayed"] == "true"
        assert count_rows(db, "payments_charge") == 3
        assert count_rows(db, "django_idempotency_idempotencyoutbox") == 3
        deadline = time.monotonic() + 10
        while "could not queue" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "could not queue django_idempotency.drain_outbox" in server.log()
        assert "Traceback" not in server.log().split("could not queue")[0]
