"""Expiry and leases are judged on the database server's clock in UTC, whatever the time
zone of the database session.

A deployment may set the session's zone (``DATABASES[...]["OPTIONS"]["init_command"] =
"SET time_zone='+05:00'"`` on MariaDB, ``SET TIME ZONE`` on PostgreSQL). Django keeps
datetimes in UTC either way, so a comparison with the session's ``CURRENT_TIMESTAMP`` or
``NOW()`` on MariaDB is off by the zone's offset: five hours east, the purge would delete a
key completed seconds ago with an hour left, and one in progress under a live lease; five
hours west, it would delete nothing. Here the session of Django's own connection is put
five hours east and west, and the purge (command, task, manager, admin action), its dry
run and the outbox drain must keep the live keys and remove the expired ones.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from django_idempotency import tasks
from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.protocol.replay import StoredResponse

from ..support.mariadb import MARIADB, with_mariadb

pytestmark = pytest.mark.django_db(databases=with_mariadb("default"))

PRINT = "a" * 64
RESPONSE = StoredResponse(status=201, headers={"Content-Type": "application/json"}, body=b"{}")
ZONES = [pytest.param("+05:00", id="east-5h"), pytest.param("-05:00", id="west-5h")]
POSTGRES = pytest.param("default", marks=pytest.mark.postgres, id="postgresql")


def set_zone(alias: str, zone: str) -> None:
    """The time zone of the session of Django's connection to ``alias``."""
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "mysql":
            cursor.execute("SET time_zone = %s", [zone])
        else:  # an interval: '+05:00' is five hours east (a bare '+05:00' is POSIX's west)
            cursor.execute(f"SET TIME ZONE INTERVAL '{zone}' HOUR TO MINUTE")


def zone_of(alias: str) -> str:
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "mysql":
            cursor.execute("SELECT @@session.time_zone")
        else:
            cursor.execute("SHOW TIME ZONE")
        return str(cursor.fetchone()[0])


@pytest.fixture(params=[POSTGRES, MARIADB])
def alias(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=ZONES)
def zone(request: pytest.FixtureRequest, alias: str) -> Iterator[str]:
    """The session of ``alias`` five hours east or west of UTC for the test."""
    connection = connections[alias]
    connection.ensure_connection()
    before = zone_of(alias)
    set_zone(alias, str(request.param))
    yield str(request.param)
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SET time_zone = %s", [before])
        else:
            cursor.execute("SET TIME ZONE %s", [before])


def db_now(alias: str) -> datetime:
    """The database server's clock, as the statements read it (UTC, aware)."""
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "mysql":
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            return timezone.make_aware(cursor.fetchone()[0], UTC)
        cursor.execute("SELECT statement_timestamp()")
        value: datetime = cursor.fetchone()[0]
        return value.astimezone(UTC)


def shift(alias: str, pk: int | None, **seconds: float) -> None:
    """Set each named column of key ``pk`` to the database's now plus that many seconds."""
    connection = connections[alias]
    at = (
        "UTC_TIMESTAMP(6) + INTERVAL %s SECOND"
        if connection.vendor == "mysql"
        else "statement_timestamp() + make_interval(secs => %s)"
    )
    q = connection.ops.quote_name
    columns = ", ".join(f"{q(name)} = {at}" for name in seconds)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {q(IdempotencyKey._meta.db_table)} SET {columns} WHERE {q('id')} = %s",
            [*seconds.values(), pk],
        )


def claimed(alias: str, key: str) -> Any:
    result = IdempotencyKey.objects.claim(
        "user:1", key, PRINT, ttl=3600, lock_timeout=30, using=alias
    )
    assert result.pk is not None and result.token is not None
    return result


def completed(alias: str, key: str) -> int:
    owner = claimed(alias, key)
    assert IdempotencyKey.objects.complete(owner.pk, owner.token, RESPONSE, ttl=3600, using=alias)
    return int(owner.pk)


def four_keys(alias: str) -> dict[str, int]:
    """Two live keys and two expired ones, stamped by the database's clock: ``live``
    completed just now with an hour left, ``running`` in progress under a lease renewed
    just now, ``done`` completed and expired a minute ago, ``abandoned`` in progress, past
    its expiry and its lease not renewed for ten minutes."""
    keys = {"live": completed(alias, "live"), "running": int(claimed(alias, "running").pk)}
    keys["done"] = completed(alias, "done")
    shift(alias, keys["done"], expires_at=-60)
    keys["abandoned"] = int(claimed(alias, "abandoned").pk)
    shift(alias, keys["abandoned"], expires_at=-60, locked_at=-600)
    return keys


def left(alias: str) -> set[str]:
    return set(IdempotencyKey.objects.using(alias).values_list("key", flat=True))


LIVE = {"live", "running"}


# -- the purge --------------------------------------------------------------------------------


def test_the_purge_command_keeps_live_keys(alias: str, zone: str) -> None:
    four_keys(alias)
    out = io.StringIO()
    call_command("purge_idempotency_keys", "--database", alias, "--dry-run", stdout=out)
    assert "Would delete 2 expired idempotency keys" in out.getvalue()
    call_command("purge_idempotency_keys", "--database", alias, stdout=out)
    assert left(alias) == LIVE


def test_the_purge_task_keeps_live_keys(alias: str, zone: str) -> None:
    four_keys(alias)
    assert tasks.purge_expired_keys(using=alias) == 2
    assert left(alias) == LIVE


def test_the_managers_purge_keeps_live_keys(alias: str, zone: str) -> None:
    four_keys(alias)
    keys = IdempotencyKey.objects
    assert keys.expired(using=alias).count() == 2
    assert keys.using(alias).expired().count() == 2
    assert keys.delete_expired(using=alias, batch_size=1) == 2
    assert left(alias) == LIVE


def test_the_purge_older_than_counts_from_the_servers_utc_clock(alias: str, zone: str) -> None:
    keys = four_keys(alias)
    shift(alias, keys["done"], expires_at=-7200)
    manager = IdempotencyKey.objects
    assert manager.delete_expired(using=alias, older_than=timedelta(hours=1)) == 1
    assert left(alias) == {*LIVE, "abandoned"}


def test_the_admins_purge_action_keeps_live_keys(alias: str, zone: str) -> None:
    keys = four_keys(alias)
    assert IdempotencyKey.objects.delete_expired_pks(list(keys.values()), using=alias) == 2
    assert left(alias) == LIVE


# -- the outbox drain -------------------------------------------------------------------------


def test_the_drain_moves_a_live_row_and_drops_an_expired_one(alias: str, zone: str) -> None:
    now = db_now(alias)
    for key, seconds in (("live", 3600), ("expired", -60)):
        IdempotencyOutbox.objects.using(alias).create(
            scope="user:1",
            key=key,
            fingerprint=PRINT,
            response_status=201,
            response_body=b"{}",
            created_at=now - timedelta(seconds=120),
            expires_at=now + timedelta(seconds=seconds),
        )
    out = io.StringIO()
    call_command("drain_idempotency_outbox", "--database", alias, stdout=out)
    assert not IdempotencyOutbox.objects.using(alias).exists()
    assert left(alias) == {"live"}
