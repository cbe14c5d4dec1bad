"""The Celery tasks, run by real ``celery -A example_project.celery worker`` processes.

The workers use the shared Redis (DB 15) as their broker, on a queue of the test's
own, and this run's test database (``TEST_DATABASE_NAME``); no result backend.
What they did is read back from the database and from their logs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.db.models import Value

from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.store.status import COMPLETED
from django_idempotency.strategies import load_strategy
from django_idempotency.tasks import (
    DRAIN_TASK,
    PURGE_TASK,
    beat_schedule,
    drain_outbox,
    purge_expired_keys,
)

from .support.api import api_client
from .support.factories import (
    CompletedKeyFactory,
    ExpiredKeyFactory,
    IdempotencyOutboxFactory,
    UserFactory,
)
from .support.redis_servers import RedisServer
from .support.workers import Worker, delete_queue, worker_env, worker_pool

pytestmark = [
    pytest.mark.celery,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("forget_queued_drains"),
]


@pytest.fixture
def queue() -> Iterator[str]:
    """A broker queue of this test's own on the shared Redis (DB 15), deleted afterwards."""
    name = f"idem-tests-{uuid.uuid4().hex[:12]}"
    yield name
    delete_queue(name)


@pytest.fixture
def workers(transactional_db: None) -> Iterator[Callable[..., Worker]]:
    """``workers(name, queue)`` starts a worker on this run's test database."""
    env = worker_env(str(connection.settings_dict["NAME"]), str(django_settings.CELERY_BROKER_URL))
    with worker_pool(env) as start:
        yield start


def _fill_outbox(count: int, body_size: int = 200) -> list[str]:
    keys = [f"k-{i:06d}-{uuid.uuid4().hex[:8]}" for i in range(count)]
    IdempotencyOutbox.objects.bulk_create(
        [
            IdempotencyOutboxFactory.build(
                key=key, response_body=json.dumps({"key": key, "pad": "x" * body_size}).encode()
            )
            for key in keys
        ],
        batch_size=2000,
    )
    return keys


def _wait(condition: Callable[[], bool], timeout: float, what: str, *logs: Worker) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(w.log() for w in logs))


def _places() -> tuple[set[str], set[str]]:
    """The keys still in the outbox and the keys drained, read in one statement (one
    snapshot: a transaction in flight commits before or after both reads, never between),
    once no transaction is in flight on the outbox: a worker killed after sending its
    COMMIT has that COMMIT reach PostgreSQL after the kill, and it may land after a read
    made at once (the batch then looks left, yet was drained by the dead worker). Locking
    every outbox row waits for that transaction's end, committed or rolled back."""
    with transaction.atomic():
        list(IdempotencyOutbox.objects.select_for_update().values_list("pk", flat=True))
    rows = (
        IdempotencyOutbox.objects.annotate(place=Value("left"))
        .values_list("place", "key")
        .union(
            IdempotencyKey.objects.annotate(place=Value("done")).values_list("place", "key"),
            all=True,
        )
    )
    places: dict[str, set[str]] = {"left": set(), "done": set()}
    for place, key in rows:
        places[place].add(key)
    return places["left"], places["done"]


def _check_drained(keys: list[str], *others: str) -> None:
    """Every key is a completed IdempotencyKey with its own response; the outbox is empty."""
    assert IdempotencyOutbox.objects.count() == 0
    assert IdempotencyKey.objects.count() == len(keys) + len(others)
    rows = dict(IdempotencyKey.objects.values_list("key", "response_body"))
    assert set(rows) == {*keys, *others}
    for key in keys[:: max(len(keys) // 50, 1)]:
        body = rows[key]
        assert body is not None and json.loads(bytes(body))["key"] == key
    assert not IdempotencyKey.objects.exclude(status=COMPLETED).exists()


# -- the tasks ---------------------------------------------------------------------------------


def test_beat_schedule_names_both_tasks() -> None:
    schedule = beat_schedule(drain_every=5, purge_every=60, purge_older_than=30)
    tasks = {entry["task"]: entry for entry in schedule.values()}
    assert set(tasks) == {DRAIN_TASK, PURGE_TASK}
    assert tasks[DRAIN_TASK]["schedule"] == 5.0
    assert tasks[PURGE_TASK]["kwargs"] == {"older_than": 30.0}
    assert drain_outbox.name == DRAIN_TASK and purge_expired_keys.name == PURGE_TASK
    assert django_settings.CELERY_TASK_IGNORE_RESULT is True
    from example_project import settings as example

    assert set(example.CELERY_BEAT_SCHEDULE) == set(beat_schedule())


def test_worker_drains_and_purges(workers: Callable[..., Worker], queue: str) -> None:
    keys = _fill_outbox(2500)
    expired = ExpiredKeyFactory.create_batch(3)
    live = CompletedKeyFactory()
    worker = workers("one", queue)
    drain_outbox.apply_async(kwargs={"batch_size": 1000}, queue=queue)
    _wait(lambda: IdempotencyOutbox.objects.count() == 0, 30, "the drain", worker)
    _wait(lambda: worker.drained() == 2500, 10, "the drain's log line", worker)
    assert "drained 2500 outbox rows (0 expired) in 3 transactions" in worker.log()

    purge_expired_keys.apply_async(queue=queue)
    _wait(
        lambda: not IdempotencyKey.objects.filter(pk__in=[e.pk for e in expired]).exists(),
        30,
        "the purge",
        worker,
    )
    assert IdempotencyKey.objects.filter(pk=live.pk).exists()
    _check_drained(keys, live.key)


def test_hybrid_commits_queue_a_drain_that_a_worker_runs(
    workers: Callable[..., Worker],
    redis_settings: Any,
    running_private_redis: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No task is sent by hand: the hybrid strategy queues the drain after its commits.
    The short batch waits ``drain_hold`` seconds for a follow-up run (2 here, not 10)."""
    redis_settings(running_private_redis.url, STRATEGY="hybrid")
    monkeypatch.setattr(load_strategy("hybrid"), "drain_hold", 2.0)
    default_queue = str(django_settings.CELERY_TASK_DEFAULT_QUEUE)
    worker = workers("hybrid", default_queue)
    client = api_client(UserFactory())
    keys = [uuid.uuid4().hex for _ in range(5)]
    for key in keys:
        response = client.post("/t/drf/", {"n": key}, format="json", HTTP_IDEMPOTENCY_KEY=key)
        assert response.status_code == 201
    assert IdempotencyKey.objects.count() == 0  # nothing but the outbox on the request path
    _wait(lambda: IdempotencyKey.objects.count() == 5, 30, "the queued drain", worker)
    assert IdempotencyOutbox.objects.count() == 0
    assert set(IdempotencyKey.objects.values_list("key", flat=True)) == set(keys)


def test_two_workers_draining_at_once_lose_and_duplicate_nothing(
    workers: Callable[..., Worker], queue: str
) -> None:
    keys = _fill_outbox(6000)
    first = workers("first", queue)
    second = workers("second", queue)
    for _ in range(4):
        drain_outbox.apply_async(kwargs={"batch_size": 100}, queue=queue)
    _wait(lambda: IdempotencyOutbox.objects.count() == 0, 60, "the drain", first, second)
    _wait(lambda: first.drained() + second.drained() >= 6000, 10, "the logs", first, second)
    # Each row was drained by exactly one worker: SKIP LOCKED gave them disjoint batches.
    assert first.drained() + second.drained() == 6000, (first.drained(), second.drained())
    assert first.drained() > 0 and second.drained() > 0, "both workers drained"
    _check_drained(keys)


def test_worker_killed_mid_drain_loses_nothing(workers: Callable[..., Worker], queue: str) -> None:
    total = 20000
    keys = _fill_outbox(total, body_size=1000)
    worker = workers("doomed", queue)
    drain_outbox.apply_async(kwargs={"batch_size": 250}, queue=queue)
    _wait(
        lambda: IdempotencyOutbox.objects.count() <= total - 500,
        120,
        "the first batches",
        worker,
    )
    worker.kill()
    left, done = _places()
    assert left, "the worker was killed before it finished"
    # The batch in flight rolled back with the connection, or committed (its COMMIT sent
    # before the kill): every key is in exactly one place.
    assert not left & done
    assert left | done == set(keys)

    again = workers("restarted", queue)
    # The beat entry would send this; send it until the rows the dead connection held
    # are free again (PostgreSQL ends that backend as soon as it sees the socket close).
    # Each round waits for its drain to finish, however long the machine takes.
    for _round in range(10):
        finished = again.log().count(" succeeded in ")
        drain_outbox.apply_async(kwargs={"batch_size": 1000}, queue=queue)
        _wait(
            lambda: again.log().count(" succeeded in ") > finished,  # noqa: B023
            300,
            "the drain after the restart",
            again,
        )
        if not IdempotencyOutbox.objects.exists():
            break
    assert not IdempotencyOutbox.objects.exists(), again.log()
    assert again.drained() == len(left)
    _check_drained(keys)
