"""System checks on ``settings.IDEMPOTENCY`` (django_idempotency.checks)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import CheckMessage, Error, Warning, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings

from django_idempotency.checks import check_settings
from django_idempotency.errors import ImproperlyConfiguredStrategy, RedisNotConfigured
from django_idempotency.strategies import load_strategy


def ids(messages: list[CheckMessage]) -> list[str]:
    return [m.id or "" for m in messages]


def only(messages: list[CheckMessage], check_id: str) -> CheckMessage:
    """The single message with ``check_id``; it must carry a hint."""
    found = [m for m in messages if m.id == f"django_idempotency.{check_id}"]
    assert len(found) == 1, ids(messages)
    assert found[0].hint, f"{check_id} has no hint"
    return found[0]


def run(idempotency: Any) -> list[CheckMessage]:
    with override_settings(IDEMPOTENCY=idempotency):
        return check_settings()


# -- good configuration is quiet ----------------------------------------------------------


@pytest.mark.parametrize(
    "idempotency",
    [
        None,
        {},
        {"STRATEGY": "db", "DATABASE": "sqlite"},
        {"TTL": 3600, "LOCK_TIMEOUT": 30, "HEARTBEAT_INTERVAL": 5, "METHODS": ["POST", "PUT"]},
        {"STORED_HEADERS": ["Content-Type", "Location", "X-Request-Id"], "RETRY_AFTER": 2},
        {"REDIS_FAILURE_MODE": "fail_closed", "HYBRID_DB_CHECK": "after_loss"},
        {"STRATEGY": "django_idempotency.strategies.db.DatabaseStrategy"},
    ],
)
def test_good_configuration_is_quiet(idempotency: Any) -> None:
    assert run(idempotency) == []


@pytest.mark.postgres
def test_advisory_lock_on_postgresql_is_quiet() -> None:
    assert run({"STRATEGY": "advisory_lock", "DATABASE": "default"}) == []


def test_the_checks_are_registered() -> None:
    with override_settings(IDEMPOTENCY={"TTL": 0}):
        assert "django_idempotency.E002" in ids(run_checks())
        with pytest.raises(SystemCheckError, match="E002"):
            call_command("check")
    call_command("check")  # the test settings pass


# -- each check fires ---------------------------------------------------------------------


@pytest.mark.parametrize("value", [["STRATEGY", "db"], "db", 42])
def test_e001_not_a_dict(value: Any) -> None:
    messages = run(value)
    assert isinstance(only(messages, "E001"), Error)
    assert len(messages) == 1


def test_w001_unknown_setting() -> None:
    messages = run({"STRATEGY": "db", "LOCK_TIMEOUTS": 5, "ttl": 3})
    found = [m for m in messages if m.id == "django_idempotency.W001"]
    assert len(found) == 2
    assert all(isinstance(m, Warning) and "LOCK_TIMEOUT" in (m.hint or "") for m in found)
    assert "'LOCK_TIMEOUTS'" in found[0].msg and "'ttl'" in found[1].msg


@pytest.mark.parametrize(
    "idempotency",
    [
        {"TTL": 0},
        {"TTL": -5},
        {"LOCK_TIMEOUT": 0},
        {"LOCK_TIMEOUT": "soon"},
        {"LOCK_TIMEOUT": None},
        {"MAX_STORED_BODY_SIZE": 0},
        {"MAX_STORED_BODY_SIZE": "big"},
    ],
)
def test_e002_numbers_must_be_positive(idempotency: dict[str, Any]) -> None:
    (name,) = idempotency
    message = only(run(idempotency), "E002")
    assert isinstance(message, Error)
    assert name in message.msg


@pytest.mark.parametrize(
    "idempotency",
    [
        {"WAIT": -1},
        {"WAIT": "soon"},
        {"WAIT_POLL_INTERVAL": 0},
        {"WAIT_MAX_WAITERS": 0},
        {"WAIT_MAX_WAITERS": 2.5},
    ],
)
def test_e013_the_wait_settings(idempotency: dict[str, Any]) -> None:
    (name,) = idempotency
    message = only(run(idempotency), "E013")
    assert isinstance(message, Error)
    assert name in message.msg


def test_the_wait_settings_pass_with_their_defaults_and_a_wait() -> None:
    assert not [m for m in run({"WAIT": 5}) if m.id == "django_idempotency.E013"]


@pytest.mark.parametrize(
    "idempotency",
    [
        {"LOCK_TIMEOUT": 10, "HEARTBEAT_INTERVAL": 10},
        {"LOCK_TIMEOUT": 10, "HEARTBEAT_INTERVAL": 30},
        {"HEARTBEAT_INTERVAL": 0},
        {"HEARTBEAT_INTERVAL": -1},
        {"HEARTBEAT_INTERVAL": "often"},
    ],
)
def test_e003_heartbeat_shorter_than_lock_timeout(idempotency: dict[str, Any]) -> None:
    assert isinstance(only(run(idempotency), "E003"), Error)


def test_w002_ttl_shorter_than_lock_timeout() -> None:
    message = only(run({"TTL": 10, "LOCK_TIMEOUT": 60}), "W002")
    assert isinstance(message, Warning)


@pytest.mark.parametrize("methods", [[], ["POST", "FETCH"], "POST", ["OPTIONS"], None, 5])
def test_e004_methods(methods: Any) -> None:
    assert isinstance(only(run({"METHODS": methods}), "E004"), Error)


def test_e005_unknown_database_alias() -> None:
    message = only(run({"DATABASE": "nowhere"}), "E005")
    assert "'nowhere'" in message.msg


@pytest.mark.parametrize(
    "strategy",
    ["no_such_strategy", "no.such.Strategy", "django_idempotency.conf.IdempotencySettings"],
)
def test_e006_unloadable_strategy(strategy: str) -> None:
    message = only(run({"STRATEGY": strategy}), "E006")
    assert "pip install django-idempotency[redis]" in (message.hint or "")


@pytest.mark.parametrize(
    "strategy", ["no_such_strategy", "django_idempotency.conf.IdempotencySettings"]
)
def test_an_unloadable_strategy_raises_improperly_configured(strategy: str) -> None:
    """What E006 reports is raised by ``load_strategy`` as an ``ImproperlyConfigured``."""
    with pytest.raises(ImproperlyConfiguredStrategy) as info:
        load_strategy(strategy)
    assert isinstance(info.value, ImproperlyConfigured)


def test_e007_advisory_lock_needs_postgresql() -> None:
    message = only(run({"STRATEGY": "advisory_lock", "DATABASE": "sqlite"}), "E007")
    assert "sqlite" in message.msg
    assert "'db'" in (message.hint or "")


def test_e008_db_strategy_needs_postgresql_or_sqlite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections["sqlite"], "vendor", "mysql")
    message = only(run({"STRATEGY": "db", "DATABASE": "sqlite"}), "E008")
    assert "mysql" in message.msg
    assert "ON CONFLICT" in (message.hint or "")


def test_w003_header_stored_and_never_stored() -> None:
    message = only(run({"STORED_HEADERS": ["Content-Type", "set-cookie", "Authorization"]}), "W003")
    assert isinstance(message, Warning)
    assert "authorization, set-cookie" in message.msg


def test_e009_redis_failure_mode() -> None:
    assert isinstance(only(run({"REDIS_FAILURE_MODE": "ignore"}), "E009"), Error)


def test_e010_hybrid_db_check() -> None:
    assert isinstance(only(run({"HYBRID_DB_CHECK": "never"}), "E010"), Error)


def test_e011_redis_strategies_need_a_redis() -> None:
    message = only(run({"STRATEGY": "redis"}), "E011")
    assert "REDIS_URL" in message.msg
    assert run({"STRATEGY": "redis", "REDIS_URL": "redis://127.0.0.1:6379/15"}) == []


def test_redis_strategies_without_a_redis_raise_improperly_configured() -> None:
    """What E011 reports is raised by the Redis client factory as an ``ImproperlyConfigured``."""
    from django_idempotency.redis_store import get_client

    with (
        override_settings(IDEMPOTENCY={"STRATEGY": "redis"}),
        pytest.raises(RedisNotConfigured, match="REDIS_URL") as info,
    ):
        get_client()
    assert isinstance(info.value, ImproperlyConfigured)


def test_e012_cache_alias_must_be_a_redis_cache() -> None:
    message = only(run({"STRATEGY": "hybrid", "REDIS_CACHE_ALIAS": "default"}), "E012")
    assert "'default'" in message.msg
    assert "django.core.cache.backends.redis.RedisCache" in (message.hint or "")
    assert "django-idempotency[django-redis]" in (message.hint or "")
    assert (
        "not in CACHES"
        in only(run({"STRATEGY": "redis", "REDIS_CACHE_ALIAS": "nowhere"}), "E012").msg
    )


@pytest.mark.parametrize(
    "backend", ["django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache"]
)
def test_e012_accepts_django_redis_and_djangos_own_redis_cache(backend: str) -> None:
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "idem": {"BACKEND": backend, "LOCATION": "redis://127.0.0.1:6379/15"},
    }
    with override_settings(CACHES=caches):
        assert run({"STRATEGY": "redis", "REDIS_CACHE_ALIAS": "idem"}) == []


def test_every_check_id_is_tested_here() -> None:
    import re
    from pathlib import Path

    import django_idempotency.checks as checks

    source = Path(checks.__file__).read_text()
    declared = set(re.findall(r'id=ID \+ "([EW]\d{3})"', source))
    tested = set(re.findall(r"def test_([ew]\d{3})_", Path(__file__).read_text()))
    assert declared, "no check ids found in checks.py"
    assert declared == {t.upper() for t in tested}


def test_w004_metrics_without_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    assert run({"METRICS": True}) == []  # prometheus_client is installed here
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if it were not
    message = only(run({"METRICS": True}), "W004")
    assert isinstance(message, Warning)
    assert "pip install django-idempotency[prometheus]" in (message.hint or "")
    assert run({"METRICS": False}) == []


# -- @idempotent with DRF's @api_view (the URLconf) -------------------------------------------


def url_messages(urlconf: str) -> list[CheckMessage]:
    from django_idempotency.checks import check_drf_function_views

    with override_settings(ROOT_URLCONF=urlconf):
        return check_drf_function_views()


def test_idempotent_inside_api_view_passes_without_atomic_requests() -> None:
    """``@idempotent`` below ``@api_view`` claims after DRF's authentication and stores
    the response as DRF renders it (tests/test_drf_function_views.py)."""
    assert "django_idempotency.E020" not in ids(url_messages("tests.test_drf_function_views"))


def test_e020_idempotent_inside_api_view_under_atomic_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ATOMIC_REQUESTS on the keys' database the request's transaction, which
    ``@idempotent`` below ``@api_view`` cannot leave, holds the claim and the stored
    response until the end of the request; ``@transaction.non_atomic_requests`` above
    ``@api_view`` lets it out."""
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    message = only(url_messages("tests.test_drf_function_views"), "E020")
    assert isinstance(message, Error)
    assert "'inside/'" in message.msg and "ATOMIC_REQUESTS" in message.msg
    assert "idempotent_api_view" in (message.hint or "")
    assert "non_atomic_requests" in (message.hint or "")
    with override_settings(IDEMPOTENCY={"DATABASE": "sqlite"}):  # not the keys' database
        assert "django_idempotency.E020" not in ids(url_messages("tests.test_drf_function_views"))


def test_w020_idempotent_outside_api_view() -> None:
    message = only(url_messages("tests.test_drf_function_views"), "W020")
    assert isinstance(message, Warning)
    assert "outside" in message.msg and "'outside/'" in message.msg
    assert "idempotent_api_view" in (message.hint or "")


def test_the_supported_drf_function_views_pass_the_url_check() -> None:
    # The test URLconf has @idempotent_api_view views, mixin views and plain views.
    assert url_messages("tests.testapp.urls") == []
    # and the test module's URLconf names its wrong order only
    assert ids(url_messages("tests.test_drf_function_views")) == ["django_idempotency.W020"]


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        pytest.param("default", True, marks=pytest.mark.postgres, id="postgres-alias"),
        ("postgresql://app@db.internal:5432/payments", True),
        ("host=db.internal port=5432 dbname=payments", True),
        ("sqlite", False),
        ("nowhere", False),
        ("host='unterminated", False),
        (42, False),
        ("", False),
    ],
)
def test_e050_wait_listen_database(value: Any, valid: bool) -> None:
    """WAIT_LISTEN_DATABASE: a PostgreSQL alias or a DSN that parses; anything else would
    leave the waiters' listener failing in silence, or listening on the wrong server."""
    found = [m for m in run({"WAIT_LISTEN_DATABASE": value}) if m.id == "django_idempotency.E050"]
    assert (found == []) is valid
    assert all(isinstance(m, Error) and m.hint for m in found)
