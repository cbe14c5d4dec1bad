"""The advisory_lock strategy: its write path, one upsert under the lock (PostgreSQL), and the
manager's ``store_completed`` behind it (PostgreSQL and SQLite); then whole requests on the
real PostgreSQL server: the same protocol as the db strategy, duplicates that wait for the
first request and replay it, and the 64-bit lock as pg_locks shows it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.lifecycle import Lifecycle
from django_idempotency.protocol.replay import REPLAYED_HEADER, StoredResponse
from django_idempotency.store.sql.partitioned import lock_name
from django_idempotency.strategies import get_strategy
from django_idempotency.strategies.advisory import AdvisoryLockStrategy
from django_idempotency.strategies.base import Attempt, Claim, Mismatch, Replay

from ..support.api import advisory_waiters, race_held
from ..support.assertions import assert_problem
from ..support.factories import CompletedKeyFactory, ExpiredKeyFactory, UserFactory
from ..support.gates import Background, Gate
from ..support.waiting import wait_until
from ..testapp.models import SideEffect

pytestmark = pytest.mark.django_db(databases=["default", "sqlite"])

PRINT = "a" * 64
RESPONSE = StoredResponse(
    status=201,
    headers={"Content-Type": "application/json", "Location": "/api/charges/7/"},
    body=b'{"id": 7}',
)


def stored(alias: str, key: str) -> dict[str, Any]:
    values: dict[str, Any] = dict(
        IdempotencyKey.objects.using(alias).filter(scope="user:1", key=key).values().get()
    )
    values["response_body"] = bytes(values["response_body"])
    return values


def test_store_completed_writes_a_completed_record(alias: str) -> None:
    before = timezone.now()
    IdempotencyKey.objects.store_completed(
        "user:1", "k1", PRINT, RESPONSE, ttl=60, method="POST", path="/p/", using=alias
    )
    row = stored(alias, "k1")
    assert row["status"] == "completed"
    assert row["fingerprint"] == PRINT
    assert (row["request_method"], row["request_path"]) == ("POST", "/p/")
    assert row["response_status"] == 201
    assert row["response_headers"] == RESPONSE.headers
    assert row["response_body"] == RESPONSE.body
    assert row["locked_at"] is None
    assert isinstance(row["claim_token"], uuid.UUID)
    assert row["created_at"] == row["completed_at"] >= before
    assert timedelta(seconds=59) < row["expires_at"] - row["completed_at"] <= timedelta(seconds=60)


def test_store_completed_overwrites_an_existing_row_in_place(alias: str) -> None:
    old = CompletedKeyFactory(
        _using=alias, scope="user:1", key="k1", expires_at=timezone.now() - timedelta(seconds=1)
    )
    other = StoredResponse(status=200, headers={}, body=b"second")
    IdempotencyKey.objects.store_completed(
        "user:1", "k1", "b" * 64, other, ttl=60, method="PUT", path="/q/", using=alias
    )
    row = stored(alias, "k1")
    assert row["id"] == old.pk
    assert row["claim_token"] != old.claim_token
    assert (row["fingerprint"], row["request_method"], row["request_path"]) == (
        "b" * 64,
        "PUT",
        "/q/",
    )
    assert (row["response_status"], row["response_headers"], row["response_body"]) == (
        200,
        {},
        b"second",
    )
    assert row["expires_at"] > timezone.now()
    assert IdempotencyKey.objects.using(alias).count() == 1


def attempt(key: str, fingerprint: str = PRINT) -> Attempt:
    return Attempt("user:1", key, fingerprint, ttl=60, lock_timeout=5, method="POST", path="/p/")


def run_view(key: str, fingerprint: str = PRINT, *, doom: bool = False) -> object:
    """One request through the strategy: a SideEffect row per run of the view."""
    with Lifecycle(AdvisoryLockStrategy(), attempt(key, fingerprint)) as outcome_life:
        outcome = outcome_life.outcome
        if isinstance(outcome, Claim):
            SideEffect.objects.create(label=key)
            if doom:  # as DRF does after an APIException in an atomic view
                transaction.set_rollback(True)
            outcome_life.complete(RESPONSE)
        return outcome


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_completes_then_replays_and_rejects_another_request() -> None:
    assert isinstance(run_view("k1"), Claim)
    replay = run_view("k1")
    assert isinstance(replay, Replay)
    assert replay.response == RESPONSE
    assert isinstance(run_view("k1", "b" * 64), Mismatch)
    assert SideEffect.objects.filter(label="k1").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_expired_record_runs_again_and_is_overwritten_in_place() -> None:
    old = CompletedKeyFactory(
        scope="user:1", key="k1", expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert isinstance(run_view("k1"), Claim)
    row = stored("default", "k1")
    assert row["id"] == old.pk
    assert row["response_body"] == RESPONSE.body
    assert row["expires_at"] > timezone.now()
    assert SideEffect.objects.filter(label="k1").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_doomed_transaction_rolls_the_view_back_and_stores_the_response_after() -> None:
    assert isinstance(run_view("k1", doom=True), Claim)
    assert SideEffect.objects.filter(label="k1").count() == 0
    assert stored("default", "k1")["response_body"] == RESPONSE.body
    assert isinstance(run_view("k1"), Replay)


# -- whole requests (PostgreSQL) ------------------------------------------------------------


def post(path: str, data: Any, key: str = "k1", client: Client | None = None) -> Any:
    return (client or Client()).post(
        path, json.dumps(data), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def advisory_locks() -> list[tuple[int, int, int, bool]]:
    """(classid, objid, objsubid, granted) of every advisory lock on this database."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT l.classid::int8, l.objid::int8, l.objsubid, l.granted FROM pg_locks l "
            "JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND d.datname = current_database()"
        )
        return [tuple(row) for row in cursor.fetchall()]


def lock_id(scope: str, key: str) -> tuple[int, int]:
    """The (classid, objid) pair PostgreSQL shows for the strategy's 64-bit lock key."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT hashtextextended(%s, 0)", [lock_name(scope, key)])
        (value,) = cursor.fetchone()
    unsigned = value & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
class TestRequests:
    """Requests through the decorator and the mixin with STRATEGY = "advisory_lock"."""

    @pytest.fixture(autouse=True)
    def advisory(self) -> Iterator[None]:
        with override_settings(IDEMPOTENCY={"STRATEGY": "advisory_lock"}):
            assert isinstance(get_strategy(), AdvisoryLockStrategy)
            yield

    def test_replay_and_mismatch(self) -> None:
        first = post("/t/fn/", {"a": 1})
        assert first.status_code == 201
        replay = post("/t/fn/", {"a": 1})
        assert replay.content == first.content and replay[REPLAYED_HEADER] == "true"
        assert "Set-Cookie" not in replay and replay["Location"] == "/somewhere/1"
        assert_problem(post("/t/fn/", {"a": 2}), 422, "key-reused")
        assert SideEffect.objects.count() == 1
        record = IdempotencyKey.objects.get()
        assert record.status == "completed" and record.response_status == 201

    def test_server_error_and_exception_roll_back_and_release(self) -> None:
        assert post("/t/fn/", {"status": 500}).status_code == 500
        failing = post(
            "/t/fn/", {"raise": True}, key="k2", client=Client(raise_request_exception=False)
        )
        assert failing.status_code == 500
        assert SideEffect.objects.count() == 0
        assert not IdempotencyKey.objects.exists()
        assert post("/t/fn/", {"status": 500}).status_code == 500  # ran again: released
        assert post("/t/fn/", {"status": 201}, key="k3").status_code == 201
        assert SideEffect.objects.count() == 1

    @override_settings(IDEMPOTENCY={"STRATEGY": "advisory_lock", "STORE_SERVER_ERRORS": True})
    def test_server_error_stored_when_configured(self) -> None:
        first = post("/t/fn/", {"status": 502})
        replay = post("/t/fn/", {"status": 502})
        assert replay.status_code == 502 and replay.content == first.content
        assert replay[REPLAYED_HEADER] == "true"
        assert SideEffect.objects.count() == 1  # stored like any response: its writes stay

    def test_drf_validation_error_is_stored_and_replayed(self) -> None:
        user = UserFactory()
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {user.auth_token.key}")
        first = client.post("/t/drf/", {"invalid": True}, format="json", HTTP_IDEMPOTENCY_KEY="v")
        replay = client.post("/t/drf/", {"invalid": True}, format="json", HTTP_IDEMPOTENCY_KEY="v")
        assert first.status_code == replay.status_code == 400
        assert replay.content == first.content and replay[REPLAYED_HEADER] == "true"

    def test_expired_key_runs_again(self) -> None:
        ExpiredKeyFactory(scope="anonymous", key="old", fingerprint="0" * 64)
        assert post("/t/fn/", {"a": 1}, key="old").status_code == 201
        assert SideEffect.objects.count() == 1
        assert post("/t/fn/", {"a": 1}, key="old")[REPLAYED_HEADER] == "true"
        assert IdempotencyKey.objects.get().status == "completed"

    @pytest.mark.urls("tests.support.gates")
    def test_duplicate_waits_for_the_first_and_gets_its_replay(self, gate: Gate) -> None:
        classid, objid = lock_id("anonymous", "dup")
        first = Background("/gated/", "dup")
        assert gate.entered.wait(timeout=30)
        # the 64-bit lock is held while the view runs: high half in classid, low in objid
        assert (classid, objid, 1, True) in advisory_locks()
        duplicate = Background("/gated/", "dup")
        wait_until(lambda: (classid, objid, 1, False) in advisory_locks())  # it waits its turn
        assert not IdempotencyKey.objects.exists()  # nothing is written before completion
        gate.opened.set()
        original, replay = first.result(), duplicate.result()
        assert original.status_code == replay.status_code == 201
        assert replay.content == original.content
        assert replay[REPLAYED_HEADER] == "true" and REPLAYED_HEADER not in original
        assert SideEffect.objects.count() == 1
        assert advisory_locks() == []

    @pytest.mark.urls("tests.support.gates")
    def test_duplicate_that_waits_past_the_lock_timeout_gets_409(self, gate: Gate) -> None:
        first = Background("/gated-short-lock/", "slow")  # lock_timeout=0.3
        assert gate.entered.wait(timeout=30)
        conflict = Client().post(
            "/gated-short-lock/",
            {"amount": 1},
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="slow",
        )
        assert_problem(conflict, 409, "request-in-progress")
        assert int(conflict["Retry-After"]) >= 1
        gate.opened.set()
        assert first.result().status_code == 201
        assert SideEffect.objects.count() == 1

    @pytest.mark.urls("tests.support.gates")
    def test_different_keys_do_not_wait_for_each_other(self, gate: Gate) -> None:
        first = Background("/gated/", "one")
        assert gate.entered.wait(timeout=30)
        gate.entered.clear()
        second = Background("/gated/", "two")
        assert gate.entered.wait(timeout=30)  # entered its view while the first holds its lock
        assert len([lock for lock in advisory_locks() if lock[3]]) == 2
        gate.opened.set()
        assert first.result().status_code == second.result().status_code == 201
        assert SideEffect.objects.count() == 2

    def test_sixteen_concurrent_requests_run_the_view_once(self) -> None:

        def send(_: int, body: dict[str, Any]) -> tuple[int, bool]:
            response = post("/t/fn/", {"a": 1, **body}, key="race")
            return response.status_code, response.has_header(REPLAYED_HEADER)

        # The first one runs until the 15 others queue on its lock.
        statuses = race_held(16, send, uuid.uuid4().hex, advisory_waiters)
        assert len(statuses) == 16
        assert SideEffect.objects.count() == 1
        assert statuses.count((201, False)) == 1
        assert statuses.count((201, True)) == 15  # every duplicate waited and replayed
