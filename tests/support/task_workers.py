"""The fixtures of the tests that run idempotent tasks in real ``celery worker`` processes
(a pytest plugin loaded by ``tests/conftest.py``), and waiting on those workers.

The workers use a private Redis as their broker and result backend (a killed worker's
message is taken back after a short visibility timeout, which must not touch the other
test runs' messages on the shared Redis) and this run's test database. Celery is imported
when a fixture needs it: the matrix's smoke sessions run without it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING

import pytest

from .redis_servers import RedisServer
from .workers import Worker, worker_env, worker_pool

if TYPE_CHECKING:
    from celery import Celery

#: Generous bounds for what a busy machine does in a few seconds: never reached when green.
PATIENCE = 120.0


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    with RedisServer().start() as server:
        yield server


@pytest.fixture
def queue() -> str:
    return f"idem-tasks-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def producer(broker: RedisServer, queue: str) -> Iterator[Celery]:
    """A Celery app of a producer's own, which reads results back."""
    from celery import Celery

    app = Celery("producer", broker=broker.url, backend=broker.url, set_as_current=False)
    app.conf.task_default_queue = queue
    yield app
    app.close()


@pytest.fixture
def workers(
    transactional_db: None, broker: RedisServer, queue: str
) -> Iterator[Callable[..., Worker]]:
    """``workers(name, include=(), **env)`` starts a worker on this run's test database
    (``include``: modules it imports at start-up, Celery's ``--include``)."""
    from django.db import connection

    env = worker_env(
        str(connection.settings_dict["NAME"]), broker.url, TEST_CELERY_RESULT_BACKEND=broker.url
    )
    with worker_pool(env) as start:
        yield partial(_on_queue, start, queue)


def _on_queue(
    start: Callable[..., Worker], queue: str, name: str, include: tuple[str, ...] = (), **extra: str
) -> Worker:
    return start(name, queue, include, **extra)


def wait_for(condition: Callable[[], bool], what: str, *logs: Worker) -> None:
    """Until ``condition()`` holds (at most ``PATIENCE``); the workers' logs if it never
    does."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(w.log() for w in logs))
