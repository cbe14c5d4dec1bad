"""DRF function views: ``@idempotent_api_view``, and what ``@idempotent`` on either side of
``@api_view`` does (the system check, and the scope safety of the key claimed before DRF
authenticates). Token authentication throughout, as the example project's clients use."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIClient

from django_idempotency.decorators import idempotent
from django_idempotency.drf import idempotent_api_view
from django_idempotency.models import IdempotencyKey
from example_project.payments.models import Charge

from .factories import UserFactory
from .support.api import replayed, token_client
from .support.assertions import assert_problem
from .testapp.models import SideEffect

pytestmark = pytest.mark.django_db

CHARGE = {"amount": 500, "currency": "eur"}


@pytest.fixture
def alice() -> Any:
    return UserFactory(username="alice")


@pytest.fixture
def bob() -> Any:
    return UserFactory(username="bob")


def charge(client: APIClient, key: str | None, path: str = "/ex/drf-function/", **data: Any) -> Any:
    extra: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(path, {**CHARGE, **data}, format="json", **extra)


# -- @idempotent_api_view --------------------------------------------------------------------


def test_a_retry_replays_and_the_view_runs_once(alice: Any) -> None:
    client = token_client(alice)
    first = charge(client, "pay-1")
    assert first.status_code == 201 and not replayed(first)
    second = charge(client, "pay-1")
    assert second.status_code == 201 and replayed(second)
    assert second.content == first.content
    assert second["Content-Type"] == "application/json"
    assert Charge.objects.count() == 1
    assert IdempotencyKey.objects.get().scope == f"user:{alice.pk}"


def test_alices_key_never_replays_to_bob(alice: Any, bob: Any) -> None:
    first = charge(token_client(alice), "shared-key")
    other = charge(token_client(bob), "shared-key")
    assert other.status_code == 201 and not replayed(other)
    assert json.loads(other.content)["id"] != json.loads(first.content)["id"]
    assert sorted(Charge.objects.values_list("user__username", flat=True)) == ["alice", "bob"]
    assert IdempotencyKey.objects.count() == 2


def test_policy_decorators_apply_and_a_rejected_request_claims_nothing() -> None:
    response = charge(APIClient(), "pay-1")  # no token: IsAuthenticated refuses
    assert response.status_code == 401
    assert not IdempotencyKey.objects.exists() and not Charge.objects.exists()
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert charge(wrong, "pay-1").status_code == 401
    assert not IdempotencyKey.objects.exists()


def test_the_protocol_errors(alice: Any) -> None:
    client = token_client(alice)
    assert_problem(charge(client, None), 400, "missing-key")
    charge(client, "pay-1")
    assert_problem(charge(client, "pay-1", amount=501), 422, "key-reused")


def test_a_validation_error_is_stored_and_replayed(alice: Any) -> None:
    client = token_client(alice)
    first = charge(client, "bad", amount=0)
    assert first.status_code == 400 and first["Content-Type"] == "application/json"
    again = charge(client, "bad", amount=0)
    assert replayed(again) and again.content == first.content


def test_methods_and_options_are_passed_on(alice: Any) -> None:
    @idempotent_api_view(
        ["GET", "PUT"], methods=["PUT"], ttl=60, wait=2, scope=lambda r: "tenant:7"
    )
    @permission_classes([AllowAny])
    def view(request: Request) -> Response:
        """Puts a thing."""
        SideEffect.objects.create(label="put")
        return Response({"n": SideEffect.objects.count()})

    assert view.cls.__name__ == "view" and view.cls.__doc__ == "Puts a thing."
    assert {"get", "put", "options"} <= set(view.cls.http_method_names)
    assert "post" not in view.cls.http_method_names
    assert view.cls.idempotency_ttl == 60
    assert view.cls.idempotency_wait == 2
    from django.test import RequestFactory

    factory = RequestFactory()
    for _ in range(2):
        response = view(
            factory.put("/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="p")
        )
    assert response.status_code == 200 and replayed(response)
    assert SideEffect.objects.count() == 1
    assert IdempotencyKey.objects.get().scope == "tenant:7"


def test_a_string_of_methods_is_refused() -> None:
    with pytest.raises(TypeError):
        idempotent_api_view("POST")


# -- @idempotent outside @api_view: claimed before DRF authenticates ---------------------------


@csrf_exempt
@idempotent
@api_view(["POST"])
@permission_classes([AllowAny])
def outside(request: Request) -> Response:
    SideEffect.objects.create(label="outside")
    return Response({"user": str(request.user)}, status=201)


@api_view(["POST"])
@permission_classes([IsAuthenticated])
@idempotent
def inside(request: Request) -> Response:
    SideEffect.objects.create(label="inside")
    return Response({"user": str(request.user)}, status=201)


urlpatterns = [
    path("outside/", outside),
    path("inside/", inside),
    path("supported/", idempotent_api_view(["POST"])(lambda request: Response({}))),
]


@pytest.mark.urls(__name__)
def test_outside_api_view_refuses_credentials_it_has_not_authenticated(
    alice: Any, bob: Any
) -> None:
    for user in (alice, bob):
        response = charge(token_client(user), "same-key", "/outside/")
        payload = assert_problem(response, 400, "credentials-not-authenticated")
        assert "Authorization" in payload["detail"]
    assert not SideEffect.objects.exists()  # the view never ran
    assert not IdempotencyKey.objects.exists()


@pytest.mark.urls(__name__)
def test_outside_api_view_still_serves_callers_without_credentials() -> None:
    first = charge(APIClient(), "anon-key", "/outside/")
    assert first.status_code == 201
    assert replayed(charge(APIClient(), "anon-key", "/outside/"))
    assert SideEffect.objects.count() == 1
