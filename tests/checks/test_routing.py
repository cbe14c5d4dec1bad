"""The checks of sharded key databases (django_idempotency.checks.routing): KEY_DATABASES
(E035, E036, W032), DATABASE_ROUTING (E037), WAIT_LISTEN_DATABASE with shards (W033), and
E030, E032, W030 and the strategy's database checks over every key database. The request
path on two real databases is in tests/protocol/test_shards.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import CheckMessage
from django.db import connections

from django_idempotency.checks.routing import check_database_routing
from django_idempotency.checks.settings import check_settings, ensure_valid
from django_idempotency.checks.urls import check_drf_function_views

SHARDS = ["default", "keys"]
TENANT_ROUTER = "tests.testapp.tenants.TenantRouter"


def found(messages: list[CheckMessage], check_id: str) -> list[CheckMessage]:
    hits = [m for m in messages if m.id == f"django_idempotency.{check_id}"]
    assert all(m.hint for m in hits), f"{check_id} has no hint"
    return hits


def ids(messages: list[CheckMessage]) -> list[str]:
    return [m.id or "" for m in messages]


@pytest.mark.parametrize(
    "idempotency",
    [
        {"KEY_DATABASES": SHARDS, "DATABASE_ROUTING": "router"},
        {"KEY_DATABASES": SHARDS, "DATABASE_ROUTING": "tests.testapp.tenants.tenant_database"},
        {"KEY_DATABASES": ["keys", "default"], "DATABASE_ROUTING": "router"},
        {"KEY_DATABASES": ["default"]},
        {"KEY_DATABASES": ["keys"], "DATABASE": "keys"},
        {"DATABASE_ROUTING": "router"},
    ],
)
def test_good_shard_settings_are_quiet(settings: Any, idempotency: Any) -> None:
    settings.IDEMPOTENCY = idempotency
    assert check_settings() == []
    ensure_valid()


def test_no_key_database_may_be_unprotected(settings: Any) -> None:
    settings.IDEMPOTENCY = {
        "KEY_DATABASES": SHARDS,
        "DATABASE_ROUTING": "router",
        "UNPROTECTED_DATABASES": ["keys"],
    }
    hits = found(check_settings(), "E032")
    assert len(hits) == 1 and "'keys'" in hits[0].msg


def test_the_strategy_is_checked_on_every_key_database(settings: Any) -> None:
    settings.IDEMPOTENCY = {
        "STRATEGY": "advisory_lock",
        "KEY_DATABASES": ["default", "sqlite"],
        "DATABASE_ROUTING": "router",
    }
    if connections["default"].vendor != "postgresql":
        pytest.skip("needs PostgreSQL on default")
    hits = found(check_settings(), "E007")
    assert len(hits) == 1 and "'sqlite'" in hits[0].msg


@pytest.mark.postgres
def test_writes_routed_to_any_key_database_are_no_e030(settings: Any) -> None:
    """The tenant router sends writes to each shard; with both listed as key databases
    that is the design, not E030 (and this app's own models there are no W030)."""
    settings.DATABASE_ROUTERS = ["tests.support.routers.EverythingOnKeys"]
    settings.IDEMPOTENCY = {"KEY_DATABASES": SHARDS, "DATABASE_ROUTING": "router"}
    assert check_database_routing() == []
    settings.IDEMPOTENCY = {}
    assert {"django_idempotency.E030", "django_idempotency.W030"} <= set(
        ids(check_database_routing())
    )


def test_atomic_requests_on_any_key_database_is_checked(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E020 (``@idempotent`` inside ``@api_view``) looks at every key database."""
    settings.IDEMPOTENCY = {"KEY_DATABASES": SHARDS, "DATABASE_ROUTING": "router"}
    monkeypatch.setitem(connections["keys"].settings_dict, "ATOMIC_REQUESTS", True)
    settings.ROOT_URLCONF = "tests.checks.test_routing"
    hits = found(check_drf_function_views(), "E020")
    assert len(hits) == 1 and "'keys'" in hits[0].msg


def _inside_api_view() -> Any:
    from django.http import HttpRequest
    from rest_framework.decorators import api_view
    from rest_framework.response import Response

    from django_idempotency.decorators import idempotent

    @api_view(["POST"])
    @idempotent
    def view(request: HttpRequest) -> Response:
        return Response()

    return view


def _urlpatterns() -> list[Any]:
    from django.urls import path

    return [path("inside/", _inside_api_view())]


urlpatterns = _urlpatterns()
