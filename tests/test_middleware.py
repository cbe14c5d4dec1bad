"""``IdempotencyMiddleware`` through the test clients, sync and async stacks (the views of
docs/middleware.md), and its system checks. Races under uvicorn: tests/system/test_asgi_race.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core import checks
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.checks.middleware import PATH, validate_middleware_settings
from django_idempotency.checks.urls import check_middleware
from django_idempotency.decorators import idempotency_exempt, idempotency_opt_in
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.replay import REPLAYED_HEADER
from example_project.payments.models import Charge

from .support.assertions import assert_problem
from .support.factories import UserFactory
from .support.threads import in_background
from .support.waiting import wait_until
from .testapp.models import SideEffect

pytestmark = pytest.mark.django_db

CHARGE = {"amount": 700, "currency": "EUR"}
WITH_MIDDLEWARE = [*settings.MIDDLEWARE, PATH]


def _client(kind: str) -> Any:
    c = AsyncClient() if kind == "async" else Client()
    c.force_login(UserFactory())
    return c


def post(c: Any, url: str, data: Any = CHARGE, key: str | None = "k1") -> Any:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return (async_to_sync(c.post) if isinstance(c, AsyncClient) else c.post)(
        url, json.dumps(data), "application/json", headers=headers
    )


STACKS = ["sync", "async"]


@override_settings(MIDDLEWARE=WITH_MIDDLEWARE)
@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("url", ["/t/mw/charge/", "/t/mw/acharge/"])
def test_opted_in_views_replay(stack: str, url: str) -> None:
    c = _client(stack)
    first = post(c, url)
    assert first.status_code == 201 and REPLAYED_HEADER not in first
    second = post(c, url)
    assert second.status_code == 201 and second[REPLAYED_HEADER] == "true"
    assert second.content == first.content
    assert_problem(post(c, url, {"amount": 1, "currency": "EUR"}), 422, "key-reused")
    assert Charge.objects.count() == 1


@override_settings(MIDDLEWARE=WITH_MIDDLEWARE)
@pytest.mark.parametrize("stack", STACKS)
def test_options_of_the_opt_in(stack: str) -> None:
    c = _client(stack)
    assert_problem(post(c, "/t/mw/charge/", key=None), 400, "missing-key")  # required=True
    assert post(c, "/t/mw/acharge/", key=None).status_code == 201  # optional
    assert post(c, "/t/mw/acharge/", key=None).status_code == 201
    assert Charge.objects.count() == 2 and not IdempotencyKey.objects.exists()


@override_settings(MIDDLEWARE=WITH_MIDDLEWARE)
@pytest.mark.parametrize("default", ["opt_in", "all"])
@pytest.mark.parametrize("stack", STACKS)
def test_unmarked_and_exempt_views(stack: str, default: str) -> None:
    with override_settings(IDEMPOTENCY={"MIDDLEWARE_DEFAULT": default}):
        c = _client(stack)
        first = post(c, "/t/mw/unmarked/")
        second = post(c, "/t/mw/unmarked/")
        assert (REPLAYED_HEADER in second) is (default == "all")
        assert Charge.objects.count() == (1 if default == "all" else 2)
        charge = Charge.objects.order_by("pk").first()
        assert charge is not None and json.loads(first.content)["id"] == charge.pk
        for _ in range(2):
            assert post(c, "/t/mw/webhook/", {"id": charge.pk}).status_code == 200
        assert IdempotencyKey.objects.count() == (1 if default == "all" else 0)


@override_settings(MIDDLEWARE=WITH_MIDDLEWARE, IDEMPOTENCY={"MIDDLEWARE_DEFAULT": "all"})
@pytest.mark.parametrize("stack", STACKS)
def test_views_that_handle_the_protocol_are_not_handled_twice(stack: str) -> None:
    """A DRF view with the mixin and an @idempotent view claim their key once: a second
    claim of the same key by the middleware would answer 409 in progress."""
    for url in ["/t/drf/", "/t/fn/"]:
        c = _client(stack)
        first = post(c, url, {"status": 201}, key="once")
        assert first.status_code == 201 and REPLAYED_HEADER not in first, first.content
        assert post(c, url, {"status": 201}, key="once")[REPLAYED_HEADER] == "true"
    assert SideEffect.objects.count() == 2
    assert IdempotencyKey.objects.count() == 2


#: Set when ``slow_charge`` starts: the duplicate is sent only then.
slow_charge_started = threading.Event()
#: Set by the test once the duplicate waits: ``slow_charge`` answers only then.
slow_charge_released = threading.Event()


@idempotency_opt_in(wait=60)
def slow_charge(request: Any) -> Any:
    from django.http import JsonResponse

    slow_charge_started.set()
    slow_charge_released.wait(60)
    label = request.headers["Idempotency-Key"]
    return JsonResponse({"id": SideEffect.objects.create(label=label).pk}, status=201)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.urls(__name__)
@override_settings(MIDDLEWARE=WITH_MIDDLEWARE)
def test_the_opt_in_takes_a_wait() -> None:
    """``@idempotency_opt_in(wait=...)``: a duplicate sent while the first request runs
    waits for its answer and replays it, instead of a 409."""
    user = UserFactory()

    def send() -> Any:
        c = Client()
        c.force_login(user)
        return post(c, "/slow/", key="waited")

    from django_idempotency.strategies import waiting

    slow_charge_started.clear()
    slow_charge_released.clear()
    first = in_background(send)
    try:
        assert slow_charge_started.wait(60), "the first request's view never ran"
        waiter = in_background(send)  # while the first request's view runs
        wait_until(lambda: waiting.slots.taken >= 1, timeout=60)  # it waits
    finally:
        slow_charge_released.set()
    duplicate = waiter.result()
    answer = first.result()
    assert answer.status_code == 201 and REPLAYED_HEADER not in answer
    assert duplicate.status_code == 201 and duplicate[REPLAYED_HEADER] == "true"
    assert duplicate.content == answer.content
    assert SideEffect.objects.filter(label="waited").count() == 1


# -- checks -------------------------------------------------------------------------------------


class PlainDRFView(APIView):
    def post(self, request: Any) -> Response:
        return Response(status=201)


urlpatterns = [
    path("plain/", PlainDRFView.as_view()),
    path("opted/", idempotency_opt_in(PlainDRFView.as_view())),
    path("exempt/", idempotency_exempt(PlainDRFView.as_view())),
    path("slow/", slow_charge),
]


def ids(**settings_: Any) -> list[str]:
    with override_settings(**settings_):
        messages = [*validate_middleware_settings(), *check_middleware()]
        return [m.id or "" for m in messages]


def test_e102_a_drf_view_opted_in_to_the_middleware() -> None:
    """DRF authenticates after every middleware: the middleware cannot protect a DRF view,
    and one marked @idempotency_opt_in is an error."""
    assert ids(MIDDLEWARE=WITH_MIDDLEWARE, ROOT_URLCONF=__name__) == ["django_idempotency.E102"]


def test_w101_drf_views_under_middleware_default_all() -> None:
    """With MIDDLEWARE_DEFAULT "all", every DRF view without the mixin is a warning."""
    drf = ids(
        MIDDLEWARE=WITH_MIDDLEWARE,
        ROOT_URLCONF=__name__,
        IDEMPOTENCY={"MIDDLEWARE_DEFAULT": "all"},
    )
    assert drf == ["django_idempotency.W101", "django_idempotency.E102"]


def test_no_checks_without_the_middleware() -> None:
    assert ids(IDEMPOTENCY={"MIDDLEWARE_DEFAULT": "nope"}) == []


def test_checks() -> None:
    assert ids(MIDDLEWARE=WITH_MIDDLEWARE) == []
    assert ids(MIDDLEWARE=WITH_MIDDLEWARE, IDEMPOTENCY={"MIDDLEWARE_DEFAULT": "x"}) == [
        "django_idempotency.E101"
    ]
    early = [PATH, *settings.MIDDLEWARE]  # before CsrfViewMiddleware and authentication
    assert set(ids(MIDDLEWARE=early)) == {"django_idempotency.E103", "django_idempotency.E104"}
    with override_settings(MIDDLEWARE=WITH_MIDDLEWARE):
        registered = [m.id for m in checks.run_checks()]
    assert not any(str(i).startswith("django_idempotency.E1") for i in registered)
