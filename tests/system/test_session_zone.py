"""Expiry and leases are judged on the database server's clock in UTC, whatever the time
zone of the database session.

A deployment may set the session's zone (``DATABASES[...]["OPTIONS"]["init_command"] =
"SET time_zone='+05:00'"`` on MariaDB, ``SET TIME ZONE`` on PostgreSQL). Django keeps
datetimes in UTC either way, so a comparison with the session's ``CURRENT_TIMESTAMP`` or
``NOW()`` on MariaDB is off by the zone's offset: five hours east, the purge would delete a
key completed seconds ago with an hour left, and one in progress under a live lease; five
hours west, it would delete nothing. Here the session of Django's own connection is put
five hours east and west: the strategies must replay a live key, run an expired one again
and respect a live lease, and the purge (command, task, manager, the admin's filter and
action, partition maintenance), its dry run and the outbox drain must keep the live keys and
remove the expired ones.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.core.management import call_command
from django.db import connections
from django.urls import reverse
from django.utils import timezone

from django_idempotency import tasks
from django_idempotency.completer import due_keys
from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.protocol.lifecycle import Lifecycle
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store import partitions
from django_idempotency.strategies import load_strategy
from django_idempotency.strategies.base import Attempt, Claim, InProgress, Replay
from django_idempotency.strategies.stepped import StepClaim, SteppedDatabaseStrategy

from ..support.mariadb import MARIADB, with_mariadb
from ..support.partitions import AHEAD, partitioned_table, past_partition

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


def claimed(alias: str, key: str, ttl: float = 3600) -> Any:
    result = IdempotencyKey.objects.claim(
        "user:1", key, PRINT, ttl=ttl, lock_timeout=5, using=alias
    )
    assert result.pk is not None and result.token is not None
    return result


def completed(alias: str, key: str, ttl: float = 3600) -> int:
    owner = claimed(alias, key, ttl)
    assert IdempotencyKey.objects.complete(owner.pk, owner.token, RESPONSE, ttl=ttl, using=alias)
    return int(owner.pk)


def four_keys(alias: str, ttl: float = 3600) -> dict[str, int]:
    """Two live keys and two expired ones, stamped by the database's clock: ``live``
    completed just now with ``ttl`` left (an hour), ``running`` in progress under a lease
    renewed just now, ``done`` completed and expired 30 s ago, ``abandoned`` in progress,
    past its expiry and its lease not renewed for ten minutes."""
    keys = {
        "live": completed(alias, "live", ttl),
        "running": int(claimed(alias, "running", ttl).pk),
    }
    keys["done"] = completed(alias, "done", ttl)
    shift(alias, keys["done"], expires_at=-30)
    keys["abandoned"] = int(claimed(alias, "abandoned", ttl).pk)
    shift(alias, keys["abandoned"], expires_at=-30, locked_at=-600)
    return keys


def left(alias: str) -> set[str]:
    return set(IdempotencyKey.objects.using(alias).values_list("key", flat=True))


LIVE = {"live", "running"}


# -- the strategies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "strategy"),
    [
        pytest.param("default", "db", marks=pytest.mark.postgres, id="postgresql-db"),
        pytest.param("mariadb", "db", marks=pytest.mark.mariadb, id="mariadb-db"),
        pytest.param(
            "default", "advisory_lock", marks=pytest.mark.postgres, id="postgresql-advisory_lock"
        ),
    ],
)
def test_a_strategy_replays_a_live_key_and_runs_an_expired_one_again(
    alias: str, strategy: str, zone: str
) -> None:
    """A completed key with an hour left is replayed, and once expired (a second ago, by
    the database's clock) it runs again, whatever the session's zone."""
    attempt = Attempt("user:1", "k1", PRINT, ttl=3600, lock_timeout=30, database=alias)
    with Lifecycle(load_strategy(strategy), attempt) as first:
        assert isinstance(first.outcome, Claim)
        first.complete(RESPONSE)
    with Lifecycle(load_strategy(strategy), attempt) as retry:
        assert isinstance(retry.outcome, Replay)
    pk = IdempotencyKey.objects.using(alias).get(key="k1").pk
    shift(alias, pk, expires_at=-1)
    with Lifecycle(load_strategy(strategy), attempt) as again:
        assert isinstance(again.outcome, Claim)
        again.release()


@pytest.mark.parametrize("alias", [POSTGRES, MARIADB])
def test_the_db_strategys_lease_is_judged_on_the_servers_utc_clock(alias: str, zone: str) -> None:
    """A claim whose lease was renewed a second ago is in progress; one not renewed for
    ten minutes is taken over."""
    running = claimed(alias, "k1")
    shift(alias, running.pk, locked_at=-1)
    attempt = Attempt("user:1", "k1", PRINT, ttl=3600, lock_timeout=30, database=alias)
    with Lifecycle(load_strategy("db"), attempt) as duplicate:
        assert isinstance(duplicate.outcome, InProgress)
    shift(alias, running.pk, locked_at=-600)
    with Lifecycle(load_strategy("db"), attempt) as takeover:
        assert isinstance(takeover.outcome, Claim)
        takeover.release()


# -- steps and the completer ------------------------------------------------------------------


@pytest.mark.parametrize("alias", [POSTGRES, MARIADB])
def test_a_step_renews_the_lease_on_the_servers_utc_clock(alias: str, zone: str) -> None:
    """A step's record renews the claim's lease at the database's now in UTC: five hours
    west, a lease stamped in the session's time would look lapsed the moment a step
    committed, and a duplicate would take the key over from its running owner (its next
    remote step run twice); five hours east, a dead owner's key would wait five hours."""
    attempt = Attempt("user:1", "k1", PRINT, ttl=3600, lock_timeout=30, database=alias)
    owner = SteppedDatabaseStrategy().claim(attempt)
    assert isinstance(owner, StepClaim)
    shift(alias, owner.pk, locked_at=-20)
    before = db_now(alias)
    owner.record([{"name": "charge", "kind": "remote", "result": 1}], "charge")
    after = db_now(alias)
    renewed = IdempotencyKey.objects.using(alias).get(pk=owner.pk).locked_at
    assert renewed is not None and before - timedelta(seconds=1) <= renewed <= after
    assert isinstance(SteppedDatabaseStrategy().claim(attempt), InProgress)


@pytest.mark.parametrize("alias", [POSTGRES, MARIADB])
def test_the_completer_finds_due_keys_on_the_servers_utc_clock(
    alias: str, zone: str, settings: Any
) -> None:
    """A kept request whose lease (5 s) and ``COMPLETER_AFTER`` (60 s) have passed by the
    database's clock is due; one renewed a second ago is not."""
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "COMPLETER_AFTER": 60}
    kept = {"request": {"lock_timeout": 5}}
    for key, renewed in (("running", -1), ("abandoned", -600)):
        pk = claimed(alias, key).pk
        IdempotencyKey.objects.using(alias).filter(pk=pk).update(steps=kept)
        shift(alias, pk, locked_at=renewed)
    due = due_keys(alias, 10)
    assert [d.key for d in due] == ["abandoned"]
    assert abs(due[0].now - db_now(alias)) < timedelta(minutes=1)


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


def test_the_admin_lists_and_purges_on_the_servers_utc_clock(
    alias: str, zone: str, admin_client: Any, settings: Any
) -> None:
    """The admin's expired filter and its purge action, through the admin itself, on the
    key database whose session is five hours off UTC."""
    settings.IDEMPOTENCY = {"KEY_DATABASES": list(dict.fromkeys(["default", alias]))}
    keys = four_keys(alias)
    changelist = reverse("admin:django_idempotency_idempotencykey_changelist")
    there = {"database": alias} if alias != "default" else {}

    def listed(**params: str) -> set[str]:
        response = admin_client.get(changelist, {**there, **params})
        assert response.status_code == 200
        return {obj.key for obj in response.context["cl"].result_list}

    assert listed(expired="no") == LIVE
    assert listed(expired="yes") == {"done", "abandoned"}
    page = admin_client.post(
        changelist + ("?" + urlencode(there) if there else ""),
        {"action": "purge_expired_keys", "_selected_action": [str(pk) for pk in keys.values()]},
        follow=True,
    )
    assert "Purged 2 expired keys. 2 keys have not expired and were kept." in page.content.decode()
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


# -- partition maintenance (PostgreSQL) ---------------------------------------------------------


@pytest.mark.django_db(databases=["default"], transaction=True)
@pytest.mark.parametrize("alias", [POSTGRES])
def test_partition_maintenance_drops_only_what_ended(alias: str, zone: str) -> None:
    """With the key table partitioned by expiry, the purge drops the partitions that ended
    on the database's clock and creates those ahead from it: the live keys stay, the
    expired ones go, whatever the session's zone (partition bounds are instants)."""
    with partitioned_table(using=alias):
        lower, _upper = past_partition(alias)
        keys = four_keys(alias, ttl=10)
        shift(alias, keys["done"], expires_at=-(db_now(alias) - lower).total_seconds() + 1)
        ended = partitions.partition_name(partitions.table(), lower)
        call_command("purge_idempotency_keys", "--database", alias, stdout=io.StringIO())
        assert left(alias) == LIVE
        found = partitions.partitions(connections[alias])
        assert ended not in {p.name for p in found}
        assert min(p.lower for p in found) <= db_now(alias)
        assert max(p.upper for p in found) >= db_now(alias) + timedelta(seconds=10 + AHEAD - 2)
        for partition in found:  # named by its lower bound in UTC, whatever the session's zone
            assert partition.name == partitions.partition_name(partitions.table(), partition.lower)


@pytest.mark.parametrize("alias", [POSTGRES])
def test_the_hybrid_outbox_row_lives_its_ttl_from_the_servers_clock(alias: str, zone: str) -> None:
    """The outbox row of ``hybrid`` (PostgreSQL) is found live with its whole TTL left by
    the database's clock, which a Redis refill is given."""
    outbox = IdempotencyOutbox.objects
    assert outbox.add("user:1", "k1", PRINT, RESPONSE, ttl=3600, using=alias)
    found = outbox.lookup("user:1", "k1", using=alias)
    assert found is not None and found.completed and found.read_at is not None
    assert 3590 < found.ttl_seconds() <= 3600
