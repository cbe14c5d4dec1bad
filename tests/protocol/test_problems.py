"""``IDEMPOTENCY["PROBLEM_RENDERER"]`` is given the request, on every entry point and for
every kind of problem: the protocol's own (400 invalid-key, 409 request-in-progress, 422
key-reused) and the transient database conflict of the view's transaction (503).

The renderer records what it was called with; each request carries a probe header of its
own, so that the test knows the renderer got *that* request. DRF's entry points hand it
DRF's authenticated ``Request``; the others Django's ``HttpRequest``.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.db import OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.checks.middleware import PATH as MIDDLEWARE_PATH
from django_idempotency.decorators import idempotency_opt_in, idempotent
from django_idempotency.drf import idempotent_api_view
from django_idempotency.errors import IdempotencyError
from django_idempotency.mixins import IdempotencyMixin
from django_idempotency.protocol.problems import problem_json

from ..support.factories import UserFactory
from ..support.threads import in_background
from ..testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = "X-Probe"

#: (slug, request) per call of the renderer.
seen: list[tuple[str, Any]] = []
lock = threading.Lock()


def record(error: IdempotencyError, request: Any) -> HttpResponse:
    """The renderer under test: remembers its arguments, answers problem+json."""
    with lock:
        seen.append((error.slug, request))
    return problem_json(error)


entered = threading.Event()
opened = threading.Event()


def _work(label: str, payload: dict[str, Any]) -> int:
    """The views' body: hold (for the 409), fail with a transient conflict (for the 503),
    or write one SideEffect row."""
    if payload.get("hold"):
        entered.set()
        if not opened.wait(timeout=30):
            raise RuntimeError("the test never let the first request go on")
    if payload.get("conflict"):
        raise OperationalError("database is locked")
    SideEffect.objects.create(label=label)
    return SideEffect.objects.count()


def _payload(request: HttpRequest) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(request.body or b"{}")
    return data


class MixinView(IdempotencyMixin, APIView):
    def post(self, request: Request) -> Response:
        return Response({"n": _work("mixin", dict(request.data))}, status=201)


@idempotent_api_view(["POST"])
def api_view_function(request: Request) -> Response:
    return Response({"n": _work("api-view", dict(request.data))}, status=201)


@csrf_exempt
@idempotent
def sync_function(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"n": _work("sync", _payload(request))}, status=201)


@csrf_exempt
@idempotent
async def async_function(request: HttpRequest) -> JsonResponse:
    n = await sync_to_async(_work)("async", _payload(request))
    return JsonResponse({"n": n}, status=201)


@csrf_exempt
@idempotency_opt_in
def middleware_sync(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"n": _work("mw-sync", _payload(request))}, status=201)


@csrf_exempt
@idempotency_opt_in
async def middleware_async(request: HttpRequest) -> JsonResponse:
    n = await sync_to_async(_work)("mw-async", _payload(request))
    return JsonResponse({"n": n}, status=201)


urlpatterns = [
    path("mixin/", MixinView.as_view()),
    path("api-view/", api_view_function),
    path("sync/", sync_function),
    path("async/", async_function),
    path("mw-sync/", middleware_sync),
    path("mw-async/", middleware_async),
]


@dataclass(frozen=True)
class Entry:
    """One way of writing an idempotent view, and how a client reaches it."""

    name: str
    path: str
    drf: bool = False  # DRF authenticates the caller: a token, and DRF's Request
    asgi: bool = False  # through the async test client (an async handler stack)


ENTRIES = [
    Entry("drf-mixin", "/mixin/", drf=True),
    Entry("idempotent_api_view", "/api-view/", drf=True),
    Entry("idempotent-sync", "/sync/"),
    Entry("idempotent-async", "/async/"),
    Entry("idempotent-async-asgi", "/async/", asgi=True),
    Entry("middleware-sync", "/mw-sync/"),
    Entry("middleware-sync-asgi", "/mw-sync/", asgi=True),
    Entry("middleware-async-asgi", "/mw-async/", asgi=True),
]


@pytest.fixture(autouse=True)
def _renderer() -> Iterator[None]:
    seen.clear()
    entered.clear()
    opened.clear()
    with override_settings(
        ROOT_URLCONF=__name__,
        MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE_PATH],
        IDEMPOTENCY={"PROBLEM_RENDERER": f"{__name__}.record"},
    ):
        yield
    opened.set()


@pytest.fixture
def alice() -> Any:
    return UserFactory(username="alice")


def sender(entry: Entry, user: Any) -> Callable[..., tuple[int, str]]:
    """``send(key, body)`` -> (status, probe): one POST to the entry's view, with a probe
    header of its own; callable from any thread."""
    headers: dict[str, str] = {}
    if entry.drf:
        headers["Authorization"] = f"Token {user.auth_token.key}"

    def send(key: str, body: dict[str, Any]) -> tuple[int, str]:
        probe = uuid.uuid4().hex
        kwargs: dict[str, Any] = {
            "data": json.dumps(body),
            "content_type": "application/json",
            "headers": {**headers, "Idempotency-Key": key, PROBE: probe},
        }
        response: Any
        if entry.asgi:
            response = async_to_sync(AsyncClient().post)(entry.path, **kwargs)
        else:
            response = Client().post(entry.path, **kwargs)
        return response.status_code, probe

    return send


def renderer_request(probe: str, slug: str) -> Any:
    """The request the renderer was called with for the request that sent ``probe``."""
    with lock:
        calls = [(s, r) for s, r in seen if r is not None and r.headers.get(PROBE) == probe]
        missing = [s for s, r in seen if r is None]
    assert not missing, f"the renderer was called without a request for {missing}"
    assert [s for s, _ in calls] == [slug], seen
    return calls[0][1]


def assert_the_request(request: Any, entry: Entry, user: Any) -> None:
    if entry.drf:
        assert isinstance(request, Request)
        assert request.user == user  # DRF's authenticated request
    else:
        assert isinstance(request, HttpRequest)


def _invalid_key(send: Callable[..., tuple[int, str]]) -> tuple[int, str]:
    return send('"no-closing-quote', {"a": 1})


def _in_progress(send: Callable[..., tuple[int, str]]) -> tuple[int, str]:
    first = in_background(lambda: send("busy", {"hold": True}))
    assert entered.wait(timeout=30), "the first request never reached the view"
    try:
        answer = send("busy", {"hold": True})
    finally:
        opened.set()
    assert first.result()[0] == 201
    return answer


def _key_reused(send: Callable[..., tuple[int, str]]) -> tuple[int, str]:
    assert send("reused", {"a": 1})[0] == 201
    return send("reused", {"a": 2})


def _transient(send: Callable[..., tuple[int, str]]) -> tuple[int, str]:
    return send("conflict", {"conflict": True})


PROBLEMS = [
    pytest.param(_invalid_key, 400, "invalid-key", id="400-invalid-key"),
    pytest.param(_in_progress, 409, "request-in-progress", id="409-in-progress"),
    pytest.param(_key_reused, 422, "key-reused", id="422-key-reused"),
    pytest.param(_transient, 503, "transient-conflict", id="503-transient-conflict"),
]


@pytest.mark.parametrize(("provoke", "status", "slug"), PROBLEMS)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_the_renderer_gets_the_request(
    entry: Entry,
    provoke: Callable[[Callable[..., tuple[int, str]]], tuple[int, str]],
    status: int,
    slug: str,
    alice: Any,
) -> None:
    answer, probe = provoke(sender(entry, alice))
    assert answer == status
    request = renderer_request(probe, slug)
    assert_the_request(request, entry, alice)
    assert request.path == entry.path


def test_problem_bodies_are_utf8_not_escaped() -> None:
    """A translated detail is written as UTF-8, as DRF writes its own errors and as
    docs/errors.md shows them, whatever ``DEFAULT_CHARSET`` says."""
    from django.utils import translation

    from django_idempotency.errors import RequestTooLarge

    with translation.override("de"), override_settings(DEFAULT_CHARSET="iso-8859-1"):
        response = problem_json(RequestTooLarge())
        detail = str(RequestTooLarge().detail)
    assert not detail.isascii()  # the catalog translates it into German
    assert b"\\u" not in response.content
    assert json.loads(response.content.decode("utf-8"))["detail"] == detail
    assert detail.encode("utf-8") in response.content
