"""Idempotent Celery tasks, run by real ``celery worker`` processes.

The workers (``tests/support/task_workers.py``) use a private Redis as their broker and
result backend and this run's test database. Each task body
writes one SideEffect row in its transaction and counts its runs in that Redis, outside
any transaction; the tests count both from outside.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import kombu.transport.redis  # noqa: F401  (see below)
import pytest
import redis
from celery import Celery
from django.core.exceptions import ImproperlyConfigured

from django_idempotency.idempotent_tasks import (
    IdempotentTask,
    TaskKeyReused,
    arguments_fingerprint,
    idempotent_task,
)
from django_idempotency.models import IdempotencyKey
from django_idempotency.store.status import COMPLETED
from tests.testapp.models import SideEffect
from tests.testapp.tasks import block_once, block_once_locked, charge, retry_once

from .support.redis_servers import RedisServer
from .support.services import answers, in_ci
from .support.task_workers import PATIENCE, wait_for
from .support.workers import Worker

pytestmark = [pytest.mark.celery, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# The publishing threads below make Celery apps of their own; the first connection of one
# imports kombu's Redis transport. It is imported here, in one thread: three threads
# importing it at once for the first time, one of them failed inside CPython 3.11's importlib
# (KeyError: 'kombu.transport.redis' in _load_unlocked) and its three tasks were never sent.

RABBITMQ_URL = os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _runs(broker: RedisServer, label: str) -> int:
    client = redis.Redis.from_url(broker.url)
    try:
        return int(client.get(f"{label}:runs") or 0)
    finally:
        client.close()


def _completed(scope: str, key: str) -> bool:
    return IdempotencyKey.objects.filter(scope=scope, key=key, status=COMPLETED).exists()


def test_the_decorator_makes_an_idempotent_task() -> None:
    assert isinstance(charge, IdempotentTask)
    assert charge.acks_late and charge.reject_on_worker_lost
    assert charge.idempotency_key is not None
    assert charge.idempotency_key("o-1", "redis://x") == "order-o-1"
    assert retry_once.name == "tests.retry_once" and retry_once.idempotency_key is None
    assert block_once.idempotency_key is None and block_once.idempotency_lock_timeout == 2
    assert block_once.idempotency_strategy == "db"
    assert block_once_locked.idempotency_strategy == "advisory_lock"
    with pytest.raises(ImproperlyConfigured, match="is not one of"):
        idempotent_task(strategy="redis")


def test_a_call_applied_twice_runs_once_and_replays(broker: RedisServer) -> None:
    """In the caller's process (``apply()``): each call has its own task id, one key."""
    order = uuid.uuid4().hex[:12]
    first = charge.apply(args=[order, broker.url]).get()
    again = charge.apply(args=[order, broker.url]).get()
    assert again == first
    assert SideEffect.objects.filter(label=f"charge-{order}").count() == 1
    assert _runs(broker, order) == 1
    # The same key with other arguments: the body does not run.
    reused = charge.apply(args=[order, broker.url + "?other"])
    assert reused.failed() and isinstance(reused.result, TaskKeyReused)
    assert _runs(broker, order) == 1


def test_a_duplicate_of_a_running_task_waits_for_its_result(
    workers: Callable[..., Worker], producer: Celery, broker: RedisServer
) -> None:
    label = f"hold-{uuid.uuid4().hex[:12]}"
    first, second = workers("first"), workers("second")
    running = producer.send_task("tests.hold", args=[label, broker.url])
    wait_for(lambda: _runs(broker, label) == 1, "the first run", first, second)
    duplicate = producer.send_task("tests.hold", args=[label, broker.url])
    # The other worker finds the key in progress and retries instead of running.
    wait_for(
        lambda: f"{duplicate.id}] retry:" in first.log() + second.log(),
        "the duplicate's retry",
        first,
        second,
    )
    assert _runs(broker, label) == 1
    client = redis.Redis.from_url(broker.url)
    try:
        client.rpush(f"{label}:go", 1)
    finally:
        client.close()
    result = running.get(timeout=PATIENCE)
    assert duplicate.get(timeout=PATIENCE) == result
    assert _runs(broker, label) == 1
    assert SideEffect.objects.filter(label=label).count() == 1


def test_waiting_for_the_key_is_not_a_retry_of_the_body(
    workers: Callable[..., Worker], producer: Celery, broker: RedisServer
) -> None:
    """Held by another owner (here, this test's claim), the key makes the task wait
    several times; it then runs with no retry counted (its ``max_retries`` is 0)."""
    label = f"count-{uuid.uuid4().hex[:12]}"
    scope = "task:tests.count_retries"
    fingerprint = arguments_fingerprint((label, broker.url), {})
    held = IdempotencyKey.objects.claim(scope, label, fingerprint, ttl=3600, lock_timeout=3600)
    assert held.pk is not None and held.token is not None
    worker = workers("waiting")
    sent = producer.send_task("tests.count_retries", args=[label, broker.url])
    wait_for(lambda: worker.log().count(f"{sent.id}] retry:") >= 3, "three waits", worker)
    assert _runs(broker, label) == 0
    assert IdempotencyKey.objects.release(held.pk, held.token)
    assert sent.get(timeout=PATIENCE) == 0, worker.log()
    assert _runs(broker, label) == 1
    assert SideEffect.objects.filter(label=label).count() == 1


@pytest.mark.parametrize("task", ["tests.charge", "tests.charge_locked"])
def test_duplicate_publishes_take_effect_once(
    workers: Callable[..., Worker], producer: Celery, broker: RedisServer, queue: str, task: str
) -> None:
    order = uuid.uuid4().hex[:12]
    first, second = workers("first"), workers("second")
    sent: list[str] = []
    lock = threading.Lock()

    def publish() -> None:
        # A producer of its own (no result backend: the test reads the results back).
        app = Celery("publisher", broker=broker.url, set_as_current=False)
        try:
            for _ in range(3):
                result = app.send_task(task, args=[order, broker.url], queue=queue)
                with lock:
                    sent.append(result.id)
        finally:
            app.close()

    threads = [threading.Thread(target=publish) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results = [producer.AsyncResult(id).get(timeout=PATIENCE) for id in sent]
    assert len(results) == 9
    # Every duplicate answered with the one stored result: the body ran once.
    assert all(result == results[0] for result in results), (results, first.log(), second.log())
    assert SideEffect.objects.filter(label=f"charge-{order}").count() == 1
    assert results[0]["effect"] == SideEffect.objects.get(label=f"charge-{order}").pk
    assert _runs(broker, order) == 1
    assert _completed(f"task:{task}", f"order-{order}")


def test_one_message_published_several_times_takes_effect_once(
    workers: Callable[..., Worker], broker: RedisServer, queue: str
) -> None:
    """The default key, the task id: each producer publishes the same message."""
    label = f"once-{uuid.uuid4().hex[:12]}"
    task_id = str(uuid.uuid4())
    first, second = workers("first"), workers("second")

    def publish() -> None:
        app = Celery("publisher", broker=broker.url, set_as_current=False)
        try:
            for _ in range(2):
                app.send_task("tests.once", args=[label, broker.url], task_id=task_id, queue=queue)
        finally:
            app.close()

    threads = [threading.Thread(target=publish) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Every one of the six deliveries ended (ran, or answered with the stored result).
    wait_for(
        lambda: (first.log() + second.log()).count(f"{task_id}] succeeded") == 6,
        "the six deliveries",
        first,
        second,
    )
    assert SideEffect.objects.filter(label=label).count() == 1
    assert _runs(broker, label) == 1
    assert _completed("task:tests.once", task_id)


@pytest.mark.parametrize("task", ["tests.block_once", "tests.block_once_locked"])
def test_a_worker_killed_in_the_body_is_redelivered_and_runs_once(
    workers: Callable[..., Worker], producer: Celery, broker: RedisServer, task: str
) -> None:
    # The broker hands a killed worker's message back after this many seconds.
    _kill_in_the_body(workers, producer, broker, task, TEST_CELERY_VISIBILITY_TIMEOUT="2")


@pytest.mark.rabbitmq
def test_on_rabbitmq_a_worker_killed_in_the_body_runs_once(
    workers: Callable[..., Worker], broker: RedisServer, queue: str
) -> None:
    """RabbitMQ hands the message back as soon as the killed worker's connection closes."""
    with rabbitmq_producer(broker, queue) as app:
        _kill_in_the_body(
            workers, app, broker, "tests.block_once", TEST_CELERY_BROKER_URL=RABBITMQ_URL
        )


@contextmanager
def rabbitmq_producer(broker: RedisServer, queue: str) -> Iterator[Celery]:
    """A producer on RabbitMQ (results in ``broker``); the queue is deleted after. A
    RabbitMQ that does not answer skips the test, or fails it when ``CI`` is set."""
    if not answers(RABBITMQ_URL, 5672):
        if in_ci():
            pytest.fail(f"CI is set but RabbitMQ does not answer at {RABBITMQ_URL}")
        pytest.skip(f"RabbitMQ does not answer at {RABBITMQ_URL}")
    app = Celery("producer", broker=RABBITMQ_URL, backend=broker.url, set_as_current=False)
    app.conf.task_default_queue = queue
    try:
        yield app
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        app.close()


def _kill_in_the_body(
    workers: Callable[..., Worker], producer: Celery, broker: RedisServer, task: str, **env: str
) -> None:
    label = f"block-{uuid.uuid4().hex[:12]}"
    doomed = workers("doomed", **env)
    sent = producer.send_task(task, args=[label, broker.url])
    wait_for(lambda: _runs(broker, label) == 1, "the body to block", doomed)
    doomed.kill()
    # The killed transaction took its row with it.
    assert not SideEffect.objects.filter(label=label).exists()
    assert not _completed(f"task:{task}", sent.id)

    again = workers("again", **env)
    wait_for(lambda: _completed(f"task:{task}", sent.id), "the redelivery", again)
    assert SideEffect.objects.filter(label=label).count() == 1
    assert _runs(broker, label) == 2


STEPS = ("create_charge", "record_answer", "send_receipt")


@pytest.mark.parametrize(
    ("task", "stop_at"),
    [
        ("tests.charge_in_steps", "create_charge"),
        ("tests.charge_in_steps", "call_provider"),
        ("tests.charge_in_steps", "record_answer"),
        ("tests.charge_in_steps_locked", "call_provider"),
    ],
)
def test_a_task_in_steps_killed_between_two_resumes_with_one_effect_per_step(
    workers: Callable[..., Worker], producer: Celery, broker: RedisServer, task: str, stop_at: str
) -> None:
    """A worker SIGKILLed after a step: the redelivered message (the Redis broker's
    visibility timeout) resumes after the last step that committed."""
    _kill_between_steps(
        workers, producer, broker, task, stop_at, TEST_CELERY_VISIBILITY_TIMEOUT="2"
    )


@pytest.mark.rabbitmq
def test_on_rabbitmq_a_task_in_steps_killed_between_two_resumes(
    workers: Callable[..., Worker], broker: RedisServer, queue: str
) -> None:
    """RabbitMQ hands the killed worker's message back when its connection closes."""
    with rabbitmq_producer(broker, queue) as app:
        _kill_between_steps(
            workers,
            app,
            broker,
            "tests.charge_in_steps",
            "call_provider",
            TEST_CELERY_BROKER_URL=RABBITMQ_URL,
        )


def _kill_between_steps(
    workers: Callable[..., Worker],
    producer: Celery,
    broker: RedisServer,
    task: str,
    stop_at: str,
    **env: str,
) -> None:
    """The first run stops after ``stop_at`` and its worker is killed; another worker
    finishes. Each local step's row is written once, the provider gets one key (called
    again with it only when the kill came before its answer was recorded), the result is
    stored, and a duplicate publish gets it without running the body."""
    label = f"steps-{uuid.uuid4().hex[:12]}"
    doomed = workers("doomed", **env)
    sent = producer.send_task(task, args=[label, broker.url, stop_at])
    client = redis.Redis.from_url(broker.url)
    stopped = f"{label}:at:{stop_at}"
    wait_for(
        lambda: int(client.get(stopped) or 0) == 1, f"the body to stop after {stop_at}", doomed
    )
    doomed.kill()

    again = workers("again", **env)
    result = sent.get(timeout=PATIENCE)
    rows = {step: SideEffect.objects.filter(label=f"{label}:{step}").count() for step in STEPS}
    assert rows == dict.fromkeys(STEPS, 1), (rows, again.log())
    listed: list[bytes] = client.lrange(f"{label}:provider", 0, -1)  # type: ignore[assignment]
    calls = [key.decode() for key in listed]
    assert len(set(calls)) == 1, calls
    assert len(calls) == (2 if stop_at == "call_provider" else 1), calls
    assert _runs(broker, label) == 2
    row = IdempotencyKey.objects.get(scope=f"task:{task}", key=sent.id)
    assert row.status == COMPLETED and row.recovery_point == "send_receipt"
    assert row.steps is not None
    assert [step["name"] for step in row.steps["done"]] == [
        "create_charge",
        "call_provider",
        "record_answer",
        "send_receipt",
    ]
    assert result["answer"] == {"provider_charge": calls[0][:16]}

    duplicate = producer.send_task(task, args=[label, broker.url, stop_at], task_id=sent.id)
    assert duplicate.get(timeout=PATIENCE) == result
    assert _runs(broker, label) == 2, "the duplicate ran no step"
    client.close()


def test_a_redelivery_past_the_downstream_keys_lifetime_does_not_call_the_provider_again(
    workers: Callable[..., Worker], producer: Celery, broker: RedisServer
) -> None:
    """The worker is killed after the provider's call, before its answer was recorded, and
    the message comes back when the key's first claim is older than
    ``DOWNSTREAM_KEY_LIFETIME``: the body raises ``RemoteOutcomeUnknown`` instead of calling
    again (the provider may have forgotten the key), the task fails, and the key stays in
    progress with its steps for reconciliation."""
    from datetime import timedelta

    from django_idempotency.store.clock import DatabaseNow

    task = "tests.charge_in_steps"
    label = f"forgot-{uuid.uuid4().hex[:12]}"
    doomed = workers("doomed", TEST_CELERY_VISIBILITY_TIMEOUT="2")
    sent = producer.send_task(task, args=[label, broker.url, "call_provider"])
    client = redis.Redis.from_url(broker.url)
    stopped = f"{label}:at:call_provider"
    wait_for(lambda: int(client.get(stopped) or 0) == 1, "the provider's call", doomed)
    doomed.kill()
    keys = IdempotencyKey.objects.filter(scope=f"task:{task}", key=sent.id)
    keys.update(created_at=DatabaseNow() - timedelta(days=1, minutes=1))

    again = workers("again", TEST_CELERY_VISIBILITY_TIMEOUT="2")
    with pytest.raises(Exception) as failed:  # noqa: PT011 - rebuilt by the result backend
        sent.get(timeout=PATIENCE)
    assert "RemoteOutcomeUnknown" in repr(failed.value) + str(sent.traceback), again.log()
    listed: list[bytes] = client.lrange(f"{label}:provider", 0, -1)  # type: ignore[assignment]
    assert len(listed) == 1, "the provider was called again"
    row = keys.get()
    assert row.status == "in_progress" and row.steps is not None
    assert [step["name"] for step in row.steps["done"]] == ["create_charge"]
    assert SideEffect.objects.filter(label__startswith=f"{label}:").count() == 1
    client.close()


def test_self_steps_outside_a_task_in_steps_says_what_is_wrong() -> None:
    with pytest.raises(RuntimeError, match="idempotency_steps"):
        charge.steps  # noqa: B018 - the property's refusal is the point


def test_a_retry_in_the_body_still_takes_effect_once(
    workers: Callable[..., Worker], producer: Celery, broker: RedisServer
) -> None:
    label = f"retry-{uuid.uuid4().hex[:12]}"
    worker = workers("retrying")
    sent = producer.send_task("tests.retry_once", args=[label, broker.url])
    assert sent.get(timeout=PATIENCE) == 2, worker.log()
    # The first run's row was rolled back with the retry; the second's committed.
    assert SideEffect.objects.filter(label=label).count() == 1
    assert _completed("task:tests.retry_once", sent.id)


def test_a_worker_with_a_task_whose_key_expires_before_a_redelivery_does_not_start(
    workers: Callable[..., Worker],
) -> None:
    """A task keeping its result 60 s, on a Redis broker that hands an unacknowledged
    message to another worker after an hour: a worker killed between the body's commit and
    the ack would have its message run again by the next, the key expired by then. The
    worker that imports such a task stops at start-up with the reason."""
    with pytest.raises(RuntimeError, match="celery worker exited") as exited:
        workers("short", include=("tests.testapp.short_tasks",))
    assert "idempotency_ttl 60s is shorter than the broker's visibility timeout (3600s" in str(
        exited.value
    )
    # Within the timeout the same task starts (the tests' workers take messages back after
    # a short one).
    workers("short-ok", include=("tests.testapp.short_tasks",), TEST_CELERY_VISIBILITY_TIMEOUT="30")
