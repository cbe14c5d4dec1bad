"""System checks on ``settings.IDEMPOTENCY`` (django_idempotency.checks)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.checks import CheckMessage, Error, Warning, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings

from django_idempotency.checks import error_text
from django_idempotency.checks.settings import check_settings, ensure_valid
from django_idempotency.checks.values import BOOLEAN_SETTINGS, NAME_LIST_SETTINGS
from django_idempotency.conf import SETTINGS
from django_idempotency.errors import (
    ImproperlyConfiguredStrategy,
    InvalidConfiguration,
    RedisNotConfigured,
)
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


def test_w001_unknown_setting_names_the_closest() -> None:
    messages = run({"STRATEGY": "db", "LOCK_TIMEOUTS": 5, "ttl": 3, "STRATEGI": "db", "XYZ": 1})
    found = [m for m in messages if m.id == "django_idempotency.W001"]
    assert all(isinstance(m, Warning) for m in found)
    hints = {m.msg.split("'")[1]: m.hint or "" for m in found}
    assert set(hints) == {"LOCK_TIMEOUTS", "STRATEGI", "XYZ", "ttl"}
    assert hints["LOCK_TIMEOUTS"] == "Did you mean 'LOCK_TIMEOUT'?"
    assert hints["STRATEGI"] == "Did you mean 'STRATEGY'?"
    assert hints["ttl"] == "Did you mean 'TTL'?"
    assert hints["XYZ"].startswith("Known settings: ") and "'STRATEGY'" not in hints["XYZ"]
    assert found[0].msg == "IDEMPOTENCY['LOCK_TIMEOUTS'] is not a known setting and is ignored."


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
        {"LOCK_TIMEOUT": float("nan")},
        {"TTL": float("inf")},
        {"REDIS_SOCKET_TIMEOUT": 0},
        {"REDIS_SOCKET_TIMEOUT": -0.25},
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
        {"WAIT": float("nan")},
        {"WAIT_POLL_INTERVAL": float("inf")},
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


def test_e008_db_strategy_needs_a_database_it_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections["sqlite"], "vendor", "oracle")
    message = only(run({"STRATEGY": "db", "DATABASE": "sqlite"}), "E008")
    assert "oracle" in message.msg
    assert "MySQL/MariaDB" in message.msg and "PostgreSQL" in message.msg
    assert "insert-if-absent" in (message.hint or "")


def test_e008_hybrid_stays_on_postgresql_and_sqlite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections["sqlite"], "vendor", "mysql")
    idempotency = {"STRATEGY": "hybrid", "DATABASE": "sqlite", "REDIS_URL": "redis://x:6379/0"}
    message = only(run(idempotency), "E008")
    assert "hybrid strategy supports PostgreSQL and SQLite" in message.msg
    assert "db strategy runs on PostgreSQL, SQLite, MariaDB and MySQL" in (message.hint or "")


def test_the_db_strategy_runs_on_mysql_and_mariadb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections["sqlite"], "vendor", "mysql")
    assert set(ids(run({"STRATEGY": "db", "DATABASE": "sqlite"}))) & MYSQL_CHECKS == set()


MYSQL_CHECKS = {"django_idempotency.E008", "django_idempotency.E033", "django_idempotency.E034"}


@pytest.mark.parametrize("level", ["repeatable read", "serializable", "read uncommitted", None])
def test_e033_mysql_needs_read_committed(monkeypatch: pytest.MonkeyPatch, level: Any) -> None:
    """Django's default on MySQL is READ COMMITTED; anything else (None: the server's own
    default, REPEATABLE READ on InnoDB) is refused for the keys' database."""
    monkeypatch.setattr(connections["sqlite"], "vendor", "mysql")
    options = {**connections["sqlite"].settings_dict["OPTIONS"], "isolation_level": level}
    monkeypatch.setitem(connections["sqlite"].settings_dict, "OPTIONS", options)
    message = only(run({"STRATEGY": "db", "DATABASE": "sqlite"}), "E033")
    assert repr(level) in message.msg
    assert "REPEATABLE READ" in (message.hint or "")
    options["isolation_level"] = "READ COMMITTED"  # Django lower-cases it
    assert "django_idempotency.E033" not in ids(run({"STRATEGY": "db", "DATABASE": "sqlite"}))


@pytest.mark.parametrize(
    ("use_tz", "database_zone"), [(True, "Europe/Paris"), (False, None)], ids=["db-zone", "no-tz"]
)
def test_e034_mysql_keeps_datetimes_in_utc(
    monkeypatch: pytest.MonkeyPatch, use_tz: bool, database_zone: str | None
) -> None:
    monkeypatch.setattr(connections["sqlite"], "vendor", "mysql")
    monkeypatch.setitem(connections["sqlite"].settings_dict, "TIME_ZONE", database_zone)
    with override_settings(USE_TZ=use_tz, TIME_ZONE="Asia/Tokyo"):
        connections["sqlite"].__dict__.pop("timezone_name", None)  # a cached_property
        try:
            message = only(run({"STRATEGY": "db", "DATABASE": "sqlite"}), "E034")
        finally:
            connections["sqlite"].__dict__.pop("timezone_name", None)
    assert "UTC_TIMESTAMP" in message.msg
    assert "USE_TZ = True" in (message.hint or "")


def test_w003_header_stored_and_never_stored() -> None:
    message = only(run({"STORED_HEADERS": ["Content-Type", "set-cookie", "Authorization"]}), "W003")
    assert isinstance(message, Warning)
    assert "authorization, set-cookie" in message.msg


def test_e009_redis_failure_mode() -> None:
    assert isinstance(only(run({"REDIS_FAILURE_MODE": "ignore"}), "E009"), Error)


def test_e010_hybrid_db_check() -> None:
    assert isinstance(only(run({"HYBRID_DB_CHECK": "never"}), "E010"), Error)


@pytest.mark.parametrize("value", [0, -5, "soon", float("nan"), True])
def test_e060_hybrid_redis_ttl_is_none_or_positive(value: object) -> None:
    assert isinstance(only(run({"HYBRID_REDIS_TTL": value}), "E060"), Error)


def test_e061_hybrid_redis_ttl_is_at_most_ttl() -> None:
    message = only(run({"TTL": 3600, "HYBRID_REDIS_TTL": 7200}), "E061")
    assert isinstance(message, Error) and "7200" in message.msg and "3600" in message.msg
    assert run({"TTL": 3600, "HYBRID_REDIS_TTL": 3600}) == []
    assert run({"TTL": 3600, "HYBRID_REDIS_TTL": 300.5}) == []
    assert run({"HYBRID_REDIS_TTL": None}) == []


def test_e011_redis_strategies_need_a_redis() -> None:
    message = only(run({"STRATEGY": "redis"}), "E011")
    assert "REDIS_URL" in message.msg
    assert run({"STRATEGY": "redis", "REDIS_URL": "redis://127.0.0.1:6379/15"}) == []


def test_redis_strategies_without_a_redis_raise_improperly_configured() -> None:
    """What E011 reports is raised by the Redis client factory as an ``ImproperlyConfigured``."""
    from django_idempotency.strategies.redis.store import get_client

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
        "idem": {"BACKEND": backend, "LOCATION": "redis://127.0.0.1:6379/15?socket_timeout=0.25"},
    }
    with override_settings(CACHES=caches):
        assert run({"STRATEGY": "redis", "REDIS_CACHE_ALIAS": "idem"}) == []


def test_every_check_id_is_tested_here() -> None:
    import re
    from pathlib import Path

    import django_idempotency.checks as checks
    import django_idempotency.errors as errors

    modules = [*Path(checks.__file__).parent.glob("*.py"), Path(errors.__file__)]
    source = "".join(path.read_text() for path in modules)
    declared = set(re.findall(r'id=ID \+ "([EW]\d{3})"', source))
    declared |= set(re.findall(r"django_idempotency\.(E\d{3}): ", source))
    declared |= {s.rule.id for s in SETTINGS.values() if s.rule is not None}  # conf's rules
    tests = [
        Path(__file__),
        Path(__file__).parent / "test_partitions.py",
        Path(__file__).parent / "test_urls.py",
        Path(__file__).parent / "test_stores.py",
        Path(__file__).parents[1] / "test_middleware.py",
    ]
    tested = {t for path in tests for t in re.findall(r"def test_([ew]\d{3})_", path.read_text())}
    assert declared, "no check ids found in django_idempotency/checks/"
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
    from django_idempotency.checks.urls import check_drf_function_views

    with override_settings(ROOT_URLCONF=urlconf):
        return check_drf_function_views()


def test_idempotent_inside_api_view_passes_without_atomic_requests() -> None:
    """``@idempotent`` below ``@api_view`` claims after DRF's authentication and stores
    the response as DRF renders it (tests/test_drf.py)."""
    assert "django_idempotency.E020" not in ids(url_messages("tests.test_drf"))


def test_e020_idempotent_inside_api_view_under_atomic_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ATOMIC_REQUESTS on the keys' database the request's transaction, which
    ``@idempotent`` below ``@api_view`` cannot leave, holds the claim and the stored
    response until the end of the request; ``@transaction.non_atomic_requests`` above
    ``@api_view`` lets it out."""
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    message = only(url_messages("tests.test_drf"), "E020")
    assert isinstance(message, Error)
    assert "'inside/'" in message.msg and "ATOMIC_REQUESTS" in message.msg
    assert "idempotent_api_view" in (message.hint or "")
    assert "non_atomic_requests" in (message.hint or "")
    with override_settings(IDEMPOTENCY={"DATABASE": "sqlite"}):  # not the keys' database
        assert "django_idempotency.E020" not in ids(url_messages("tests.test_drf"))


def test_e021_idempotent_outside_api_view() -> None:
    """A construct that can never work with DRF's authentication is an error, with the fix."""
    message = only(url_messages("tests.test_drf"), "E021")
    assert isinstance(message, Error)
    assert "outside" in message.msg and "'outside/'" in message.msg
    assert "credentials-not-authenticated" in message.msg
    assert "@idempotent_api_view(...)" in (message.hint or "")
    with (
        override_settings(ROOT_URLCONF="tests.test_drf"),
        pytest.raises(SystemCheckError, match="E021"),
    ):
        call_command("check")


def test_the_supported_drf_function_views_pass_the_url_check() -> None:
    # The test URLconf has @idempotent_api_view views, mixin views and plain views.
    assert url_messages("tests.testapp.urls") == []
    # and the test module's URLconf names its wrong order only
    assert ids(url_messages("tests.test_drf")) == ["django_idempotency.E021"]


@pytest.mark.parametrize("header", ["", "Idempotency Key", "Idem:Key", None, 5, "Clé"])
def test_e014_header_must_be_a_header_name(header: Any) -> None:
    message = only(run({"HEADER": header}), "E014")
    assert isinstance(message, Error)
    assert repr(header) in message.msg


def test_e014_accepts_header_names() -> None:
    assert run({"HEADER": "X-Request-Key"}) == []


@pytest.mark.parametrize("name", BOOLEAN_SETTINGS)
@pytest.mark.parametrize("value", ["False", 0, None, "yes"])
def test_e015_booleans_must_be_true_or_false(name: str, value: Any) -> None:
    message = only(run({name: value}), "E015")
    assert name in message.msg and repr(value) in message.msg


@pytest.mark.parametrize("value", [-1, "soon", 1.5, float("nan"), True])
def test_e016_retry_after(value: Any) -> None:
    assert isinstance(only(run({"RETRY_AFTER": value}), "E016"), Error)


def test_e016_accepts_none_and_whole_seconds() -> None:
    assert run({"RETRY_AFTER": None}) == run({"RETRY_AFTER": 0}) == run({"RETRY_AFTER": 3}) == []


@pytest.mark.parametrize(
    "value", ["", 42, ["idempotency_key"], "idempotency\nkey", "k" * 256, b"idempotency_key"]
)
def test_e022_key_body_field_must_name_a_json_field(value: Any) -> None:
    """Anything else never matches a body's field, and every key sent there is ignored;
    the process does not start with it."""
    message = only(run({"KEY_BODY_FIELD": value}), "E022")
    assert isinstance(message, Error) and "KEY_BODY_FIELD" in message.msg
    with (
        override_settings(IDEMPOTENCY={"KEY_BODY_FIELD": value}),
        pytest.raises(ImproperlyConfigured, match=r"django_idempotency\.E022"),
    ):
        ensure_valid()


@pytest.mark.parametrize("value", [None, "idempotency_key", "Idempotency Key", "k" * 255])
def test_e022_accepts_none_and_field_names(value: Any) -> None:
    assert run({"KEY_BODY_FIELD": value}) == []


@pytest.mark.parametrize("name", NAME_LIST_SETTINGS)
@pytest.mark.parametrize("value", ["Set-Cookie", 5, [""], [None]])
def test_e017_header_and_cookie_lists(name: str, value: Any) -> None:
    """A string would be read as its letters: NEVER_STORED_HEADERS = "Set-Cookie" would
    store and replay cookies."""
    message = only(run({name: value}), "E017")
    assert name in message.msg


@pytest.mark.parametrize("name", ["SCOPE_FUNCTION", "PROBLEM_RENDERER"])
@pytest.mark.parametrize(
    "path", ["no.such.function", "tests.checks.test_settings.NOT_THERE", 5, "x"]
)
def test_e018_dotted_paths_of_callables(name: str, path: Any) -> None:
    message = only(run({name: path}), "E018")
    assert name in message.msg


def test_e018_accepts_an_importable_callable() -> None:
    assert run({"SCOPE_FUNCTION": "tests.checks.test_settings.ids"}) == []


@pytest.mark.parametrize("size", [0, -1, 2.5, "many", None])
def test_e019_outbox_batch_size(size: Any) -> None:
    assert isinstance(only(run({"OUTBOX_BATCH_SIZE": size}), "E019"), Error)


@pytest.mark.postgres
def test_w014_advisory_lock_waits_at_most_lock_timeout() -> None:
    message = only(run({"STRATEGY": "advisory_lock", "WAIT": 30, "LOCK_TIMEOUT": 10}), "W014")
    assert isinstance(message, Warning)
    assert run({"STRATEGY": "advisory_lock", "WAIT": 10, "LOCK_TIMEOUT": 10}) == []
    assert run({"STRATEGY": "db", "WAIT": 30, "LOCK_TIMEOUT": 10}) == []


@pytest.mark.postgres
def test_w015_nothing_bounds_a_hung_postgresql() -> None:
    message = only(run({"DATABASE_TIMEOUT": None}), "W015")
    assert isinstance(message, Warning)
    assert run({"DATABASE_TIMEOUT": 5}) == []
    assert run({}) == []  # the default bounds it
    assert run({"DATABASE_TIMEOUT": None, "DATABASE": "sqlite"}) == []


@pytest.mark.parametrize("value", [0, -1, "soon"])
def test_e002_database_timeout(value: Any) -> None:
    assert isinstance(only(run({"DATABASE_TIMEOUT": value}), "E002"), Error)


# -- enforcement: the checks' errors are raised at start-up and on first use ------------------

#: One value of every setting the checks call an error.
INVALID_SETTINGS: list[Any] = [
    ["STRATEGY", "db"],
    {"LOCK_TIMEOUT": -5},
    {"LOCK_TIMEOUT": 0},
    {"TTL": 0},
    {"MAX_STORED_BODY_SIZE": -1},
    {"LOCK_TIMEOUT": float("nan")},
    {"REDIS_SOCKET_TIMEOUT": 0},
    {"LOCK_TIMEOUT": 10, "HEARTBEAT_INTERVAL": 10},
    {"HEARTBEAT_INTERVAL": -1},
    {"METHODS": "POST"},
    {"DATABASE": "nowhere"},
    {"STRATEGY": "no_such_strategy"},
    {"STRATEGY": "advisory_lock", "DATABASE": "sqlite"},
    {"STRATEGY": "redis"},
    {"STRATEGY": "hybrid", "REDIS_CACHE_ALIAS": "default"},
    {"REDIS_FAILURE_MODE": "ignore"},
    {"HYBRID_DB_CHECK": "never"},
    {"WAIT": -1},
    {"WAIT_POLL_INTERVAL": 0},
    {"WAIT_MAX_WAITERS": 0},
    {"HEADER": ""},
    {"ATOMIC": "False"},
    {"RETRY_AFTER": "soon"},
    {"NEVER_STORED_HEADERS": "Set-Cookie"},
    {"CREDENTIAL_HEADERS": "Authorization"},
    {"SCOPE_FUNCTION": "no.such.function"},
    {"OUTBOX_BATCH_SIZE": 0},
]


@pytest.mark.parametrize("idempotency", INVALID_SETTINGS, ids=repr)
def test_every_error_is_raised_on_first_use_with_the_checks_message(idempotency: Any) -> None:
    with override_settings(IDEMPOTENCY=idempotency):
        errors = [m for m in check_settings() if m.is_serious()]
        assert errors, "not an error for the checks"
        with pytest.raises(InvalidConfiguration) as info:
            ensure_valid()
        assert str(info.value) == "\n".join(error_text(m) for m in errors)
        assert str(info.value).startswith(f"{errors[0].id}: {errors[0].msg} HINT: ")
        assert isinstance(info.value, ImproperlyConfigured)
        with pytest.raises(InvalidConfiguration):  # every time, not just once
            ensure_valid()
    ensure_valid()  # the test settings again


def test_a_middleware_setting_is_enforced_where_the_middleware_is_used() -> None:
    from django.conf import settings

    with_middleware = [*settings.MIDDLEWARE, "django_idempotency.middleware.IdempotencyMiddleware"]
    with (
        override_settings(MIDDLEWARE=with_middleware, IDEMPOTENCY={"MIDDLEWARE_DEFAULT": "All"}),
        pytest.raises(InvalidConfiguration, match=r"^django_idempotency\.E101: "),
    ):
        ensure_valid()
    with override_settings(IDEMPOTENCY={"MIDDLEWARE_DEFAULT": "All"}):
        ensure_valid()  # not in MIDDLEWARE: not used


def test_warnings_are_not_enforced() -> None:
    with override_settings(IDEMPOTENCY={"TTL": 10, "LOCK_TIMEOUT": 60, "LOCK_TIMEOUTS": 1}):
        assert set(ids(check_settings())) == {"django_idempotency.W001", "django_idempotency.W002"}
        ensure_valid()


@pytest.mark.django_db
def test_no_request_runs_the_view_under_an_error() -> None:
    """The issue's case: with LOCK_TIMEOUT = -5 every duplicate would find the live lease
    stale and take it over. The request path refuses before any claim."""
    from django.test import RequestFactory

    from django_idempotency.models import IdempotencyKey
    from django_idempotency.protocol.engine import handle

    from ..testapp.models import SideEffect

    def view() -> Any:
        SideEffect.objects.create(label="charged")
        raise AssertionError("the view ran")

    request = RequestFactory().post("/pay/", HTTP_IDEMPOTENCY_KEY="k-invalid")
    request.user = AnonymousUser()
    with (
        override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": -5}),
        pytest.raises(InvalidConfiguration, match=r"^django_idempotency\.E002: "),
    ):
        handle(request, view)
    assert not SideEffect.objects.exists()
    assert not IdempotencyKey.objects.exists()


def test_the_strategy_loaders_error_is_the_checks_message() -> None:
    with override_settings(IDEMPOTENCY={"STRATEGY": "no_such_strategy"}):
        (message,) = [m for m in check_settings() if m.id == "django_idempotency.E006"]
    with pytest.raises(ImproperlyConfiguredStrategy) as info:
        load_strategy("no_such_strategy")
    assert str(info.value) == error_text(message)


# -- a view's own options are validated where it declares them --------------------------------

#: Per-view options the checks would call an error as settings, with the id they get.
INVALID_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"lock_timeout": -5}, "E002"),
    ({"lock_timeout": 0}, "E002"),
    ({"ttl": float("inf")}, "E002"),
    ({"wait": -1}, "E013"),
    ({"methods": "POST"}, "E004"),
    ({"methods": ["FETCH"]}, "E004"),
    ({"required": "yes"}, "E015"),
    ({"strategy": "no_such_strategy"}, "E006"),
    ({"strategy": "advisory_lock"}, "E007"),  # the test database here is SQLite or PostgreSQL
    ({"strategy": "redis"}, "E011"),
]


def _expected(options: dict[str, Any], check_id: str) -> str:
    from django_idempotency.checks.settings import view_option_errors

    (message,) = view_option_errors("x", **options)
    assert message.id == f"django_idempotency.{check_id}"
    return check_id


def _declare_decorator(kind: str, options: dict[str, Any]) -> None:
    from django_idempotency.decorators import idempotency_opt_in, idempotent

    def pay(request: Any) -> Any:
        raise AssertionError

    decorator = {"idempotent": idempotent, "opt_in": idempotency_opt_in}[kind]
    decorator(**options)(pay)


def _declare_mixin(kind: str, options: dict[str, Any]) -> None:
    from rest_framework.views import APIView

    from django_idempotency.drf import idempotent_api_view
    from django_idempotency.mixins import IdempotencyMixin

    attrs = {f"idempotency_{name}": value for name, value in options.items()}
    if kind == "mixin":
        type("Pay", (IdempotencyMixin, APIView), attrs)
    elif kind == "as_view":
        view_class: Any = type("Pay", (IdempotencyMixin, APIView), {})
        view_class.as_view(**attrs)
    else:
        idempotent_api_view(["POST"], **options)(lambda request: None)


@pytest.mark.parametrize("kind", ["idempotent", "opt_in", "mixin", "as_view", "api_view"])
@pytest.mark.parametrize(("options", "check_id"), INVALID_OPTIONS, ids=repr)
def test_a_views_invalid_option_is_refused_where_it_is_declared(
    kind: str, options: dict[str, Any], check_id: str
) -> None:
    if options.get("strategy") == "advisory_lock" and connections["default"].vendor != "sqlite":
        options, check_id = {"strategy": "redis"}, "E011"
    _expected(options, check_id)
    declare = _declare_decorator if kind in {"idempotent", "opt_in"} else _declare_mixin
    with pytest.raises(InvalidConfiguration) as info:
        declare(kind, options)
    text = str(info.value)
    assert text.startswith(f"django_idempotency.{check_id}: ")
    assert " HINT: " in text
    if kind in {"idempotent", "opt_in"}:
        assert "pay" in text or check_id in {"E006", "E007", "E011"}


@pytest.mark.parametrize("kind", ["idempotent", "opt_in", "mixin", "as_view", "api_view"])
def test_valid_view_options_are_accepted(kind: str) -> None:
    options = {"lock_timeout": 5, "ttl": 60, "wait": 0, "methods": ["post"], "required": True}
    declare = _declare_decorator if kind in {"idempotent", "opt_in"} else _declare_mixin
    declare(kind, {**options, "strategy": "db"})


# -- several databases (the run-time refusal: tests/protocol/test_writeguard.py) ---------------

ROUTERS = "tests.support.routers."


def routing(idempotency: Any, routers: list[str]) -> list[CheckMessage]:
    from django_idempotency.checks.routing import check_database_routing

    with override_settings(IDEMPOTENCY=idempotency, DATABASE_ROUTERS=routers):
        return check_database_routing()


def test_e030_writes_routed_away_from_the_keys() -> None:
    message = only(routing({"DATABASE": "keys"}, [ROUTERS + "KeysApart"]), "E030")
    assert isinstance(message, Error)
    assert "'default'" in message.msg and "'keys'" in message.msg
    assert "UNPROTECTED_DATABASES" in (message.hint or "")
    declared = {"DATABASE": "keys", "UNPROTECTED_DATABASES": ["default"]}
    assert routing(declared, [ROUTERS + "KeysApart"]) == []
    assert routing({}, []) == []  # one database for everything


def test_w030_the_librarys_models_routed_elsewhere() -> None:
    message = only(routing({}, [ROUTERS + "KeysApart"]), "W030")
    assert isinstance(message, Warning)
    assert "IdempotencyKey" in message.msg


def test_w031_atomic_requests_on_an_unprotected_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared = {"UNPROTECTED_DATABASES": ["sqlite"]}
    assert routing(declared, [ROUTERS + "TestAppOnSqlite"]) == []
    monkeypatch.setitem(connections["sqlite"].settings_dict, "ATOMIC_REQUESTS", True)
    message = only(routing(declared, [ROUTERS + "TestAppOnSqlite"]), "W031")
    assert isinstance(message, Warning)


@pytest.mark.parametrize("value", [["nowhere"], "sqlite", [None], 3])
def test_e031_unprotected_databases_not_a_list_of_aliases(value: Any) -> None:
    message = only(run({"UNPROTECTED_DATABASES": value}), "E031")
    assert isinstance(message, Error)
    assert run({"UNPROTECTED_DATABASES": ["sqlite"]}) == []


def test_e032_the_keys_database_listed_as_unprotected() -> None:
    message = only(run({"DATABASE": "sqlite", "UNPROTECTED_DATABASES": ["sqlite"]}), "E032")
    assert isinstance(message, Error)


# -- sharded key databases (the request path: tests/protocol/test_shards.py) ------------------

KEY_SHARDS = ["default", "keys"]


def shard_messages(messages: list[CheckMessage], check_id: str) -> list[CheckMessage]:
    """The messages of ``check_id``; each must carry a hint."""
    hits = [m for m in messages if m.id == f"django_idempotency.{check_id}"]
    assert all(m.hint for m in hits), f"{check_id} has no hint"
    return hits


@pytest.mark.parametrize(
    ("value", "word"),
    [("default", "list"), ([], "non-empty"), ([1], "list"), (["default", "nowhere"], "nowhere")],
)
def test_e035_key_databases_not_a_list_of_aliases(settings: Any, value: Any, word: str) -> None:
    settings.IDEMPOTENCY = {"KEY_DATABASES": value, "DATABASE_ROUTING": "router"}
    hits = shard_messages(check_settings(), "E035")
    assert len(hits) == 1 and isinstance(hits[0], Error)
    assert word in hits[0].msg
    with pytest.raises(InvalidConfiguration, match="E035"):
        ensure_valid()


def test_e036_key_databases_without_database(settings: Any) -> None:
    settings.IDEMPOTENCY = {"KEY_DATABASES": ["keys"], "DATABASE_ROUTING": "router"}
    hits = shard_messages(check_settings(), "E036")
    assert len(hits) == 1 and isinstance(hits[0], Error) and "'default'" in hits[0].msg


def test_w032_several_key_databases_without_routing(settings: Any) -> None:
    settings.IDEMPOTENCY = {"KEY_DATABASES": KEY_SHARDS}
    hits = shard_messages(check_settings(), "W032")
    assert len(hits) == 1 and isinstance(hits[0], Warning)


@pytest.mark.parametrize(
    "value", ["routers", "tests.testapp.tenants.nothing_here", "tests.testapp.tenants.TENANTS", 3]
)
def test_e037_database_routing_neither_router_nor_a_callable(settings: Any, value: Any) -> None:
    settings.IDEMPOTENCY = {"KEY_DATABASES": KEY_SHARDS, "DATABASE_ROUTING": value}
    hits = shard_messages(check_settings(), "E037")
    assert len(hits) == 1 and isinstance(hits[0], Error) and repr(value) in hits[0].msg


def test_w033_wait_listen_database_with_several_key_databases(settings: Any) -> None:
    settings.IDEMPOTENCY = {
        "KEY_DATABASES": KEY_SHARDS,
        "DATABASE_ROUTING": "router",
        "WAIT_LISTEN_DATABASE": "default",
    }
    hits = shard_messages(check_settings(), "W033")
    assert len(hits) == 1 and isinstance(hits[0], Warning)


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


def test_e092_the_completer_needs_steps() -> None:
    from django_idempotency.checks.settings import view_option_errors

    (message,) = view_option_errors("pay", completer=True)
    assert message.id == "django_idempotency.E092"
    assert "steps=True" in (message.hint or "")
    assert view_option_errors("pay", completer=True, steps=True) == []
    assert view_option_errors("pay", completer=False) == []
    (invalid,) = view_option_errors("pay", completer="yes", steps=True)
    assert invalid.id == "django_idempotency.E015"


@pytest.mark.parametrize("value", [-1, "soon", float("nan"), True])
def test_e093_completer_after_is_seconds_of_at_least_zero(value: Any) -> None:
    message = only(run({"COMPLETER_AFTER": value}), "E093")
    assert "COMPLETER_AFTER" in message.msg
    assert not [m for m in run({"COMPLETER_AFTER": 0}) if m.id == "django_idempotency.E093"]


@pytest.mark.parametrize("value", [0, 2.5, "3", True])
def test_e094_completer_attempts_is_a_whole_number_of_at_least_one(value: Any) -> None:
    message = only(run({"COMPLETER_ATTEMPTS": value}), "E094")
    assert "COMPLETER_ATTEMPTS" in message.msg
    assert not [m for m in run({"COMPLETER_ATTEMPTS": 1}) if m.id == "django_idempotency.E094"]


@pytest.mark.parametrize("value", [0, -3600, "a day", float("inf"), True])
def test_e095_downstream_key_lifetime_is_positive_seconds_or_none(value: Any) -> None:
    message = only(run({"DOWNSTREAM_KEY_LIFETIME": value}), "E095")
    assert "DOWNSTREAM_KEY_LIFETIME" in message.msg
    for valid in (None, 3600, 2.5):
        found = run({"DOWNSTREAM_KEY_LIFETIME": valid})
        assert not [m for m in found if m.id == "django_idempotency.E095"]


def test_e090_a_view_in_steps_under_a_strategy_that_cannot_run_them() -> None:
    from django_idempotency.checks.settings import view_option_errors

    with override_settings(IDEMPOTENCY={"REDIS_URL": "redis://127.0.0.1:6379/15"}):
        (message,) = view_option_errors("pay", steps=True, strategy="redis")
        assert message.id == "django_idempotency.E090"
        assert "'redis'" in message.msg and "db, advisory_lock" in (message.hint or "")
        assert view_option_errors("pay", steps=True) == []  # the setting's: db
        assert view_option_errors("pay", steps=False, strategy="redis") == []
    with override_settings(IDEMPOTENCY={"STRATEGY": "hybrid", "REDIS_URL": "redis://x"}):
        # The setting's strategy may change after the view is declared: its requests are
        # answered 503 then (tests/protocol/test_steps.py), the declaration is not refused.
        assert view_option_errors("pay", steps=True) == []
    (invalid,) = view_option_errors("pay", steps="yes")
    assert invalid.id == "django_idempotency.E015"
