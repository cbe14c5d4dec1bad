"""E091: a view of the URLconf with steps and no strategy of its own, under a ``STRATEGY``
setting that does not run steps, is an error at start-up instead of a 503 at each of its
requests (docs/steps.md#strategies)."""

from __future__ import annotations

from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.views import APIView

from django_idempotency.checks.urls import check_steps_under_the_setting
from django_idempotency.decorators import idempotency_opt_in, idempotent
from django_idempotency.mixins import IdempotencyMixin

from ..support.services import REDIS_URL


def _view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=201)


class Stepped(IdempotencyMixin, APIView):
    permission_classes = [AllowAny]
    idempotency_steps = True


urlpatterns = [
    path("fn/", idempotent(steps=True)(_view)),
    path("opt-in/", idempotency_opt_in(steps=True)(_view)),
    path("drf/", Stepped.as_view()),
    # Quiet: a strategy of their own, or no steps.
    path("own/", idempotent(steps=True, strategy="db")(_view)),
    path("drf-own/", Stepped.as_view(idempotency_strategy="advisory_lock")),
    path("drf-off/", Stepped.as_view(idempotency_steps=False)),
    path("plain/", idempotent(_view)),
]


@pytest.fixture
def urlconf(settings: Any) -> Any:
    settings.ROOT_URLCONF = __name__
    return settings


@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
def test_e091_views_with_steps_under_a_strategy_without_steps(urlconf: Any, strategy: str) -> None:
    urlconf.IDEMPOTENCY = {"STRATEGY": strategy, "REDIS_URL": REDIS_URL}
    messages = check_steps_under_the_setting()
    assert [m.id for m in messages] == ["django_idempotency.E091"] * 3
    assert [m.msg.split("'")[1] for m in messages] == ["fn/", "opt-in/", "drf/"]
    assert f"the STRATEGY setting, {strategy!r}" in messages[0].msg
    assert "db, advisory_lock" in (messages[0].hint or "")


@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
def test_a_strategy_that_runs_steps_is_quiet(urlconf: Any, strategy: str) -> None:
    urlconf.IDEMPOTENCY = {"STRATEGY": strategy}
    assert check_steps_under_the_setting() == []


def test_the_test_projects_urlconf_is_checked_too(settings: Any) -> None:
    """The views of the suite's URLconf (``@idempotent(steps=True)``, a mixin view)."""
    settings.IDEMPOTENCY = {"STRATEGY": "redis", "REDIS_URL": REDIS_URL}
    routes = {m.msg.split("'")[1] for m in check_steps_under_the_setting()}
    assert {"t/steps/", "t/steps/doomed/", "t/steps/drf/"} <= routes
