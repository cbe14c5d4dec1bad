"""The deploy checks of how a key database that hangs is bounded: a new PostgreSQL connection
(W016), a MariaDB reply (W017)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Warning, run_checks

from django_idempotency.checks.stores import check_connect_timeout, check_read_timeout

pytestmark = pytest.mark.postgres


def w016(monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]) -> list[Any]:
    """The W016 messages with the default database's OPTIONS set to ``options``."""
    from django.conf import settings

    monkeypatch.setitem(settings.DATABASES["default"], "OPTIONS", options)
    return [m for m in check_connect_timeout() if m.id == "django_idempotency.W016"]


def test_w016_a_new_connection_without_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    (message,) = w016(monkeypatch, {})
    assert isinstance(message, Warning) and "'default'" in message.msg
    assert message.hint and "connect_timeout" in message.hint
    assert w016(monkeypatch, {"connect_timeout": 5}) == []
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "5")  # libpq's default for every connection
    assert w016(monkeypatch, {}) == []


def test_w016_is_a_deploy_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reported by ``check --deploy`` only: a development database needs no bound."""
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    from django.conf import settings

    monkeypatch.setitem(settings.DATABASES["default"], "OPTIONS", {})
    ids = {m.id for m in run_checks(include_deployment_checks=True, tags=["idempotency_stores"])}
    assert "django_idempotency.W016" in ids
    assert "django_idempotency.W016" not in {m.id for m in run_checks()}


# -- W017: a key database whose driver waits for a reply for ever ------------------------------


def w017(settings: Any, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]) -> list[Any]:
    """The W017 messages with the keys on MariaDB, whose OPTIONS are set to ``options``."""
    settings.IDEMPOTENCY = {"DATABASE": "mariadb", "UNPROTECTED_DATABASES": ["default"]}
    monkeypatch.setitem(settings.DATABASES["mariadb"], "OPTIONS", options)
    return [m for m in check_read_timeout() if m.id == "django_idempotency.W017"]


@pytest.mark.mariadb
def test_w017_a_mariadb_key_database_without_read_timeout(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (message,) = w017(settings, monkeypatch, {"charset": "utf8mb4"})
    assert isinstance(message, Warning) and "'mariadb'" in message.msg
    assert message.hint and "read_timeout" in message.hint
    assert w017(settings, monkeypatch, {"read_timeout": 5}) == []


@pytest.mark.mariadb
def test_w017_is_a_deploy_check(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.IDEMPOTENCY = {"DATABASE": "mariadb", "UNPROTECTED_DATABASES": ["default"]}
    monkeypatch.setitem(settings.DATABASES["mariadb"], "OPTIONS", {})
    ids = {m.id for m in run_checks(include_deployment_checks=True, tags=["idempotency_stores"])}
    assert "django_idempotency.W017" in ids
    assert "django_idempotency.W017" not in {m.id for m in run_checks()}


def test_w017_not_where_database_timeout_cuts_or_nothing_hangs(settings: Any) -> None:
    """PostgreSQL (``DATABASE_TIMEOUT`` cuts the connection) and SQLite (a file) need none."""
    for alias in ("default", "sqlite"):
        settings.IDEMPOTENCY = {"DATABASE": alias}
        assert [m for m in check_read_timeout() if m.id == "django_idempotency.W017"] == []
