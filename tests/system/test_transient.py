"""A view whose transaction loses a race inside the database answers 503, not 500.

The conflicts are real: SQLite refusing a deferred transaction's first write after
another connection committed (its "busy snapshot"), and PostgreSQL's lock timeout
on a row another transaction holds. The view's writes are rolled back, the key is
released, and the retry runs the view once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings

from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.problems import PROBLEM_CONTENT_TYPE

from ..support.api import api_client
from ..support.factories import UserFactory
from ..testapp import views
from ..testapp.models import SideEffect

pytestmark = pytest.mark.django_db(databases=["default", "sqlite"], transaction=True)


@pytest.fixture
def contend() -> Iterator[list[Any]]:
    views.contend.clear()
    yield views.contend
    views.contend.clear()


def _post(user: Any, using: str, key: str) -> Any:
    client = api_client(user)
    with override_settings(IDEMPOTENCY={"DATABASE": using}):
        return client.post("/t/contended/", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)


def _in_other_thread(work: Any) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not errors, errors


def _assert_transient(response: Any) -> None:
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == PROBLEM_CONTENT_TYPE
    assert response["Retry-After"] == "1"
    body = json.loads(response.content)
    assert body["type"].endswith("/transient-conflict")


def test_sqlite_busy_snapshot_is_a_503_and_the_retry_runs_once(contend: list[Any]) -> None:
    user = UserFactory()
    contend.append(
        lambda using: _in_other_thread(lambda: SideEffect.objects.using(using).create(label="x"))
    )
    _assert_transient(_post(user, "sqlite", "busy"))
    assert SideEffect.objects.using("sqlite").filter(label="contended").count() == 0
    assert not IdempotencyKey.objects.using("sqlite").filter(key="busy").exists()

    contend.clear()
    retry = _post(user, "sqlite", "busy")
    assert retry.status_code == 201
    assert _post(user, "sqlite", "busy")["Idempotent-Replayed"] == "true"
    assert SideEffect.objects.using("sqlite").filter(label="contended").count() == 1


@pytest.mark.postgres
def test_postgres_lock_timeout_in_the_view_is_a_503(contend: list[Any]) -> None:
    user = UserFactory()
    row = SideEffect.objects.create(label="locked")
    locked = threading.Event()
    release = threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                SideEffect.objects.select_for_update().get(pk=row.pk)
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert locked.wait(30)

    def blocked(using: str) -> None:
        with connections[using].cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '50ms'")
        SideEffect.objects.using(using).select_for_update().get(pk=row.pk)

    contend.append(blocked)
    try:
        _assert_transient(_post(user, "default", "locked"))
    finally:
        release.set()
        thread.join(30)
    assert SideEffect.objects.filter(label="contended").count() == 0
    contend.clear()
    assert _post(user, "default", "locked").status_code == 201
    assert SideEffect.objects.filter(label="contended").count() == 1


def test_other_database_errors_are_not_turned_into_503(contend: list[Any]) -> None:
    from django.db import ProgrammingError

    def broken(using: str) -> None:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table_here")

    contend.append(broken)
    client = api_client(UserFactory())
    from django.db import OperationalError

    with pytest.raises((ProgrammingError, OperationalError)):
        client.post("/t/contended/", {}, format="json", HTTP_IDEMPOTENCY_KEY="bug")
    assert not IdempotencyKey.objects.filter(key="bug").exists()
