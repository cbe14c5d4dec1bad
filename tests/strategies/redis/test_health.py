"""Redis fallback episodes: a private ``redis-server`` killed (SIGKILL) and started again;
one ERROR per episode once it is older than ``ALERT_AFTER``, ``health()``, and the
Prometheus counter and gauge on a real registry."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import django_idempotency
from django_idempotency import metrics
from django_idempotency.models import IdempotencyKey
from django_idempotency.strategies.redis import health as redis_health

from ...support.api import api_client, post_json, replayed
from ...support.factories import UserFactory
from ...support.redis_servers import RedisServer

pytestmark = [
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("forget_queued_drains"),
]

ALERT_AFTER = 1.0


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[CollectorRegistry]:
    monkeypatch.setattr(redis_health, "ALERT_AFTER", ALERT_AFTER)
    redis_health.monitor.reset()
    registry = CollectorRegistry()
    metrics.install(registry)
    yield registry
    metrics.uninstall()
    redis_health.monitor.reset()


class FrozenClock:
    """The health monitor's ``time`` (its module's import of it): still until the test
    moves it, so that an episode is "not yet ALERT_AFTER old" however slow the machine,
    and older after ``advance``, without a sleep."""

    def __init__(self) -> None:
        self.mono, self.wall = time.monotonic(), time.time()

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    frozen = FrozenClock()
    monkeypatch.setattr(redis_health, "time", frozen)
    return frozen


def _alerts(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and "Redis has been unavailable" in r.getMessage()
    ]


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
def test_one_error_per_episode_and_health_until_redis_answers(
    redis_settings: Any,
    running_private_redis: RedisServer,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
    clock: FrozenClock,
    strategy: str,
) -> None:
    redis_settings(running_private_redis.url, STRATEGY=strategy, HYBRID_DB_CHECK="always")
    caplog.set_level(logging.INFO, logger="django_idempotency")
    client = api_client(UserFactory())
    assert post_json(client, uuid.uuid4().hex, {}).status_code == 201
    assert django_idempotency.health().ok
    try:
        for episode in (1, 2):
            running_private_redis.kill()
            assert post_json(client, uuid.uuid4().hex, {}).status_code == 201  # the db fallback
            state = django_idempotency.health()
            assert state.ok and state.redis_fallback_requests == 1  # not yet ALERT_AFTER old
            assert state.redis_fallback_since is not None and "refused" in state.redis_last_error
            assert len(_alerts(caplog)) == episode - 1
            clock.advance(ALERT_AFTER + 0.1)
            for _ in range(3):
                assert post_json(client, uuid.uuid4().hex, {}).status_code == 201
            assert len(_alerts(caplog)) == episode  # once, not per request
            state = django_idempotency.health()
            assert not state.ok and state.redis_fallback_requests == 4
            assert state.redis_fallback_seconds >= ALERT_AFTER
            assert _sample(registry, "django_idempotency_redis_fallback_active") == 1
            running_private_redis.start()
            key = uuid.uuid4().hex
            assert post_json(client, key, {}).status_code == 201  # through Redis again
            assert replayed(post_json(client, key, {}))
            assert not IdempotencyKey.objects.filter(key=key).exists()
            assert django_idempotency.health() == redis_health.Health(True, None, 0.0, 0, "")
            assert _sample(registry, "django_idempotency_redis_fallback_active") == 0
        total = _sample(
            registry, "django_idempotency_redis_fallback_requests_total", strategy=strategy
        )
        assert total == 8
        assert IdempotencyKey.objects.count() == 8  # the db strategy took exactly those
    finally:
        if not running_private_redis.running:
            running_private_redis.start()


def test_fail_closed_counts_too(
    redis_settings: Any,
    running_private_redis: RedisServer,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
    clock: FrozenClock,
) -> None:
    """503s are an episode as well: the app serves nothing idempotent while it lasts."""
    redis_settings(running_private_redis.url, REDIS_FAILURE_MODE="fail_closed")
    client = api_client(UserFactory())
    running_private_redis.kill()
    try:
        assert post_json(client, uuid.uuid4().hex, {}).status_code == 503
        clock.advance(ALERT_AFTER + 0.1)
        assert post_json(client, uuid.uuid4().hex, {}).status_code == 503
        assert len(_alerts(caplog)) == 1
        assert not django_idempotency.health().ok
    finally:
        running_private_redis.start()
