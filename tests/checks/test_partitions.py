"""The checks of PARTITION_INTERVAL (E070-E075): the setting's own, and the key table's on
the real PostgreSQL server (``check --deploy``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import CheckMessage, Error, Warning
from django.db import connections
from django.test import override_settings

from django_idempotency.checks.partitions import check_partitioned_table
from django_idempotency.checks.settings import check_settings
from django_idempotency.store import partitions

SMALL = {"PARTITION_INTERVAL": 2, "TTL": 10, "LOCK_TIMEOUT": 5}


def only(messages: list[CheckMessage], check_id: str) -> CheckMessage:
    found = [m for m in messages if m.id == f"django_idempotency.{check_id}"]
    assert len(found) == 1, [m.id for m in messages]
    assert found[0].hint and "Time partitions" in found[0].hint
    return found[0]


def run(idempotency: Any) -> list[CheckMessage]:
    with override_settings(IDEMPOTENCY=idempotency):
        return check_settings()


def test_a_whole_number_of_hours_on_postgresql_is_quiet() -> None:
    if connections["default"].vendor != "postgresql":
        pytest.skip("needs the PostgreSQL alias")
    assert run({"PARTITION_INTERVAL": 6 * 3600, "DATABASE": "default"}) == []
    assert run({"PARTITION_INTERVAL": None, "DATABASE": "sqlite"}) == []


def test_e070_partitions_need_postgresql() -> None:
    message = only(run({"PARTITION_INTERVAL": 3600, "DATABASE": "sqlite"}), "E070")
    assert isinstance(message, Error) and "sqlite" in message.msg


@pytest.mark.parametrize("value", [0, -3600, 1.5, "3600", True, float("nan")])
def test_e071_the_interval_is_a_whole_number_of_seconds(value: object) -> None:
    assert isinstance(only(run({"PARTITION_INTERVAL": value}), "E071"), Error)


@pytest.mark.parametrize("value", [0, -1, "soon", None])
def test_e076_partition_ahead_is_a_positive_number_of_seconds(value: object) -> None:
    assert isinstance(only(run({"PARTITION_AHEAD": value}), "E076"), Error)


def test_the_hybrid_strategy_may_use_time_partitions() -> None:
    if connections["default"].vendor != "postgresql":
        pytest.skip("needs the PostgreSQL alias")
    settings = {"PARTITION_INTERVAL": 3600, "STRATEGY": "hybrid", "REDIS_URL": "redis://x"}
    assert [m for m in run(settings) if str(m.id).startswith("django_idempotency.E07")] == []


def test_w073_many_partitions_ahead() -> None:
    if connections["default"].vendor != "postgresql":
        pytest.skip("needs the PostgreSQL alias")
    message = only(run({"PARTITION_INTERVAL": 60}), "W073")  # two days of minutes
    assert isinstance(message, Warning) and "2880" in message.msg


# -- the table, on the server --------------------------------------------------------------------


@pytest.fixture
def postgres() -> None:
    if connections["default"].vendor != "postgresql":
        pytest.skip("needs the PostgreSQL alias")


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default"], transaction=True)
def test_w074_the_setting_on_and_the_table_plain_yet(postgres: None) -> None:
    with override_settings(IDEMPOTENCY=SMALL):
        assert isinstance(only(check_partitioned_table(), "W074"), Warning)
        partitions.convert("default", ahead=10)
        try:
            assert check_partitioned_table() == []
        finally:
            partitions.undo("default")
    assert check_partitioned_table() == []


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default"], transaction=True)
def test_e075_the_table_partitioned_and_the_setting_off(postgres: None) -> None:
    with override_settings(IDEMPOTENCY=SMALL):
        partitions.convert("default", ahead=10)
    try:
        assert isinstance(only(check_partitioned_table(), "E075"), Error)
    finally:
        partitions.undo("default")


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default"], transaction=True)
def test_w075_an_unreachable_database_is_a_warning_not_a_crash(postgres: None) -> None:
    connection = connections["default"]
    connection.close()
    saved = dict(connection.settings_dict)
    connection.settings_dict["PORT"] = "1"  # nothing listens there
    try:
        assert isinstance(only(check_partitioned_table(), "W075"), Warning)
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default"], transaction=True)
def test_w077_a_hybrid_drain_batch_past_a_quarter_of_the_lock_table(postgres: None) -> None:
    """The server's lock table (max_locks_per_transaction * (max_connections +
    max_prepared_transactions)) read on check --deploy: 1,000 rows a batch, the default,
    fit; 100,000 would let two drain batches fill it."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_locks_per_transaction')::int * "
            "(current_setting('max_connections')::int + "
            "current_setting('max_prepared_transactions')::int)"
        )
        slots = cursor.fetchone()[0]
    hybrid = {**SMALL, "STRATEGY": "hybrid", "REDIS_URL": "redis://127.0.0.1:6379/15"}
    partitions_wanted = [m for m in check_partitioned_table() if str(m.id).endswith("W077")]
    assert partitions_wanted == []  # no partitions: no drain locks
    assert slots >= 4 * 1000
    with override_settings(IDEMPOTENCY=hybrid):
        assert [m for m in check_partitioned_table() if str(m.id).endswith("W077")] == []
    with override_settings(IDEMPOTENCY={**hybrid, "OUTBOX_BATCH_SIZE": 100_000}):
        message = only(check_partitioned_table(), "W077")
        assert isinstance(message, Warning) and f"{slots} slots" in message.msg
    with override_settings(IDEMPOTENCY={**SMALL, "OUTBOX_BATCH_SIZE": 100_000}):
        assert [m for m in check_partitioned_table() if str(m.id).endswith("W077")] == []
