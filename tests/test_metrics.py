"""Prometheus metrics fed by the engine's signals, on a real prometheus_client registry."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.apps import apps
from django.test import Client, RequestFactory, override_settings
from prometheus_client import REGISTRY, CollectorRegistry

from django_idempotency import metrics, signals
from django_idempotency.protocol.fingerprint import fingerprint
from tests.support.factories import IdempotencyKeyFactory, StaleKeyFactory
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db

URL = "/t/fn/"


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    metrics.install(registry)
    yield registry
    metrics.uninstall()


def post(client: Client, key: str, payload: dict[str, object]) -> int:
    body = json.dumps(payload).encode()
    return client.post(URL, body, "application/json", HTTP_IDEMPOTENCY_KEY=key).status_code


def events(registry: CollectorRegistry, event: str, strategy: str = "db") -> float:
    value = registry.get_sample_value(
        "django_idempotency_events_total", {"event": event, "strategy": strategy}
    )
    return value or 0.0


def claims(registry: CollectorRegistry, outcome: str, strategy: str = "db") -> float:
    value = registry.get_sample_value(
        "django_idempotency_claim_duration_seconds_count",
        {"strategy": strategy, "outcome": outcome},
    )
    return value or 0.0


def fingerprint_of(key: str, payload: dict[str, object]) -> str:
    request = RequestFactory().post(
        URL, json.dumps(payload).encode(), "application/json", HTTP_IDEMPOTENCY_KEY=key
    )
    return fingerprint(request)


def test_counts_each_outcome_per_strategy(registry: CollectorRegistry, client: Client) -> None:
    assert post(client, "m-1", {"n": 1}) == 201
    assert (events(registry, "claimed"), events(registry, "stored")) == (1, 1)
    assert post(client, "m-1", {"n": 1}) == 201  # the replay
    assert events(registry, "replayed") == 1
    assert post(client, "m-1", {"n": 2}) == 422
    assert events(registry, "mismatch") == 1

    IdempotencyKeyFactory(scope="anonymous", key="m-2", fingerprint=fingerprint_of("m-2", {}))
    assert post(client, "m-2", {}) == 409
    assert events(registry, "conflict") == 1

    StaleKeyFactory(scope="anonymous", key="m-3", fingerprint=fingerprint_of("m-3", {}))
    assert post(client, "m-3", {}) == 201
    assert events(registry, "taken_over") == 1

    assert post(client, "m-4", {"status": 503}) == 503  # a 5xx releases the key
    assert events(registry, "released") == 1

    assert events(registry, "claimed") == 2
    assert events(registry, "stored") == 2
    assert SideEffect.objects.count() == 2  # m-1 and m-3; the 503 rolled its write back

    assert claims(registry, "claimed") == 2
    assert claims(registry, "replay") == 1
    assert claims(registry, "mismatch") == 1
    assert claims(registry, "in_progress") == 1
    assert claims(registry, "taken_over") == 1
    total = registry.get_sample_value(
        "django_idempotency_claim_duration_seconds_sum", {"strategy": "db", "outcome": "claimed"}
    )
    assert total is not None
    assert 0 < total < 5
    # The le="+Inf" bucket holds every observation; the smallest bucket fewer or as many.
    inf = registry.get_sample_value(
        "django_idempotency_claim_duration_seconds_bucket",
        {"strategy": "db", "outcome": "claimed", "le": "+Inf"},
    )
    assert inf == 2


@pytest.mark.postgres
@override_settings(IDEMPOTENCY={"STRATEGY": "advisory_lock"})
def test_labels_the_strategy(registry: CollectorRegistry, client: Client) -> None:
    assert post(client, "adv-1", {}) == 201
    assert post(client, "adv-1", {}) == 201
    assert events(registry, "claimed", "advisory_lock") == 1
    assert events(registry, "replayed", "advisory_lock") == 1
    assert claims(registry, "replay", "advisory_lock") == 1
    assert events(registry, "claimed", "db") == 0


def test_uninstall_stops_counting_and_unregisters(client: Client) -> None:
    registry = CollectorRegistry()
    metrics.install(registry)
    assert signals.claim_timed.receivers
    metrics.uninstall()
    assert not signals.claim_timed.receivers
    assert metrics.installed() is None
    assert post(client, "gone-1", {}) == 201
    assert (
        registry.get_sample_value(
            "django_idempotency_events_total", {"event": "claimed", "strategy": "db"}
        )
        is None
    )
    assert list(registry.collect()) == []


def test_installing_twice_replaces_the_first(client: Client) -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    metrics.install(first)
    metrics.install(second)
    try:
        assert post(client, "twice-1", {}) == 201
        assert events(second, "claimed") == 1
        assert list(first.collect()) == []
    finally:
        metrics.uninstall()


def test_app_ready_installs_only_when_enabled() -> None:
    config = apps.get_app_config("django_idempotency")
    config.ready()
    assert metrics.installed() is None
    with override_settings(IDEMPOTENCY={"METRICS": True}):
        config.ready()
    try:
        installed = metrics.installed()
        assert installed is not None
        assert installed.registry is REGISTRY
        assert "django_idempotency_events" in {m.name for m in REGISTRY.collect()}
    finally:
        metrics.uninstall()
    assert "django_idempotency_events" not in {m.name for m in REGISTRY.collect()}


def test_claim_timer_is_off_without_metrics(client: Client) -> None:
    assert not signals.claim_timed.receivers
    assert post(client, "plain-1", {}) == 201


def test_a_broken_metric_does_not_fail_the_request(
    registry: CollectorRegistry, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    installed = metrics.installed()
    assert installed is not None
    installed.claim_seconds = None  # observe() now raises AttributeError
    assert post(client, "broken-1", {}) == 201
    assert "could not record the claim duration" in caplog.text
    assert SideEffect.objects.count() == 1
