"""The ``redis`` strategy through the test views and directly, on real Redis servers.

Redis failures are real: a loopback port where nothing listens (refused), a socket that
accepts and never answers (hung), or a private ``redis-server`` killed mid-request.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from django.core.checks import run_checks
from rest_framework.test import APIClient

from django_idempotency.errors import LeaseLost, StoreUnavailable
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.lease import keeper
from django_idempotency.protocol.lifecycle import Lifecycle
from django_idempotency.protocol.problems import PROBLEM_CONTENT_TYPE
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.strategies import load_strategy
from django_idempotency.strategies.base import Attempt, Claim, InProgress, Mismatch, Replay
from django_idempotency.strategies.redis.store import get_store
from django_idempotency.strategies.redis.strategy import RedisClaim, RedisStrategy
from tests.testapp import holds
from tests.testapp.models import SideEffect

from ...support.api import post_json
from ...support.connects import counting, port_of
from ...support.redis_servers import Blackhole, RedisServer, closed_port_url
from ...support.threads import in_background, run_at_once
from ...support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def on_shared_redis(redis_settings: Any, shared_redis_url: str) -> dict[str, Any]:
    return redis_settings(shared_redis_url)


def _attempt(
    key: str, *, fingerprint: str = "fp", lock_timeout: float = 5, atomic: bool = True
) -> Attempt:
    return Attempt(
        scope="user:1",
        key=key,
        fingerprint=fingerprint,
        ttl=60,
        lock_timeout=lock_timeout,
        method="POST",
        path="/t/",
        atomic=atomic,
    )


def test_strategy_is_registered_under_its_name() -> None:
    assert isinstance(load_strategy("redis"), RedisStrategy)
    assert load_strategy("redis").name == "redis"


# -- through the views ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/t/drf/", "/t/fn/"])
def test_first_request_runs_the_view_and_retries_replay_it(
    path: str, api: APIClient, on_shared_redis: dict[str, Any]
) -> None:
    key = uuid.uuid4().hex
    first = post_json(api, key, {"amount": 1}, path)
    assert first.status_code == 201
    assert SideEffect.objects.count() == 1
    again = post_json(api, key, {"amount": 1}, path)
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    if path == "/t/fn/":  # the function view sets these headers
        assert again["Location"] == "/somewhere/1"
        assert "Set-Cookie" not in again and "X-Request-Private" not in again
    assert SideEffect.objects.count() == 1
    # The key lives in Redis, not in the database.
    assert IdempotencyKey.objects.count() == 0
    other = post_json(api, key, {"amount": 2}, path)
    assert other.status_code == 422
    assert other["Content-Type"] == PROBLEM_CONTENT_TYPE
    assert other.json()["status"] == 422
    assert SideEffect.objects.count() == 1


def test_server_error_releases_the_key_and_undoes_the_writes(
    api: APIClient, on_shared_redis: dict[str, Any]
) -> None:
    key = uuid.uuid4().hex
    failed = post_json(api, key, {"status": 500})
    assert failed.status_code == 500
    assert SideEffect.objects.count() == 0, "the view's writes were rolled back"
    assert get_store().record_key("x", "y")  # the store is configured
    retry = post_json(api, key, {"status": 500})
    assert retry.status_code == 500 and not retry.has_header("Idempotent-Replayed")


def test_a_client_error_is_stored_and_replayed(
    api: APIClient, on_shared_redis: dict[str, Any]
) -> None:
    key = uuid.uuid4().hex
    first = post_json(api, key, {"invalid": True})
    assert first.status_code == 400
    again = post_json(api, key, {"invalid": True})
    assert again.status_code == 400 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert SideEffect.objects.count() == 1, "the view ran once"


def test_a_duplicate_during_the_view_gets_409(
    api: APIClient, on_shared_redis: dict[str, Any]
) -> None:
    key = uuid.uuid4().hex
    # The view runs until the test releases it: the requests below arrive while it runs.
    runner = in_background(lambda: post_json(api, key, {"hold": key}))
    prefix = on_shared_redis["REDIS_KEY_PREFIX"]
    try:
        claimed = lambda: bool(list(get_store().client.scan_iter(match=f"{prefix}:*")))  # noqa: E731
        wait_until(claimed, timeout=60)
        other_scope = post_json(APIClient(), key, {}, "/t/fn/")  # anonymous: another scope
        assert other_scope.status_code == 201
        busy = post_json(api, key, {"hold": key})
    finally:
        holds.release(key)
    first = runner.result(60)
    assert busy.status_code == 409
    assert busy["Content-Type"] == PROBLEM_CONTENT_TYPE and busy.has_header("Retry-After")
    assert first.status_code == 201
    assert SideEffect.objects.filter(label="drf").count() == 1


# -- the strategy directly ---------------------------------------------------------------------


def test_session_outcomes(on_shared_redis: dict[str, Any]) -> None:
    strategy = RedisStrategy()
    attempt = _attempt(uuid.uuid4().hex, atomic=False)
    with Lifecycle(strategy, attempt) as outcome_life:
        outcome = outcome_life.outcome
        assert isinstance(outcome, RedisClaim) and not outcome.taken_over
        with Lifecycle(strategy, attempt) as duplicate_life:
            duplicate = duplicate_life.outcome
            assert isinstance(duplicate, InProgress)
        with Lifecycle(
            strategy, _attempt(attempt.key, fingerprint="other", atomic=False)
        ) as other_life:
            other = other_life.outcome
            assert isinstance(other, Mismatch)
        outcome_life.complete(StoredResponse(201, {}, b"done"))
    with Lifecycle(strategy, attempt) as replay_life:
        replay = replay_life.outcome
        assert isinstance(replay, Replay) and replay.response.body == b"done"
    record = get_store().get(attempt.scope, attempt.key)
    assert record is not None and record.completed
    assert 55_000 < get_store().pttl(attempt.scope, attempt.key) <= 60_000, "lives attempt.ttl"


def test_lease_is_lock_timeout_and_the_heartbeat_keeps_it(on_shared_redis: dict[str, Any]) -> None:
    """The key lives one lease (lock_timeout) and the heartbeat (twenty per lease) keeps
    it past two and a half, however long a busy machine takes to get there."""
    strategy = RedisStrategy()
    attempt = _attempt(uuid.uuid4().hex, lock_timeout=1.0, atomic=False)
    store = get_store()
    with Lifecycle(strategy, attempt) as claim_life:
        claim = claim_life.outcome
        assert isinstance(claim, Claim)
        claimed = time.monotonic()
        assert 0 < store.pttl(attempt.scope, attempt.key) <= 1000
        with keeper.keep(claim, 0.05) as lease:
            wait_until(lambda: lease.renewals >= 5 and time.monotonic() - claimed > 2.5, timeout=60)
            assert not lease.lost
            with Lifecycle(strategy, attempt) as duplicate_life:
                duplicate = duplicate_life.outcome
                assert isinstance(duplicate, InProgress)
        claim_life.release()
    assert store.get(attempt.scope, attempt.key) is None


def test_lost_lease_is_fenced_and_the_views_writes_roll_back(
    on_shared_redis: dict[str, Any],
) -> None:
    strategy = RedisStrategy()
    attempt = _attempt(uuid.uuid4().hex, lock_timeout=0.1)

    def stale_owner() -> None:
        with Lifecycle(strategy, attempt) as claim_life:
            claim = claim_life.outcome
            assert isinstance(claim, RedisClaim)
            SideEffect.objects.create(label="stale owner")
            # No heartbeat: the lease expires (Redis's PX, 100 ms).
            wait_until(lambda: get_store().get(attempt.scope, attempt.key) is None)
            with Lifecycle(strategy, _attempt(attempt.key, atomic=False)) as second_life:
                second = second_life.outcome
                assert isinstance(second, RedisClaim)
                assert not claim.renew()
                assert not claim.release(), "a late release does not free the new key"
                second_life.complete(StoredResponse(201, {}, b"fresh"))
            claim_life.complete(StoredResponse(201, {}, b"stale"))

    with pytest.raises(LeaseLost):
        stale_owner()
    assert SideEffect.objects.count() == 0
    record = get_store().get(attempt.scope, attempt.key)
    assert record is not None and record.response is not None and record.response.body == b"fresh"


@pytest.mark.postgres
def test_failed_commit_undoes_the_completion(on_shared_redis: dict[str, Any]) -> None:
    """A COMMIT that fails after the response was stored deletes the record again, so
    that the retry runs the view (a deferred constraint is checked at COMMIT)."""
    from django.db import IntegrityError, connection

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMPORARY TABLE deferred_check (n int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
        )
    strategy = RedisStrategy()
    attempt = _attempt(uuid.uuid4().hex)

    def view() -> None:
        with Lifecycle(strategy, attempt) as claim_life:
            claim = claim_life.outcome
            assert isinstance(claim, RedisClaim)
            SideEffect.objects.create(label="doomed")
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO deferred_check VALUES (1), (1)")
            claim_life.complete(StoredResponse(201, {}, b"x"))
            # Prepared, until COMMIT has returned.
            assert get_store().get(attempt.scope, attempt.key).prepared  # type: ignore[union-attr]

    with pytest.raises(IntegrityError):  # at COMMIT
        view()
    assert SideEffect.objects.count() == 0
    assert get_store().get(attempt.scope, attempt.key) is None
    with Lifecycle(strategy, attempt) as retry_life:
        retry = retry_life.outcome
        assert isinstance(retry, RedisClaim)
        retry_life.release()


def test_racing_sessions_have_one_owner(on_shared_redis: dict[str, Any]) -> None:
    strategy = RedisStrategy()
    attempt = _attempt(uuid.uuid4().hex, atomic=False)

    def run(_: int) -> Any:
        with Lifecycle(strategy, attempt) as outcome_life:
            outcome = outcome_life.outcome
            if isinstance(outcome, Claim):
                time.sleep(0.2)
                outcome_life.complete(StoredResponse(201, {}, b"once"))
        return outcome

    outcomes = run_at_once(20, run)
    assert sum(isinstance(o, Claim) for o in outcomes) == 1
    assert all(isinstance(o, (Claim, InProgress, Replay)) for o in outcomes)
    assert len(outcomes) == 20


# -- when Redis fails ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/t/drf/", "/t/fn/"])
def test_fallback_to_the_db_strategy_when_redis_refuses(
    path: str,
    api: APIClient,
    redis_settings: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = closed_port_url()
    redis_settings(url, REDIS_FAILURE_MODE="db")
    key = uuid.uuid4().hex
    connects = counting(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        first = post_json(api, key, {"amount": 1}, path)
    assert first.status_code == 201, first.content
    # No wait for Redis: refused once, not tried again (counted, not timed).
    assert connects.total == Counter({port_of(url): 1}), connects.total
    assert any("Redis is unavailable" in r.getMessage() for r in caplog.records)
    # The db strategy holds the key meanwhile, and replays it.
    assert IdempotencyKey.objects.filter(key=key, status="completed").count() == 1
    again = post_json(api, key, {"amount": 1}, path)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert SideEffect.objects.count() == 1


@pytest.mark.parametrize("path", ["/t/drf/", "/t/fn/"])
def test_fail_closed_answers_503_problem_json(
    path: str, api: APIClient, redis_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = closed_port_url()
    redis_settings(url, REDIS_FAILURE_MODE="fail_closed")
    connects = counting(monkeypatch)
    response = post_json(api, uuid.uuid4().hex, {"amount": 1}, path)
    # Refused once, not tried again (no retry with back-off): counted, not timed.
    assert connects.total == Counter({port_of(url): 1}), connects.total
    assert response.status_code == 503
    assert response["Content-Type"] == PROBLEM_CONTENT_TYPE
    problem = response.json()
    assert problem["status"] == 503
    assert problem["type"] == StoreUnavailable().type_uri
    assert SideEffect.objects.count() == 0, "the view did not run"
    assert IdempotencyKey.objects.count() == 0


@pytest.mark.parametrize(("mode", "status"), [("fail_closed", 503), ("db", 201)])
def test_a_hung_redis_is_given_up_after_the_socket_timeout(
    mode: str, status: int, api: APIClient, redis_settings: Any
) -> None:
    """A socket that accepts and never answers: the connection's first exchange (before the
    claim is written) times out, so the claim did nothing and may fall back. A claim that
    was sent and timed out is another matter (test_strategy_unknown.py)."""
    hole = Blackhole()
    try:
        redis_settings(hole.url, REDIS_FAILURE_MODE=mode, REDIS_SOCKET_TIMEOUT=0.2)
        started = time.monotonic()
        response = post_json(api, uuid.uuid4().hex, {"amount": 1})
        elapsed = time.monotonic() - started
        # One attempt, given up after the socket timeout: never retried (counted, not timed).
        attempts = hole.connections()
    finally:
        hole.close()
    assert response.status_code == status, response.content
    assert elapsed >= 0.2 and attempts == 1, (elapsed, attempts)


def test_redis_dying_during_the_view_rolls_back_and_answers_503(
    api: APIClient, redis_settings: Any, running_private_redis: RedisServer
) -> None:
    server = running_private_redis
    redis_settings(server.url, REDIS_FAILURE_MODE="db")
    strategy = RedisStrategy()
    attempt = _attempt(uuid.uuid4().hex)

    def view() -> None:
        with Lifecycle(strategy, attempt) as claim_life:
            claim = claim_life.outcome
            assert isinstance(claim, RedisClaim)
            SideEffect.objects.create(label="charged")
            server.kill()
            claim_life.complete(StoredResponse(201, {}, b"lost"))

    with pytest.raises(StoreUnavailable):
        view()
    assert SideEffect.objects.count() == 0
    server.start()
    # Through the view: the retry runs once Redis is back.
    key = uuid.uuid4().hex
    assert post_json(api, key, {"amount": 1}).status_code == 201
    assert post_json(api, key, {"amount": 1})["Idempotent-Replayed"] == "true"


# -- system checks ------------------------------------------------------------------------------


def _ids(settings: Any, idempotency: dict[str, Any]) -> set[str]:
    settings.IDEMPOTENCY = idempotency
    return {m.id for m in run_checks() if m.id and m.id.startswith("django_idempotency.")}


def test_check_e011_redis_strategy_without_a_redis(settings: Any) -> None:
    assert "django_idempotency.E011" in _ids(settings, {"STRATEGY": "redis"})
    assert "django_idempotency.E011" in _ids(settings, {"STRATEGY": "hybrid"})
    assert "django_idempotency.E011" not in _ids(
        settings, {"STRATEGY": "redis", "REDIS_URL": "redis://x"}
    )
    assert "django_idempotency.E011" not in _ids(settings, {"STRATEGY": "db"})
    settings.IDEMPOTENCY = {"STRATEGY": "redis"}
    (error,) = [m for m in run_checks() if m.id == "django_idempotency.E011"]
    assert "REDIS_URL" in error.msg and error.hint


def test_check_e012_cache_alias_must_be_django_redis(settings: Any) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/15",
        },
    }
    assert "django_idempotency.E012" in _ids(
        settings, {"STRATEGY": "redis", "REDIS_CACHE_ALIAS": "default"}
    )
    assert "django_idempotency.E012" in _ids(
        settings, {"STRATEGY": "redis", "REDIS_CACHE_ALIAS": "missing"}
    )
    ids = _ids(settings, {"STRATEGY": "redis", "REDIS_CACHE_ALIAS": "redis"})
    assert not ids & {"django_idempotency.E011", "django_idempotency.E012"}


# -- end to end: the example API under gunicorn ------------------------------------------------


@pytest.mark.server
@pytest.mark.postgres
def test_race_through_the_example_server_charges_once(running_private_redis: RedisServer) -> None:
    from ...support.databases import count_rows
    from ...support.example import (
        assert_one_execution,
        example_server,
        race,
        request,
        scratch_database,
    )

    key = f"pay-{uuid.uuid4().hex[:8]}"
    charge = {"amount": 1999, "currency": "EUR"}
    with (
        scratch_database("postgres") as db,
        example_server(
            db, strategy="redis", psp_delay_ms=300, env={"REDIS_URL": running_private_redis.url}
        ) as server,
    ):
        url = server.url + "/api/charges/"
        results = race(url, n=20, key=key, body=charge)
        fresh = assert_one_execution(results, n=20)
        status, body = request(url, key=key, body=charge)
        assert status == 201 and body["_headers"]["idempotent-replayed"] == "true"
        assert body["id"] == fresh[0]["id"]
        assert count_rows(db, "payments_charge") == 1
        # The key is in Redis, not in the database.
        assert count_rows(db, "django_idempotency_idempotencykey") == 0
        assert "Traceback" not in server.log()
