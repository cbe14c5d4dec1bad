"""Steps (docs/steps.md) with the keys on SQLite and on MariaDB under ``db``: a local
step commits its writes with the key's recovery point on the key's database, a retry after
a failed step resumes after it, and a step of a claim that is no longer this request's is
refused (409 lease-lost) and rolled back, on each vendor's own server."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_idempotency.decorators import idempotent
from django_idempotency.models import IdempotencyKey

from ..support.assertions import assert_problem
from ..support.mariadb import MARIADB, MYSQL_PATH, mysql_statements, with_mariadb
from ..testapp.models import SideEffect

pytestmark = pytest.mark.django_db(databases=with_mariadb("default", "sqlite"), transaction=True)

#: What the next request of the view does: fail in step "record", or take its own claim
#: away before it (another request took the key over).
PLAN: dict[str, str] = {}


def _view(request: HttpRequest) -> HttpResponse:
    alias = json.loads(request.body)["alias"]
    steps = request.idempotency.steps  # type: ignore[attr-defined]

    def effect(name: str) -> int:
        row = SideEffect.objects.using(alias).create(label=name)
        if PLAN.get("fail") == name:
            del PLAN["fail"]
            raise RuntimeError(f"failed in {name}")
        return row.pk

    created = steps.local("create", effect, "create")
    if PLAN.pop("steal", None):
        IdempotencyKey.objects.using(alias).filter(key=request.headers["Idempotency-Key"]).update(
            claim_token=uuid.uuid4()
        )
    steps.local("record", effect, "record")
    return JsonResponse({"created": created, "resumed": steps.resumed}, status=201)


urlpatterns = [path("stepped/", csrf_exempt(idempotent(steps=True)(_view)))]


@pytest.fixture(params=["sqlite", MARIADB, MYSQL_PATH])
def keys_on(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    """SQLite, MariaDB, and MariaDB through MySQL's statements (no ``RETURNING``)."""
    alias = "mariadb" if request.param == "mariadb-as-mysql" else str(request.param)
    settings.ROOT_URLCONF = __name__
    settings.IDEMPOTENCY = {
        "DATABASE": alias,
        "STRATEGY": "db",
        "UNPROTECTED_DATABASES": ["default"],
    }
    PLAN.clear()
    if request.param == "mariadb-as-mysql":
        with mysql_statements(alias):
            yield alias
    else:
        yield alias


def post(alias: str, key: str = "k1") -> Any:
    return Client(raise_request_exception=False).post(
        "/stepped/",
        json.dumps({"alias": alias}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
    )


def labels(alias: str) -> list[str]:
    return sorted(SideEffect.objects.using(alias).values_list("label", flat=True))


def test_a_retry_resumes_after_the_step_that_committed(keys_on: str) -> None:
    PLAN["fail"] = "record"
    assert post(keys_on).status_code == 500
    row = IdempotencyKey.objects.using(keys_on).get(key="k1")
    assert (row.status, row.recovery_point) == ("in_progress", "create")
    assert labels(keys_on) == ["create"], "the failed step rolled back, the first stayed"
    retry = post(keys_on)
    assert retry.status_code == 201, retry.content
    assert retry.json()["resumed"] is True
    assert labels(keys_on) == ["create", "record"]
    row.refresh_from_db(using=keys_on)
    assert (row.status, row.recovery_point) == ("completed", "record")
    replay = post(keys_on)
    assert replay.status_code == 201 and replay.content == retry.content
    assert labels(keys_on) == ["create", "record"]


def test_a_step_of_a_claim_taken_away_is_refused_and_rolled_back(keys_on: str) -> None:
    PLAN["steal"] = "yes"
    assert_problem(post(keys_on), 409, "lease-lost")
    assert labels(keys_on) == ["create"], "the fenced step rolled back"
    row = IdempotencyKey.objects.using(keys_on).get(key="k1")
    assert (row.status, row.recovery_point) == ("in_progress", "create")


def test_a_released_key_keeps_its_steps_and_is_taken_over_at_once(keys_on: str) -> None:
    """The admin's release (``release_stuck``) of a key whose lease is live gives its claim
    back on each vendor's clock: the retry takes it over at once and resumes."""
    from django.utils import timezone

    PLAN["fail"] = "record"
    assert post(keys_on).status_code == 500
    keys = IdempotencyKey.objects.using(keys_on)
    keys.filter(key="k1").update(locked_at=timezone.now())
    assert post(keys_on).status_code == 409  # its lease is live: in progress
    assert keys.release_stuck() == 1
    assert keys.get(key="k1").recovery_point == "create"
    retry = post(keys_on)
    assert retry.status_code == 201, retry.content
    assert retry.json()["resumed"] is True
    assert labels(keys_on) == ["create", "record"]


def test_the_purge_keeps_a_key_left_with_steps_past_its_ttl(keys_on: str) -> None:
    """The purge on each vendor (one statement on SQLite, the ORM's on MariaDB) leaves a key
    in progress with a committed step, its lease lapsed and its TTL over, beside an expired
    key in progress without steps and an expired completed key, which it deletes; the
    retry resumes the key it kept."""
    from datetime import timedelta

    from django_idempotency.store.clock import database_ago

    from ..support.factories import ExpiredKeyFactory, StaleKeyFactory

    PLAN["fail"] = "record"
    assert post(keys_on).status_code == 500
    keys = IdempotencyKey.objects.using(keys_on)
    keys.bulk_create([ExpiredKeyFactory.build(key="done"), StaleKeyFactory.build(key="bare")])
    keys.update(expires_at=database_ago(timedelta(days=2)))
    assert list(keys.unfinished().values_list("key", flat=True)) == ["k1"]
    assert not keys.unfinished(older_than=timedelta(days=3)).exists()  # expired 2 days ago
    assert keys.delete_expired(using=keys_on) == 2
    assert list(keys.values_list("key", flat=True)) == ["k1"]
    retry = post(keys_on)
    assert retry.status_code == 201, retry.content
    assert retry.json()["resumed"] is True
    assert labels(keys_on) == ["create", "record"]


def test_a_takeover_keeps_the_first_claims_time_on_the_databases_clock(keys_on: str) -> None:
    """``DOWNSTREAM_KEY_LIFETIME`` counts from the key's first claim on each vendor: the
    takeover of a key given back with steps keeps its ``created_at``, and the age is
    judged by the database's clock."""
    from datetime import timedelta

    from django.db.models import DateTimeField, ExpressionWrapper, Value

    from django_idempotency.store.clock import DatabaseNow
    from django_idempotency.strategies.stepped import StepClaim, SteppedDatabaseStrategy
    from django_idempotency.values.attempt import Attempt

    PLAN["fail"] = "record"
    assert post(keys_on).status_code == 500
    keys = IdempotencyKey.objects.using(keys_on)
    two_hours_ago = ExpressionWrapper(
        DatabaseNow() - Value(timedelta(hours=2)), output_field=DateTimeField()
    )
    keys.filter(key="k1").update(created_at=two_hours_ago)
    first = keys.get(key="k1").created_at
    attempt = keys.get(key="k1")
    claim = SteppedDatabaseStrategy().claim(
        Attempt(
            scope=attempt.scope,
            key="k1",
            fingerprint=attempt.fingerprint,
            ttl=60,
            lock_timeout=30,
            database=keys_on,
        )
    )
    assert isinstance(claim, StepClaim) and claim.taken_over
    assert keys.get(key="k1").created_at == first
    assert not claim.first_claimed_within(3600)
    assert claim.first_claimed_within(3 * 3600)
    assert claim.release()  # handed back with its steps
    assert keys.get(key="k1").recovery_point == "create"
