"""``@idempotent`` on plain Django views, through the test client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings

from django_idempotency.decorators import idempotent
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.fingerprint import fingerprint
from django_idempotency.protocol.replay import REPLAYED_HEADER
from example_project.payments.models import Charge, Refund

from .support.assertions import assert_problem
from .support.factories import UserFactory
from .testapp.models import SideEffect

pytestmark = pytest.mark.django_db


def post(
    path: str, data: Any, key: str | None = "k1", client: Client | None = None, **extra: Any
) -> Any:
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    return (client or Client()).post(
        path, json.dumps(data), content_type="application/json", **extra
    )


def test_bare_and_configured_forms_keep_the_view() -> None:
    def view(request: HttpRequest) -> HttpResponse:
        """Docs."""
        return HttpResponse()

    assert idempotent(view).__name__ == "view"
    assert idempotent(required=True)(view).__doc__ == "Docs."
    # both are exempt from ATOMIC_REQUESTS: the app runs the view in its own transaction
    assert "default" in idempotent(view)._non_atomic_requests  # type: ignore[attr-defined]


def test_replay() -> None:
    first = post("/t/fn/", {"a": 1, "status": 201})
    assert first.status_code == 201 and REPLAYED_HEADER not in first
    second = post("/t/fn/", {"status": 201, "a": 1})
    assert second.status_code == 201 and second.content == first.content
    assert second[REPLAYED_HEADER] == "true"
    assert second["Location"] == "/somewhere/1"
    assert "Set-Cookie" not in second and "X-Request-Private" not in second
    assert SideEffect.objects.count() == 1


def test_mismatch_is_422() -> None:
    post("/t/fn/", {"a": 1})
    assert_problem(post("/t/fn/", {"a": 2}), 422, "key-reused")
    assert SideEffect.objects.count() == 1


def test_in_progress_is_409(rf: RequestFactory) -> None:
    request = rf.post("/t/fn/", json.dumps({"a": 1}), "application/json")
    IdempotencyKey.objects.claim("anonymous", "busy", fingerprint(request), ttl=60, lock_timeout=60)
    response = post("/t/fn/", {"a": 1}, key="busy")
    assert_problem(response, 409, "request-in-progress")
    assert int(response["Retry-After"]) >= 1
    assert SideEffect.objects.count() == 0


def test_optional_and_required_keys() -> None:
    assert post("/t/fn/", {"a": 1}, key=None).status_code == 201
    assert post("/t/fn/", {"a": 1}, key=None).status_code == 201
    assert_problem(post("/t/fn-required/", {"a": 1}, key=None), 400, "missing-key")
    assert SideEffect.objects.count() == 2


@pytest.mark.parametrize("key", ["", "two words", "k" * 256, '"x"y', "\u00e9t\u00e9"])
def test_bad_key_is_400(key: str) -> None:
    assert_problem(post("/t/fn-required/", {"a": 1}, key=key), 400, "invalid-key")
    assert SideEffect.objects.count() == 0


def test_key_of_255_characters_is_accepted() -> None:
    assert post("/t/fn-required/", {"a": 1}, key="k" * 255).status_code == 201


def test_methods_option() -> None:
    client = Client()
    # PUT is listed on /t/fn-required/ (methods=["POST", "PUT"]), not on /t/fn/
    for _ in range(2):
        client.put(
            "/t/fn-required/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="put"
        )
        response = client.put(
            "/t/fn/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="put"
        )
        assert REPLAYED_HEADER not in response
    assert SideEffect.objects.filter(label="fn-required").count() == 1
    assert SideEffect.objects.filter(label="fn").count() == 2
    # PATCH is not listed on /t/fn-required/: no key needed, nothing recorded
    response = client.patch("/t/fn-required/", b"{}", content_type="application/json")
    assert response.status_code == 201
    assert IdempotencyKey.objects.count() == 1


def test_ttl_option() -> None:
    post("/t/fn-required/", {"a": 1})
    record = IdempotencyKey.objects.get()
    lifetime = (record.expires_at - record.completed_at).total_seconds()  # type: ignore[operator]
    assert 4 <= lifetime <= 6  # ttl=5


@pytest.mark.parametrize("atomic", [True, False])
def test_server_error_releases_the_key(atomic: bool) -> None:
    with override_settings(IDEMPOTENCY={"ATOMIC": atomic}):
        assert post("/t/fn/", {"status": 500}).status_code == 500
        assert not IdempotencyKey.objects.exists()
        assert SideEffect.objects.count() == (0 if atomic else 1)
        assert post("/t/fn/", {"status": 500}).status_code == 500
    assert SideEffect.objects.count() == (0 if atomic else 2)


@override_settings(IDEMPOTENCY={"STORE_SERVER_ERRORS": True})
def test_server_error_stored_when_configured() -> None:
    first = post("/t/fn/", {"status": 500})
    replay = post("/t/fn/", {"status": 500})
    assert replay.status_code == 500 and replay.content == first.content
    assert replay[REPLAYED_HEADER] == "true"


def test_exception_releases_the_key_and_rolls_back() -> None:
    response = post("/t/fn/", {"raise": True}, client=Client(raise_request_exception=False))
    assert response.status_code == 500
    assert SideEffect.objects.count() == 0
    assert not IdempotencyKey.objects.exists()
    assert post("/t/fn/", {"raise": False}).status_code == 201


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_body_over_the_upload_limit_is_413() -> None:
    assert_problem(post("/t/fn/", {"note": "x" * 500}), 413, "request-too-large")
    assert SideEffect.objects.count() == 0


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_multipart_over_the_upload_limit_is_413() -> None:
    response = Client().post("/t/fn/", {"note": "x" * 500}, HTTP_IDEMPOTENCY_KEY="k1")
    assert_problem(response, 413, "request-too-large")


def test_malformed_multipart_is_400() -> None:
    response = Client().generic(
        "POST",
        "/t/fn/",
        b"garbage",
        content_type="multipart/form-data",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert_problem(response, 400, "invalid-body")


def test_logged_in_users_have_their_own_scope() -> None:
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    a, b = Client(), Client()
    a.force_login(alice)
    b.force_login(bob)
    post("/t/fn/", {"a": 1}, client=a)
    assert REPLAYED_HEADER not in post("/t/fn/", {"a": 1}, client=b)
    assert post("/t/fn/", {"a": 1}, client=a)[REPLAYED_HEADER] == "true"
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {
        f"user:{alice.pk}",
        f"user:{bob.pk}",
    }


def test_refund_example() -> None:
    alice = UserFactory(username="alice")
    charge = Charge.objects.create(user=alice, amount=1000, currency="EUR", psp_reference="p")
    auth: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Token {alice.auth_token.key}"}
    assert_problem(
        post("/api/refunds/", {"charge": charge.pk, "amount": 100}, key=None, **auth),
        400,
        "missing-key",
    )
    first = post("/api/refunds/", {"charge": charge.pk, "amount": 100}, key="r1", **auth)
    assert first.status_code == 201
    replay = post("/api/refunds/", {"charge": charge.pk, "amount": 100}, key="r1", **auth)
    assert replay.content == first.content and replay[REPLAYED_HEADER] == "true"
    assert_problem(
        post("/api/refunds/", {"charge": charge.pk, "amount": 200}, key="r1", **auth),
        422,
        "key-reused",
    )
    assert Refund.objects.count() == 1
    bad = post("/api/refunds/", {"charge": charge.pk, "amount": 5000}, key="r2", **auth)
    assert bad.status_code == 400
    assert (
        post("/api/refunds/", {"charge": charge.pk, "amount": 5000}, key="r2", **auth)[
            REPLAYED_HEADER
        ]
        == "true"
    )


def test_require_post_outside_idempotent_answers_405_without_a_record() -> None:
    """``@require_POST`` above ``@idempotent`` refuses a PATCH (a method in the default
    METHODS) before the key is claimed, so the POST with the same key runs the view."""
    client = Client()
    response = client.patch(
        "/t/fn-post-only/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="k405"
    )
    assert response.status_code == 405
    assert not IdempotencyKey.objects.exists()
    created = post("/t/fn-post-only/", {"a": 1}, key="k405", client=client)
    assert created.status_code == 201
    assert post("/t/fn-post-only/", {"a": 1}, key="k405", client=client)[REPLAYED_HEADER] == "true"
    assert IdempotencyKey.objects.count() == 1
    assert SideEffect.objects.filter(label="fn-post-only").count() == 1
