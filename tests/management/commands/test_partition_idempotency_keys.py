"""``manage.py partition_idempotency_keys`` on the real PostgreSQL server: the conversion of a
table with keys (their replays kept), a second run that creates ahead, ``--undo``; and
``purge_idempotency_keys`` with partitions, dropping the expired ones whole."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import override_settings

from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store import partitions
from django_idempotency.store.records import ClaimState

from ...support.partitions import AHEAD, INTERVAL, SMALL, partitioned_table, past_partition

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["default"], transaction=True)]

RESPONSE = StoredResponse(status=201, headers={}, body=b"ok")
PRINT = "a" * 64


def command(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def completed(key: str, ttl: float = 10) -> None:
    result = IdempotencyKey.objects.claim("user:1", key, PRINT, ttl=ttl, lock_timeout=5)
    assert result.pk is not None and result.token is not None
    assert IdempotencyKey.objects.complete(result.pk, result.token, RESPONSE, ttl=ttl)


def replayed(key: str) -> bool:
    result = IdempotencyKey.objects.claim("user:1", key, PRINT, ttl=10, lock_timeout=5)
    return result.state is ClaimState.COMPLETED and result.response == RESPONSE


@pytest.fixture
def postgres() -> None:
    if connections["default"].vendor != "postgresql":
        pytest.skip("time partitions are PostgreSQL's")


def test_converts_a_table_with_keys_then_creates_ahead_then_undoes(postgres: None) -> None:
    completed("before")
    with override_settings(IDEMPOTENCY=SMALL):
        output = command("partition_idempotency_keys", "--ahead", "20s")
        try:
            assert "Partitioned the idempotency key table of database 'default'" in output
            assert partitions.is_partitioned(connections["default"])
            assert replayed("before")
            again = command("partition_idempotency_keys", "--ahead", "20s")
            assert "is partitioned: " in again
            completed("after")
        finally:
            undone = command("partition_idempotency_keys", "--undo")
    assert "a plain table again" in undone
    assert "is not partitioned" in command("partition_idempotency_keys", "--undo")
    assert replayed("before") and replayed("after")


def test_needs_the_setting(postgres: None) -> None:
    with pytest.raises(CommandError, match="PARTITION_INTERVAL"):
        command("partition_idempotency_keys")
    assert not partitions.is_partitioned(connections["default"])


def _expired_in_an_ended_partition(key: str) -> None:
    """``key``'s record moved into a partition whose range has passed (attached in the
    past), as a wait of two partitions would leave it, without the wait."""
    lower, _upper = past_partition()
    IdempotencyKey.objects.filter(key=key).update(expires_at=lower)


#: ``PARTITION_AHEAD`` beyond the conversion's: the purge has partitions to create ahead
#: however little time has passed since.
FURTHER = {**SMALL, "PARTITION_AHEAD": AHEAD + 10 * INTERVAL}


def test_the_purge_drops_expired_partitions_and_creates_ahead(postgres: None) -> None:
    with partitioned_table():
        completed("short", ttl=INTERVAL)
        completed("long", ttl=10)
        _expired_in_an_ended_partition("short")
        with override_settings(IDEMPOTENCY=FURTHER):
            output = command("purge_idempotency_keys")
        assert "expired ones dropped" in output and "created ahead" in output
        assert not IdempotencyKey.objects.filter(key="short").exists()
        assert replayed("long")


def test_the_purge_task_drops_expired_partitions(postgres: None) -> None:
    from django_idempotency.tasks import purge_expired_keys

    with partitioned_table():
        completed("short", ttl=INTERVAL)
        _expired_in_an_ended_partition("short")
        before = {p.name for p in partitions.partitions(connections["default"])}
        with override_settings(IDEMPOTENCY=FURTHER):
            purge_expired_keys()
        after = {p.name for p in partitions.partitions(connections["default"])}
        assert before - after and after - before  # dropped, and created ahead
        assert not IdempotencyKey.objects.filter(key="short").exists()


def test_a_fresh_database_migrated_then_partitioned_by_the_command(postgres: None) -> None:
    """What a project does: ``migrate`` a new database, set ``PARTITION_INTERVAL``, run the
    command (a real ``manage.py`` process, the example project's): the table is
    partitioned, the project still starts (its checks pass), the migrations see no change
    to make, and the purge runs on it."""
    from ...support.databases import query_scalar
    from ...support.example import manage, scratch_database

    hourly = {"IDEMPOTENCY_PARTITION_INTERVAL": "3600"}
    with scratch_database("postgres", prefix="idem_partitions_") as url:
        output = manage(url, "partition_idempotency_keys", env=hourly)
        assert "Partitioned the idempotency key table of database 'default'" in output
        relkind = "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)"
        table = IdempotencyKey._meta.db_table
        assert query_scalar(url, relkind, (table,)) == "p"
        partitions_made = "SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(%s)"
        assert query_scalar(url, partitions_made, (table,)) >= 48  # a TTL and a day ahead
        manage(url, "check", env=hourly)
        manage(url, "makemigrations", "--check", "--dry-run", "django_idempotency", env=hourly)
        assert "Deleted 0 expired idempotency keys" in manage(
            url, "purge_idempotency_keys", env=hourly
        )
        assert "is partitioned" in manage(url, "partition_idempotency_keys", env=hourly)
