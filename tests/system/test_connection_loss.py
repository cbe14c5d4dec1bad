"""A view whose database connection is lost answers 503, not 500.

The losses are real: the view's PostgreSQL backend is terminated with
``pg_terminate_backend`` (what a server restart or an administrator does), either by
the view itself right after its write, or by another thread while the view waits
inside its transaction. The server rolls the transaction back; the client is told to
retry with the same key, and the retry runs the view once. When the database cannot
be reached to release the key either, the retry gets 409 until the lease is stale.
The classification of each kind of database error is tested on its own at the end.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import (
    DatabaseError,
    Error,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    close_old_connections,
    connections,
)
from django.test import Client, override_settings

from django_idempotency.conf import conf
from django_idempotency.errors import DatabaseUnavailable, TransientConflict
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.problems import PROBLEM_CONTENT_TYPE
from django_idempotency.protocol.replay import REPLAYED_HEADER
from django_idempotency.store.errors import classify_database_error

from ..testapp import views
from ..testapp.models import SideEffect

#: The DRF view and the function view, with the label of the row each writes.
ROUTES = {"drf": ("/t/drf-lost/", "drf-lost"), "function": ("/t/fn-lost/", "fn-lost")}


@pytest.fixture
def after_write() -> Iterator[list[Any]]:
    views.after_write.clear()
    yield views.after_write
    views.after_write.clear()


def _post(path: str, key: str) -> Any:
    return Client().post(
        path, json.dumps({"amount": 100}), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def _terminate_itself(using: str) -> None:
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


def _terminated_by_another_thread(using: str) -> None:
    """Hands the view's backend pid to another thread, waits inside the view's
    transaction until that thread has terminated the backend, then goes on."""
    pid = connections[using].connection.info.backend_pid
    terminated = threading.Event()
    results: list[object] = []

    def terminate() -> None:
        try:
            with connections[using].cursor() as cursor:
                # With a timeout the call returns once the backend has exited.
                cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
                results.append(cursor.fetchone()[0])
        except BaseException as exc:
            results.append(exc)
        finally:
            connections.close_all()  # this thread's own connection
            terminated.set()

    threading.Thread(target=terminate).start()
    assert terminated.wait(30)
    assert results == [True], results


def _terminate_itself_then_query(using: str) -> None:
    """Code that swallows the first error and goes on: psycopg then reports the closed
    connection without a SQLSTATE."""
    with contextlib.suppress(OperationalError):
        _terminate_itself(using)
    SideEffect.objects.using(using).count()


def _terminate_itself_then_closed_connection(using: str) -> None:
    """psycopg2's report of a connection it has marked closed: Django's InterfaceError,
    which is not a DatabaseError."""
    with contextlib.suppress(OperationalError):
        _terminate_itself(using)
    raise InterfaceError("connection already closed")


def _assert_connection_lost(response: Any) -> None:
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == PROBLEM_CONTENT_TYPE
    assert response["Retry-After"] == "1"
    body = json.loads(response.content)
    assert body["status"] == 503
    assert body["type"].endswith("/database-unavailable")


def _request_finished() -> None:
    """What Django's handler does at the end of a request (the test client does not):
    a connection that saw an error is checked, and closed when it no longer works."""
    close_old_connections()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "interfere",
    [
        _terminate_itself,
        _terminated_by_another_thread,
        _terminate_itself_then_query,
        _terminate_itself_then_closed_connection,
    ],
    ids=[
        "terminated-by-itself",
        "terminated-by-another-thread",
        "closed-connection-reused",
        "interface-error",
    ],
)
@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_lost_connection_in_the_view_is_a_503_and_the_retry_runs_once(
    after_write: list[Any], route: str, interfere: Callable[[str], None], strategy: str
) -> None:
    path, label = ROUTES[route]
    after_write.append(interfere)
    with override_settings(IDEMPOTENCY={"STRATEGY": strategy}):
        _run_lost_then_retry(path, label)


def _run_lost_then_retry(path: str, label: str) -> None:
    _assert_connection_lost(_post(path, "lost"))
    _request_finished()
    # The broken connection is not kept: closed, or already replaced by one that works.
    connection = connections["default"]
    assert connection.connection is None or connection.is_usable()
    # The server rolled the view's transaction back, and the key was released.
    assert SideEffect.objects.filter(label=label).count() == 0
    assert not IdempotencyKey.objects.filter(key="lost").exists()

    views.after_write.clear()
    retry = _post(path, "lost")
    assert retry.status_code == 201, retry.content
    assert REPLAYED_HEADER not in retry
    assert _post(path, "lost")[REPLAYED_HEADER] == "true"
    assert SideEffect.objects.filter(label=label).count() == 1


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_database_still_down_at_release_leaves_the_key_until_the_lock_timeout(
    after_write: list[Any], route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the key cannot be released either (the database is still unreachable), the
    answer is the same 503; the claim stays in progress, so a retry gets 409 with
    Retry-After until the lease is stale, and then takes the key over and runs the view."""
    path, label = ROUTES[route]
    settings_dict = connections["default"].settings_dict

    def terminate_and_stay_down(using: str) -> None:
        # Reconnecting fails from now on: nothing listens on port 1.
        monkeypatch.setitem(settings_dict, "PORT", "1")
        _terminate_itself(using)

    after_write.append(terminate_and_stay_down)
    _assert_connection_lost(_post(path, "down"))
    monkeypatch.undo()  # the database is back
    _request_finished()
    assert SideEffect.objects.filter(label=label).count() == 0
    assert IdempotencyKey.objects.get(key="down").status == "in_progress"

    after_write.clear()
    busy = _post(path, "down")
    assert busy.status_code == 409, busy.content
    assert json.loads(busy.content)["type"].endswith("/request-in-progress")
    assert int(busy["Retry-After"]) >= 1
    # Let the lease go stale without sleeping through LOCK_TIMEOUT.
    record = IdempotencyKey.objects.get(key="down")
    assert record.locked_at is not None
    record.locked_at -= timedelta(seconds=conf.LOCK_TIMEOUT + 1)
    record.save(update_fields=["locked_at"])
    retry = _post(path, "down")
    assert retry.status_code == 201, retry.content
    assert SideEffect.objects.filter(label=label).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_without_atomic_the_writes_stay_and_the_key_waits_for_the_lock_timeout(
    after_write: list[Any],
) -> None:
    """With ATOMIC off nothing rolls the view's write back, and the release runs on the
    broken connection and fails: the answer is the same 503, then 409 until the lease is
    stale."""
    after_write.append(_terminate_itself)
    with override_settings(IDEMPOTENCY={"ATOMIC": False}):
        _assert_connection_lost(_post("/t/drf-lost/", "plain"))
        _request_finished()
        assert SideEffect.objects.filter(label="drf-lost").count() == 1
        assert IdempotencyKey.objects.get(key="plain").status == "in_progress"
        after_write.clear()
        assert _post("/t/drf-lost/", "plain").status_code == 409


# -- the classification, error by error ---------------------------------------------------


def _django_error(cls: type[Error], cause: BaseException | None, text: str = "") -> Any:
    """A Django database error as Django raises it: the driver's error as its cause."""
    error = cls(text or str(cause))
    error.__cause__ = cause
    return error


def _psycopg(sqlstate: str) -> BaseException:
    import psycopg

    return psycopg.errors.lookup(sqlstate)("from the server")


def _psycopg_interface_error(message: str) -> BaseException:
    import psycopg

    return psycopg.InterfaceError(message)


class _Psycopg2Error(Exception):
    """Stands for a psycopg2 error, which carries the SQLSTATE as ``pgcode``."""

    __module__ = "psycopg2.errors"

    def __init__(self, pgcode: str | None) -> None:
        super().__init__("psycopg2 error")
        self.pgcode = pgcode


class _Connection:
    """Just what the classification asks of a Django connection."""

    def __init__(self, usable: bool, *, in_atomic_block: bool = False) -> None:
        self.connection = object()
        self.in_atomic_block = in_atomic_block
        self.usable = usable

    def is_usable(self) -> bool:
        return self.usable


@pytest.mark.parametrize(
    "error",
    [
        _django_error(OperationalError, _psycopg("57P01")),  # admin_shutdown
        _django_error(OperationalError, _psycopg("57P02")),  # crash_shutdown
        _django_error(OperationalError, _psycopg("57P03")),  # cannot_connect_now
        _django_error(OperationalError, _psycopg("08006")),  # connection_failure
        _django_error(OperationalError, _Psycopg2Error("08003")),
        _django_error(
            OperationalError,
            _Psycopg2Error(None),
            "server closed the connection "
            "unexpectedly\n\tThis probably means the server terminated abnormally",
        ),
        _django_error(InterfaceError, _Psycopg2Error(None), "connection already closed"),
        _django_error(InterfaceError, None, "connection already closed"),
        _django_error(OperationalError, None, "SSL SYSCALL error: EOF detected"),
    ],
    ids=lambda error: (
        f"{type(error).__name__}: {getattr(error.__cause__, 'sqlstate', '')}"
        f"{getattr(error.__cause__, 'pgcode', '')} {str(error)[:30]}"
    ),
)
def test_connection_loss_is_database_unavailable(error: DatabaseError) -> None:
    answer = classify_database_error(error, retry_after=3)
    assert isinstance(answer, DatabaseUnavailable)
    assert answer.status == 503 and answer.retry_after == 3


def test_a_psycopg_error_without_sqlstate_is_a_connection_problem() -> None:
    import psycopg

    closed = psycopg.OperationalError("the connection is closed")
    assert isinstance(
        classify_database_error(_django_error(OperationalError, closed)), DatabaseUnavailable
    )


@pytest.mark.parametrize(
    "error",
    [
        _django_error(OperationalError, _psycopg("40001")),
        _django_error(OperationalError, _psycopg("40P01")),
        _django_error(OperationalError, _psycopg("55P03")),
        _django_error(OperationalError, None, "database is locked"),
    ],
    ids=["serialization", "deadlock", "lock-timeout", "sqlite-locked"],
)
def test_transient_conflicts_stay_transient(error: DatabaseError) -> None:
    assert isinstance(classify_database_error(error), TransientConflict)


@pytest.mark.parametrize(
    "error",
    [
        _django_error(ProgrammingError, _psycopg("42P01")),  # undefined_table
        _django_error(IntegrityError, _psycopg("23505")),  # unique_violation
        _django_error(OperationalError, _psycopg("57014")),  # query_canceled
        _django_error(OperationalError, None, "no such table: app_thing"),  # SQLite
        _django_error(InterfaceError, _psycopg_interface_error("the cursor is closed")),
        _django_error(DatabaseError, None, "something else"),
    ],
    ids=[
        "undefined-table",
        "unique-violation",
        "query-canceled",
        "sqlite-no-table",
        "closed-cursor",
        "other",
    ],
)
def test_other_database_errors_are_not_ours(error: DatabaseError) -> None:
    assert classify_database_error(error) is None
    assert classify_database_error(error, _Connection(usable=True)) is None  # type: ignore[arg-type]


def test_a_connection_that_no_longer_answers_is_asked_last() -> None:
    error = _django_error(DatabaseError, None, "something else")
    assert isinstance(
        classify_database_error(error, _Connection(usable=False)),  # type: ignore[arg-type]
        DatabaseUnavailable,
    )
    # In a transaction an earlier error may have aborted, SELECT 1 fails anyway: not asked.
    aborted = _Connection(usable=False, in_atomic_block=True)
    assert classify_database_error(error, aborted) is None  # type: ignore[arg-type]
