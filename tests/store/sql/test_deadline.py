"""DATABASE_TIMEOUT (django_idempotency.store.sql.deadline) on the real PostgreSQL."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from django.db import OperationalError, connections

from django_idempotency.store.errors import is_connection_lost
from django_idempotency.store.sql.deadline import bounded, watchdog

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_statement_that_outlives_the_bound_is_cut(settings: Any) -> None:
    """The server runs a statement longer than the bound: the connection is cut, the
    driver reports it lost (an unknown outcome to the callers), long before the statement
    would end."""
    settings.IDEMPOTENCY = {"DATABASE_TIMEOUT": 0.5}
    connection = connections["default"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    cut = watchdog.cut
    started = time.monotonic()
    try:
        with (
            pytest.raises(OperationalError) as raised,
            bounded(connection),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT pg_sleep(120)")
        assert time.monotonic() - started < 60
        assert is_connection_lost(raised.value)
        assert watchdog.cut == cut + 1
    finally:
        connection.close()
        with connection.cursor() as cursor:  # the server's backend still sleeps: end it
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_statement_answered_in_time_is_left_alone(settings: Any) -> None:
    settings.IDEMPOTENCY = {"DATABASE_TIMEOUT": 0.5}
    connection = connections["default"]
    cut = watchdog.cut
    for _ in range(3):
        with bounded(connection), connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
    time.sleep(1.0)  # past every deadline armed above: none of them fires any more
    with connection.cursor() as cursor:
        cursor.execute("SELECT 2")
        assert cursor.fetchone() == (2,)
    assert watchdog.cut == cut


def test_none_is_no_bound(settings: Any) -> None:
    settings.IDEMPOTENCY = {"DATABASE_TIMEOUT": None}
    connection = connections["default"]
    cut = watchdog.cut
    with bounded(connection), connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(1.0)")
    assert watchdog.cut == cut


def test_a_sooner_deadline_is_kept_while_a_later_one_is_armed(settings: Any) -> None:
    """A long bound armed first (advisory_lock's wait for its lock) does not put off a
    shorter one armed after it."""
    settings.IDEMPOTENCY = {"DATABASE_TIMEOUT": 0.5}
    connection = connections["default"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    idle = os.open(os.devnull, os.O_RDONLY)  # stands for a socket that waits an hour
    long = watchdog.arm(idle, 3600)
    try:
        started = time.monotonic()
        with (
            pytest.raises(OperationalError),
            bounded(connection),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT pg_sleep(120)")
        assert time.monotonic() - started < 60
    finally:
        watchdog.disarm(long)
        os.close(idle)
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
