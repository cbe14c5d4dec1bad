"""The deploy check of how a new connection to a PostgreSQL key database is bounded (W016)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Warning, run_checks

from django_idempotency.checks.stores import check_connect_timeout

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
