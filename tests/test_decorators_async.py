"""``@idempotent`` on ``async def`` views, through Django's async test client
(the example of docs/async.md). Races under uvicorn: tests/system/test_asgi_race.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync, iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient

from django_idempotency.decorators import idempotent
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.replay import REPLAYED_HEADER
from example_project.payments.models import Charge

from .support.assertions import assert_problem
from .support.factories import UserFactory

pytestmark = pytest.mark.django_db

URL = "/t/async/charge/"
CHARGE = {"amount": 500, "currency": "EUR"}


def client() -> AsyncClient:
    c = AsyncClient()
    c.force_login(UserFactory())
    return c


def post(c: AsyncClient, data: Any = CHARGE, key: str | None = "k1", url: str = URL) -> Any:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return async_to_sync(c.post)(url, json.dumps(data), "application/json", headers=headers)


def test_the_decorated_view_stays_async() -> None:
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    assert iscoroutinefunction(idempotent(view))
    assert iscoroutinefunction(idempotent(required=True)(view))
    assert "default" in idempotent(view)._non_atomic_requests  # type: ignore[attr-defined]


def test_replay_of_an_async_view() -> None:
    c = client()
    first = post(c)
    assert first.status_code == 201 and REPLAYED_HEADER not in first
    second = post(c)
    assert second.status_code == 201 and second[REPLAYED_HEADER] == "true"
    assert second.content == first.content
    assert Charge.objects.count() == 1
    assert IdempotencyKey.objects.get().status == "completed"


def test_missing_required_key_and_mismatch() -> None:
    c = client()
    assert_problem(post(c, key=None), 400, "missing-key")
    post(c)
    assert_problem(post(c, {"amount": 501, "currency": "EUR"}), 422, "key-reused")
    assert Charge.objects.count() == 1


def test_users_have_their_own_scope() -> None:
    post(client(), key="same")
    post(client(), key="same")
    assert Charge.objects.count() == 2


def test_method_that_does_not_take_part_is_not_claimed() -> None:
    c = client()
    response = async_to_sync(c.get)(URL, headers={"Idempotency-Key": "k1"})
    assert response.status_code == 405  # require_POST, outside the decorator
    assert not IdempotencyKey.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_exception_after_an_async_write_rolls_it_back_and_releases() -> None:
    """The view's ``acreate()`` runs on the connection whose transaction the claim opened."""
    c = AsyncClient(raise_request_exception=False)
    c.force_login(UserFactory())
    failed = post(c, {**CHARGE, "fail_after_write": True}, url="/api/async/charges/")
    assert failed.status_code == 500
    assert Charge.objects.count() == 0
    assert not IdempotencyKey.objects.exists()
    again = post(c, url="/api/async/charges/")
    assert again.status_code == 201 and REPLAYED_HEADER not in again
    assert Charge.objects.count() == 1
