"""The advisory_lock strategy's write path: one upsert under the lock (PostgreSQL), and the
manager's ``store_completed`` behind it (PostgreSQL and SQLite)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_idempotency.models import IdempotencyKey
from django_idempotency.responses import StoredResponse
from django_idempotency.strategies.advisory import AdvisoryLockStrategy
from django_idempotency.strategies.base import Attempt, Claimed, Mismatch, Replay

from .factories import CompletedKeyFactory
from .testapp.models import SideEffect

PRINT = "a" * 64
RESPONSE = StoredResponse(
    status=201,
    headers={"Content-Type": "application/json", "Location": "/api/charges/7/"},
    body=b'{"id": 7}',
)


def stored(alias: str, key: str) -> dict[str, Any]:
    values = IdempotencyKey.objects.using(alias).filter(scope="user:1", key=key).values().get()
    values["response_body"] = bytes(values["response_body"])
    return values


@pytest.fixture(params=["default", "sqlite"])
def alias(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.django_db(databases=["default", "sqlite"])
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


@pytest.mark.django_db(databases=["default", "sqlite"])
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
    with AdvisoryLockStrategy().session(attempt(key, fingerprint)) as outcome:
        if isinstance(outcome, Claimed):
            SideEffect.objects.create(label=key)
            if doom:  # as DRF does after an APIException in an atomic view
                transaction.set_rollback(True)
            outcome.complete(RESPONSE)
        return outcome


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_completes_then_replays_and_rejects_another_request() -> None:
    assert isinstance(run_view("k1"), Claimed)
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
    assert isinstance(run_view("k1"), Claimed)
    row = stored("default", "k1")
    assert row["id"] == old.pk
    assert row["response_body"] == RESPONSE.body
    assert row["expires_at"] > timezone.now()
    assert SideEffect.objects.filter(label="k1").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_doomed_transaction_rolls_the_view_back_and_stores_the_response_after() -> None:
    assert isinstance(run_view("k1", doom=True), Claimed)
    assert SideEffect.objects.filter(label="k1").count() == 0
    assert stored("default", "k1")["response_body"] == RESPONSE.body
    assert isinstance(run_view("k1"), Replay)
