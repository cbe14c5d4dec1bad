"""DRF function views: ``@idempotent_api_view``, and ``@idempotent`` on either side of
``@api_view``: below it (DRF's authenticated request, the response finalized as DRF would,
a real race of duplicates), above it (the scope safety of the key claimed before DRF
authenticates). Token authentication throughout, as the example project's clients use."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.db import transaction
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view, permission_classes
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIClient

from django_idempotency.decorators import idempotent
from django_idempotency.drf import idempotent_api_view
from django_idempotency.models import IdempotencyKey
from example_project.payments.models import Charge

from .support.api import race_held, replayed, token_client
from .support.assertions import assert_problem
from .support.factories import UserFactory
from .support.threads import in_background
from .testapp import holds
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


# -- @idempotent outside @api_view: claimed before DRF authenticates (check E021) --------------


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
    """After its write: waits until the test releases it (``hold``), fails (``raise``)
    or raises DRF's ``ValidationError`` (``invalid``) when asked to."""
    data: Any = request.data
    effect = SideEffect.objects.create(label="inside")
    if data.get("hold"):
        holds.wait(str(data["hold"]))
    if data.get("invalid"):
        raise ValidationError({"amount": ["not a valid amount"]})
    if data.get("raise"):
        raise RuntimeError("the view failed")
    return Response(
        {"user": str(request.user), "execution": effect.pk, "amount": data["amount"]},
        status=201,
    )


@transaction.non_atomic_requests
@api_view(["POST"])
@permission_classes([IsAuthenticated])
@idempotent
def inside_non_atomic(request: Request) -> Response:
    """``inside``, exempt from ATOMIC_REQUESTS (which ``@idempotent`` below ``@api_view``
    cannot do itself); answers whether another connection sees its claim."""
    effect = SideEffect.objects.create(label="inside")
    seen = in_background(lambda: IdempotencyKey.objects.filter(key="in-na").exists()).result()
    return Response({"execution": effect.pk, "claim_visible": seen}, status=201)


urlpatterns = [
    path("outside/", outside),
    path("inside/", inside),
    path("inside-non-atomic/", inside_non_atomic),
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


def test_outside_api_view_is_a_check_error() -> None:
    """Every request with DRF credentials is refused above: an error, not a warning, whose
    hint is the fix."""
    from django.test import override_settings

    from django_idempotency.checks.urls import check_drf_function_views

    with override_settings(ROOT_URLCONF=__name__):
        (message,) = check_drf_function_views()
    assert message.is_serious() and message.id == "django_idempotency.E021"
    assert "tests.test_drf.outside" in message.msg
    assert "@idempotent_api_view(...)" in (message.hint or "")


@pytest.mark.urls(__name__)
def test_outside_api_view_still_serves_callers_without_credentials() -> None:
    first = charge(APIClient(), "anon-key", "/outside/")
    assert first.status_code == 201
    assert replayed(charge(APIClient(), "anon-key", "/outside/"))
    assert SideEffect.objects.count() == 1


# -- @idempotent inside @api_view: DRF has authenticated the request -----------------------------


def _inside(client: APIClient, key: str | None, **data: Any) -> Any:
    return charge(client, key, "/inside/", **data)


@pytest.mark.urls(__name__)
def test_inside_api_view_stores_the_response_as_drf_renders_it(alice: Any) -> None:
    client = token_client(alice)
    first = _inside(client, "in-1")
    assert first.status_code == 201 and not replayed(first), first.content
    assert first["Content-Type"] == "application/json"
    assert json.loads(first.content)["user"] == "alice"
    again = _inside(client, "in-1")
    assert again.status_code == 201 and replayed(again)
    assert again.content == first.content
    assert again["Content-Type"] == "application/json"
    assert SideEffect.objects.count() == 1
    assert IdempotencyKey.objects.get().scope == f"user:{alice.pk}"  # DRF's user
    assert_problem(_inside(client, "in-1", amount=501), 422, "key-reused")
    assert SideEffect.objects.count() == 1


@pytest.mark.urls(__name__)
def test_inside_api_view_two_users_with_one_key_never_share_an_answer(alice: Any, bob: Any) -> None:
    for _ in range(2):
        answers = {user.username: _inside(token_client(user), "shared") for user in (alice, bob)}
        assert {name: json.loads(r.content)["user"] for name, r in answers.items()} == {
            "alice": "alice",
            "bob": "bob",
        }
    assert SideEffect.objects.count() == 2
    assert IdempotencyKey.objects.count() == 2


@pytest.mark.urls(__name__)
def test_inside_api_view_drf_refuses_before_the_claim() -> None:
    assert _inside(APIClient(), "in-anon").status_code == 401
    assert not IdempotencyKey.objects.exists() and not SideEffect.objects.exists()


@pytest.mark.urls(__name__)
def test_inside_api_view_an_api_exception_is_drfs_answer_and_is_stored(alice: Any) -> None:
    """As under ``@idempotent_api_view``: DRF's error response for an ``APIException``
    is the view's answer, stored and replayed; the view does not run again."""
    client = token_client(alice)
    first = _inside(client, "in-bad", invalid=True)
    assert first.status_code == 400 and first["Content-Type"] == "application/json"
    assert json.loads(first.content) == {"amount": ["not a valid amount"]}
    again = _inside(client, "in-bad", invalid=True)
    assert replayed(again) and again.content == first.content
    assert SideEffect.objects.count() == 1


@pytest.mark.urls(__name__)
def test_inside_api_view_an_error_releases_the_key(alice: Any) -> None:
    client = token_client(alice, raise_request_exception=False)
    assert _inside(client, "in-boom", **{"raise": True}).status_code == 500
    assert not IdempotencyKey.objects.exists()
    assert not SideEffect.objects.exists()  # the view's write was rolled back
    retry = _inside(token_client(alice), "in-boom")
    assert retry.status_code == 201 and not replayed(retry)
    assert SideEffect.objects.count() == 1


RACERS = 12


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_inside_api_view_a_race_of_duplicates_runs_the_view_once(alice: Any, bob: Any) -> None:
    """Duplicates of one key from two token users, released at one moment on real
    threads: one execution per user, every other answer a 409 or the replay of that
    user's own execution."""
    users = [alice, bob]

    hold = uuid.uuid4().hex  # each user's execution runs until every other one is answered

    def send(index: int, body: dict[str, Any]) -> tuple[str, int, bool, Any]:
        user = users[index % 2]
        response = _inside(token_client(user), "race", **body)
        return user.username, response.status_code, replayed(response), json.loads(response.content)

    answers = race_held(RACERS, send, hold)
    assert SideEffect.objects.count() == 2, answers
    for name in ("alice", "bob"):
        mine = [a for a in answers if a[0] == name]
        fresh = [body for _, status, again, body in mine if status == 201 and not again]
        assert len(fresh) == 1, mine
        assert fresh[0]["user"] == name
        for _, status, _again, body in mine:
            if status == 201:
                assert body == fresh[0], mine  # a replay of this user's own execution
            else:
                assert status == 409 and body["type"].endswith("/request-in-progress"), mine
        assert any(status == 409 for _, status, _, _ in mine), f"no overlap: {mine}"
    for user in users:
        assert _inside(token_client(user), "race", hold=hold).status_code == 201
    assert SideEffect.objects.count() == 2


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_inside_api_view_under_non_atomic_requests_claims_before_the_view(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ATOMIC_REQUESTS on, ``@transaction.non_atomic_requests`` above ``@api_view``
    (check E020's hint) keeps the request's transaction out: the claim has committed, and
    other connections see it, while the view runs."""
    from django.db import connections

    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    first = charge(token_client(alice), "in-na", "/inside-non-atomic/")
    assert first.status_code == 201 and json.loads(first.content)["claim_visible"] is True
    assert replayed(charge(token_client(alice), "in-na", "/inside-non-atomic/"))
    assert SideEffect.objects.count() == 1
