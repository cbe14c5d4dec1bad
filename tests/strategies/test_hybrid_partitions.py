"""The hybrid strategy on a key table partitioned by expiry (PostgreSQL): whole requests
through the decorator, the outbox drained into the partitions, a replay from the database
once Redis has lost the record, and a race of real threads whose side effects are
counted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.protocol.replay import REPLAYED_HEADER

from ..support.assertions import assert_problem
from ..support.partitions import SMALL, partitioned_table
from ..support.redis_servers import delete_prefix
from ..support.threads import run_at_once
from ..testapp.models import SideEffect

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(databases=["default"], transaction=True),
    pytest.mark.usefixtures("forget_queued_drains"),
]


@pytest.fixture(params=["after_loss", "always"])
def hybrid(
    request: pytest.FixtureRequest, redis_prefix: str, shared_redis_url: str
) -> Iterator[str]:
    """The hybrid strategy (each HYBRID_DB_CHECK) on the partitioned table; yields the
    Redis URL."""
    settings = {
        **SMALL,
        "STRATEGY": "hybrid",
        "REDIS_URL": shared_redis_url,
        "REDIS_KEY_PREFIX": redis_prefix,
        "HYBRID_DB_CHECK": request.param,
    }
    with partitioned_table(settings):
        yield shared_redis_url


def post(data: Any, key: str = "k1") -> Any:
    return Client(raise_request_exception=False).post(
        "/t/fn/", json.dumps(data), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def runs() -> int:
    return SideEffect.objects.filter(label="fn").count()


def test_completes_drains_into_a_partition_and_replays(hybrid: str, redis_prefix: str) -> None:
    first = post({"a": 1})
    assert first.status_code == 201
    assert post({"a": 1})[REPLAYED_HEADER] == "true"
    assert IdempotencyOutbox.objects.drain(using="default").drained == 1
    row = IdempotencyKey.objects.get(key="k1")  # one row, in the partition of its expiry
    assert row.status == IdempotencyKey.Status.COMPLETED
    delete_prefix(hybrid, redis_prefix)  # Redis loses the record (a flush)
    replay = post({"a": 1})
    assert replay.content == first.content and replay[REPLAYED_HEADER] == "true"
    assert_problem(post({"a": 2}), 422, "key-reused")
    assert runs() == 1


def test_racing_threads_run_the_view_once(hybrid: str) -> None:
    for round_ in range(5):

        def racer(i: int, n: int = round_) -> int:
            return int(post({"n": n}, f"race-{n}").status_code)

        answers = run_at_once(8, racer)
        assert answers.count(201) >= 1 and set(answers) <= {201, 409}, answers
    assert runs() == 5
    IdempotencyOutbox.objects.drain(using="default")
    assert IdempotencyKey.objects.filter(key__startswith="race-").count() == 5
