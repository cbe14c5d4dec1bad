"""A key whose record expired under one strategy, used again under another that shares the
key table (``db``, ``advisory_lock``, ``hybrid``; each switch in both directions), on the
plain table and on the one partitioned by expiry (PostgreSQL, real Redis).

The newer record is written by the second strategy; then everything that deletes expired
records runs: the outbox drain (its command), the purge (its command and its Celery task,
which on the partitioned table also drop the partitions that ended). None of them may take
the newer record with the expired one: a retry after Redis lost its copy is a replay, and
the view ran twice in all (once per record), not three times.

The old record is expired by moving its ``expires_at`` into the past (into a partition that
has already ended, on the partitioned table), never by waiting for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now
from django.test import Client, override_settings

from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.protocol.replay import REPLAYED_HEADER
from django_idempotency.store import partitions
from django_idempotency.tasks import purge_expired_keys

from ..support.partitions import SMALL, partitioned_table, past_partition
from ..support.redis_servers import delete_prefix
from ..testapp.models import SideEffect

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(databases=["default"], transaction=True),
    pytest.mark.usefixtures("forget_queued_drains"),
]

STRATEGIES = ("db", "advisory_lock", "hybrid")
#: Every ordered pair of strategies that share the key table: the first wrote the record
#: that expired, the second writes the newer one.
SWITCHES = [(old, new) for old in STRATEGIES for new in STRATEGIES if old != new]
#: The TTLs of the two records: the first short, the second long (as in a switch that
#: also gives the key a longer life).
OLD_TTL, NEW_TTL = 3, 30


class Table:
    """The key table of one run: its settings, and where an expired record is put."""

    def __init__(self, settings: dict[str, Any], expired_at: Any, ended: str = "") -> None:
        self.settings = settings
        self.expired_at = expired_at
        #: The partition that ended, where the expired record is put ("" on the plain table).
        self.ended = ended

    def strategy(self, name: str, ttl: float) -> Any:
        return override_settings(IDEMPOTENCY={**self.settings, "STRATEGY": name, "TTL": ttl})


@pytest.fixture(params=["plain", "partitioned"])
def table(
    request: pytest.FixtureRequest, redis_prefix: str, shared_redis_url: str
) -> Iterator[Table]:
    """The plain key table, or the partitioned one with a partition that ended already."""
    settings: dict[str, Any] = {
        "REDIS_URL": shared_redis_url,
        "REDIS_KEY_PREFIX": redis_prefix,
        "HYBRID_DB_CHECK": "always",
        "LOCK_TIMEOUT": 5,
    }
    if request.param == "plain":
        yield Table(settings, Now() - timedelta(seconds=60))
        return
    settings.update({name: SMALL[name] for name in ("PARTITION_INTERVAL", "PARTITION_AHEAD")})
    with partitioned_table({**SMALL, **settings}):
        lower, upper = past_partition()
        ended = partitions.partition_name(partitions.table(), lower)
        yield Table(settings, lower + (upper - lower) / 2, ended)


def post(key: str) -> Any:
    return Client(raise_request_exception=False).post(
        "/t/fn/", json.dumps({"a": 1}), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def runs() -> int:
    return SideEffect.objects.filter(label="fn").count()


def expire(key: str, at: datetime | Any) -> None:
    """The records of ``key`` (outbox and key table) expired at ``at``."""
    assert IdempotencyOutbox.objects.filter(key=key).update(expires_at=at) + (
        IdempotencyKey.objects.filter(key=key).update(expires_at=at)
    )


def expire_everything(table: Table) -> None:
    """Every deletion of expired records, as an operator runs them."""
    with table.strategy("hybrid", NEW_TTL):
        call_command("drain_idempotency_outbox", verbosity=0)
        call_command("purge_idempotency_keys", verbosity=0)
        purge_expired_keys()
        if "PARTITION_INTERVAL" in table.settings:
            partitions.maintain("default")


@pytest.mark.parametrize(("old", "new"), SWITCHES, ids=[f"{o}-to-{n}" for o, n in SWITCHES])
def test_expiry_never_deletes_the_newer_record_of_a_key(
    table: Table, old: str, new: str, redis_prefix: str, shared_redis_url: str
) -> None:
    with table.strategy(old, OLD_TTL):
        assert post("switched").status_code == 201
    expire("switched", table.expired_at)
    delete_prefix(shared_redis_url, redis_prefix)  # Redis's copy expired too
    with table.strategy(new, NEW_TTL):
        second = post("switched")
        assert second.status_code == 201 and REPLAYED_HEADER not in second
    assert runs() == 2

    expire_everything(table)

    if table.ended:  # the partition that ended was dropped, whatever it held
        assert table.ended not in {p.name for p in partitions.partitions(connection)}
    assert not IdempotencyOutbox.objects.exists()
    live = IdempotencyKey.objects.filter(key="switched", expires_at__gt=Now())
    assert live.count() == 1, list(IdempotencyKey.objects.values("key", "status", "expires_at"))
    assert live.get().status == IdempotencyKey.Status.COMPLETED
    delete_prefix(shared_redis_url, redis_prefix)  # Redis loses the newer record's copy
    with table.strategy(new, NEW_TTL):
        replay = post("switched")
    assert replay.status_code == 201 and replay[REPLAYED_HEADER] == "true"
    assert replay.content == second.content
    assert runs() == 2


#: Both directions between the two strategies that keep their records in Redis.
REDIS_SWITCHES = [("redis", "hybrid"), ("hybrid", "redis")]


@pytest.mark.parametrize(
    ("old", "new"), REDIS_SWITCHES, ids=[f"{o}-to-{n}" for o, n in REDIS_SWITCHES]
)
def test_a_switch_between_redis_and_hybrid_keeps_every_answer(
    old: str, new: str, redis_prefix: str, shared_redis_url: str
) -> None:
    """``STRATEGY`` switched between ``redis`` and ``hybrid`` (docs/operations.md advises
    the switch to ``hybrid`` when Redis cannot be trusted): a key completed before the
    switch is replayed after it, and another body with that key gets the ``422``; the view
    ran once."""
    settings = {
        "REDIS_URL": shared_redis_url,
        "REDIS_KEY_PREFIX": redis_prefix,
        "HYBRID_DB_CHECK": "always",
    }
    with override_settings(IDEMPOTENCY={**settings, "STRATEGY": old}):
        first = post("switch-" + old)
    assert first.status_code == 201 and REPLAYED_HEADER not in first
    with override_settings(IDEMPOTENCY={**settings, "STRATEGY": new}):
        replay = post("switch-" + old)
        reused = Client(raise_request_exception=False).post(
            "/t/fn/",
            json.dumps({"a": 2}),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="switch-" + old,
        )
    assert replay.status_code == 201 and replay[REPLAYED_HEADER] == "true"
    assert replay.content == first.content
    assert reused.status_code == 422, reused.content
    assert runs() == 1
