"""Idempotent tasks applied in the caller's process (``apply()``), on every key database
vendor: PostgreSQL, SQLite and MariaDB, each the real server.

Real threads race on one key; the body counts its runs outside every transaction (a
process-wide counter) and writes one SideEffect row in its transaction on the key's
database. A duplicate that finds the key in progress waits in the caller's process for the
running body, which a test holds on an event, and returns its result. Also: where a task's
key lives (``database=``, ``DATABASE_ROUTING = "router"``) and the refusal of a strategy the
tasks do not offer.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_idempotency.errors import DatabaseMisconfigured
from django_idempotency.idempotent_tasks import IdempotentTask, idempotent_task
from django_idempotency.models import IdempotencyKey
from django_idempotency.store.status import COMPLETED, IN_PROGRESS
from tests.testapp.models import SideEffect

from .support.threads import in_background, run_at_once

ALIASES = [
    pytest.param("default", marks=pytest.mark.postgres, id="postgresql"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("mariadb", marks=pytest.mark.mariadb, id="mariadb"),
]
SCOPE = "task:tests.caller.charge"
#: Generous bound for a thread that waits on another: never reached when green.
PATIENCE = 60.0

runs: Counter[str] = Counter()
started: dict[str, threading.Event] = {}
release: dict[str, threading.Event] = {}


def _charge(order: str, alias: str) -> dict[str, Any]:
    """One charge per order; the first run of a held order waits for the test."""
    runs[order] += 1
    effect = SideEffect.objects.using(alias).create(label=f"charge-{order}")
    if order in release:
        started[order].set()
        assert release[order].wait(PATIENCE), "the test never released the body"
    return {"order": order, "effect": effect.pk, "run": runs[order]}


charge = idempotent_task(
    name="tests.caller.charge",
    key=lambda order, alias: f"order-{order}",
    database=lambda order, alias: alias,
    countdown=0.05,
)(_charge)


@pytest.fixture
def alias(request: pytest.FixtureRequest, settings: Any) -> str:
    name = str(request.param)
    settings.IDEMPOTENCY = {"KEY_DATABASES": ["default", name]}
    return name


def _held(order: str) -> None:
    started[order] = threading.Event()
    release[order] = threading.Event()


def _effects(alias: str, order: str) -> int:
    return SideEffect.objects.using(alias).filter(label=f"charge-{order}").count()


@pytest.mark.django_db(databases=["default", "sqlite", "mariadb"], transaction=True)
@pytest.mark.parametrize("alias", ALIASES, indirect=True)
def test_racing_calls_of_one_key_take_effect_once(alias: str) -> None:
    order = uuid.uuid4().hex[:12]
    results = run_at_once(6, lambda i: charge.apply(args=[order, alias]).get())
    assert runs[order] == 1
    assert _effects(alias, order) == 1
    assert all(result == results[0] for result in results)
    record = IdempotencyKey.objects.using(alias).get(scope=SCOPE, key=f"order-{order}")
    assert record.status == COMPLETED


@pytest.mark.django_db(databases=["default", "sqlite", "mariadb"], transaction=True)
@pytest.mark.parametrize("alias", ALIASES, indirect=True)
def test_a_duplicate_in_the_caller_waits_for_the_running_body(alias: str) -> None:
    """Without a worker to publish it again to, the duplicate looks again in its own
    process until the running body has stored its result, then returns that result."""
    order = uuid.uuid4().hex[:12]
    _held(order)
    first = in_background(lambda: charge.apply(args=[order, alias]).get())
    assert started[order].wait(PATIENCE)
    record = IdempotencyKey.objects.using(alias).get(scope=SCOPE, key=f"order-{order}")
    assert record.status == IN_PROGRESS
    duplicate = in_background(lambda: charge.apply(args=[order, alias]).get())
    release[order].set()
    assert duplicate.result(PATIENCE) == first.result(PATIENCE)
    assert runs[order] == 1
    assert _effects(alias, order) == 1


@pytest.mark.django_db(databases=["default", "sqlite"], transaction=True)
def test_a_key_database_outside_key_databases_is_refused_before_the_body(settings: Any) -> None:
    settings.IDEMPOTENCY = {"KEY_DATABASES": ["default"]}
    order = uuid.uuid4().hex[:12]
    refused = charge.apply(args=[order, "sqlite"])
    assert refused.failed() and isinstance(refused.result, DatabaseMisconfigured)
    assert "'sqlite'" in str(refused.result) and runs[order] == 0
    assert not IdempotencyKey.objects.using("sqlite").filter(key=f"order-{order}").exists()


class KeysOnSqlite:
    """A router that keeps IdempotencyKey on ``sqlite``."""

    def db_for_write(self, model: type, **hints: Any) -> str | None:
        return "sqlite" if model is IdempotencyKey else None


@pytest.mark.django_db(databases=["default", "sqlite"], transaction=True)
def test_routed_keys_follow_the_router(settings: Any) -> None:
    settings.DATABASE_ROUTERS = [f"{__name__}.KeysOnSqlite"]
    settings.IDEMPOTENCY = {"KEY_DATABASES": ["default", "sqlite"], "DATABASE_ROUTING": "router"}
    label = uuid.uuid4().hex[:12]

    def body() -> int:
        return int(SideEffect.objects.using("sqlite").create(label=label).pk)

    routed = idempotent_task(name=f"tests.caller.routed.{label}", key=lambda: label)(body)
    assert routed.apply().get() == routed.apply().get()
    assert IdempotencyKey.objects.using("sqlite").filter(key=label, status=COMPLETED).exists()
    assert SideEffect.objects.using("sqlite").filter(label=label).count() == 1


def test_a_strategy_the_tasks_do_not_offer_is_refused_when_declared() -> None:
    with pytest.raises(ImproperlyConfigured, match="'redis' is not one of"):
        idempotent_task(strategy="redis")
    with pytest.raises(ImproperlyConfigured, match="Hot: idempotency_strategy 'hybrid'"):

        class Hot(IdempotentTask):
            idempotency_strategy = "hybrid"


@pytest.mark.parametrize(
    ("broker", "options", "timeout"),
    [
        ("redis://127.0.0.1:6379/0", {}, 3600.0),
        ("rediss://127.0.0.1:6380/0", {"visibility_timeout": 43200}, 43200.0),
        ("sentinel://127.0.0.1:26379", {}, 3600.0),
        ("sqs://", {}, 1800.0),
        ("amqp://guest:guest@127.0.0.1:5672//", {"visibility_timeout": 10}, None),
        ("memory://", {}, None),
    ],
)
def test_a_brokers_visibility_timeout(
    broker: str, options: dict[str, Any], timeout: float | None
) -> None:
    """The brokers that hand an unacknowledged message to another worker only once a
    timeout is over (kombu's defaults, or ``broker_transport_options``); RabbitMQ takes it
    back when the worker's connection drops."""
    from celery import Celery

    from django_idempotency.idempotent_tasks import visibility_timeout

    app = Celery("visibility", broker=broker, set_as_current=False)
    app.conf.broker_transport_options = options
    assert visibility_timeout(app.conf) == timeout


def test_a_task_keeping_its_result_shorter_than_a_redelivery_is_refused_when_bound() -> None:
    """Its own ``idempotency_ttl`` against its app's broker, when Celery binds the task to
    the app (a worker's start-up); a task keeping ``TTL`` is not refused."""
    from celery import Celery

    app = Celery("short", broker="redis://127.0.0.1:6379/0", set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 7200}

    @app.task(base=IdempotentTask, idempotency_ttl=3600, name="tests.short_bound")
    def short() -> int:
        return 1

    @app.task(base=IdempotentTask, idempotency_ttl=7200, name="tests.long_bound")
    def long() -> int:
        return 1

    @app.task(base=IdempotentTask, name="tests.default_bound")
    def default() -> int:
        return 1

    with pytest.raises(ImproperlyConfigured, match=r"tests\.short_bound: idempotency_ttl 3600s"):
        app.finalize()
    app.close()
