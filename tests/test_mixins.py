"""IdempotencyMixin on DRF views, through APIClient: tests/testapp views and /api/charges/."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import RequestFactory, override_settings
from rest_framework.test import APIClient

from django_idempotency.conf import conf
from django_idempotency.mixins import IdempotencyMixin, view_options
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.fingerprint import fingerprint
from django_idempotency.protocol.keys import downstream_key
from django_idempotency.protocol.replay import REPLAYED_HEADER
from example_project.payments.models import Charge

from .support.api import token_client
from .support.assertions import assert_problem
from .support.factories import UserFactory
from .support.gates import gate as the_gate
from .testapp.models import SideEffect

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> Any:
    return UserFactory(username="alice")


@pytest.fixture
def bob() -> Any:
    return UserFactory(username="bob")


def post(client: APIClient, path: str, data: Any, key: str | None = "k1", **extra: Any) -> Any:
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(path, data, format="json", **extra)


def test_replay_returns_the_same_status_and_body(alice: Any) -> None:
    client = token_client(alice)
    first = post(client, "/t/drf/", {"a": 1, "status": 202})
    assert first.status_code == 202 and REPLAYED_HEADER not in first
    second = post(client, "/t/drf/", {"status": 202, "a": 1})  # same JSON, other key order
    assert second.status_code == 202
    assert second.content == first.content
    assert second[REPLAYED_HEADER] == "true"
    assert second["Content-Type"] == first["Content-Type"] == "application/json"
    assert SideEffect.objects.count() == 1


def test_reuse_with_a_different_body_is_422(alice: Any) -> None:
    client = token_client(alice)
    post(client, "/t/drf/", {"a": 1})
    assert_problem(post(client, "/t/drf/", {"a": 2}), 422, "key-reused")
    assert_problem(post(client, "/t/drf/?x=1", {"a": 1}), 422, "key-reused")
    assert SideEffect.objects.count() == 1


def test_in_progress_is_409_with_retry_after(alice: Any, rf: RequestFactory) -> None:
    request = rf.post("/t/drf/", json.dumps({"a": 1}), "application/json")
    IdempotencyKey.objects.claim(
        f"user:{alice.pk}", "busy", fingerprint(request), ttl=60, lock_timeout=60
    )
    response = post(token_client(alice), "/t/drf/", {"a": 1}, key="busy")
    assert_problem(response, 409, "request-in-progress")
    assert int(response["Retry-After"]) >= 1
    assert SideEffect.objects.count() == 0


def test_missing_key_is_400_only_where_required(alice: Any) -> None:
    client = token_client(alice)
    assert post(client, "/t/drf/", {"a": 1}, key=None).status_code == 201
    assert post(client, "/t/drf/", {"a": 1}, key=None).status_code == 201
    assert_problem(post(client, "/t/drf-error/", {"a": 1}, key=None), 400, "missing-key")
    assert_problem(
        post(client, "/api/charges/", {"amount": 1, "currency": "EUR"}, key=None),
        400,
        "missing-key",
    )
    assert SideEffect.objects.count() == 2 and Charge.objects.count() == 0
    assert not IdempotencyKey.objects.exists()


@pytest.mark.parametrize("key", ["", "has space", "k" * 256, '"unterminated', "\x01"])
def test_bad_key_is_400(alice: Any, key: str) -> None:
    assert_problem(post(token_client(alice), "/t/drf/", {"a": 1}, key=key), 400, "invalid-key")
    assert SideEffect.objects.count() == 0


def test_quoted_key_is_the_same_key(alice: Any) -> None:
    client = token_client(alice)
    post(client, "/t/drf/", {"a": 1}, key="abc")
    assert post(client, "/t/drf/", {"a": 1}, key='"abc"')[REPLAYED_HEADER] == "true"


def test_methods_not_listed_pass_through(alice: Any) -> None:
    client = token_client(alice)
    for _ in range(2):
        response = client.get("/t/drf/", HTTP_IDEMPOTENCY_KEY="k1")
        assert response.status_code == 200 and REPLAYED_HEADER not in response
    assert not IdempotencyKey.objects.exists()


def test_unauthenticated_request_is_not_claimed() -> None:
    response = post(APIClient(), "/t/drf/", {"a": 1})
    assert response.status_code in (401, 403)
    assert not IdempotencyKey.objects.exists()


def test_keys_are_scoped_per_user(alice: Any, bob: Any) -> None:
    alices = post(token_client(alice), "/t/drf/", {"a": 1}, key="shared")
    bobs = post(token_client(bob), "/t/drf/", {"a": 1}, key="shared")
    assert REPLAYED_HEADER not in bobs
    assert json.loads(bobs.content)["n"] == 2 != json.loads(alices.content)["n"]
    # and bob's different body under the same key is not a mismatch with alice's
    assert post(token_client(bob), "/t/drf/", {"a": 1}, key="shared")[REPLAYED_HEADER] == "true"
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {
        f"user:{alice.pk}",
        f"user:{bob.pk}",
    }


def test_anonymous_scope(alice: Any) -> None:
    client = APIClient()
    post(client, "/t/drf-anon/", {"a": 1})
    assert post(client, "/t/drf-anon/", {"a": 1})[REPLAYED_HEADER] == "true"
    assert IdempotencyKey.objects.get().scope == "anonymous"


def test_custom_scope_hook(alice: Any, bob: Any) -> None:
    first = post(token_client(alice), "/t/drf-tenant/", {"a": 1}, HTTP_X_TENANT="acme")
    # the same tenant replays, whoever the user
    same_tenant = post(token_client(bob), "/t/drf-tenant/", {"a": 1}, HTTP_X_TENANT="acme")
    assert same_tenant[REPLAYED_HEADER] == "true" and same_tenant.content == first.content
    other_tenant = post(token_client(alice), "/t/drf-tenant/", {"a": 1}, HTTP_X_TENANT="globex")
    assert REPLAYED_HEADER not in other_tenant
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {
        "tenant:acme",
        "tenant:globex",
    }


@pytest.mark.parametrize("atomic", [True, False])
def test_server_error_releases_the_key(alice: Any, atomic: bool) -> None:
    client = token_client(alice)
    with override_settings(IDEMPOTENCY={"ATOMIC": atomic}):
        assert post(client, "/t/drf/", {"status": 500}).status_code == 500
        assert not IdempotencyKey.objects.exists()
        assert SideEffect.objects.count() == (0 if atomic else 1)
        retry = post(client, "/t/drf/", {"status": 500})
        assert retry.status_code == 500 and REPLAYED_HEADER not in retry
    assert SideEffect.objects.count() == (0 if atomic else 2)


@override_settings(IDEMPOTENCY={"STORE_SERVER_ERRORS": True})
def test_server_error_stored_when_configured(alice: Any) -> None:
    client = token_client(alice)
    first = post(client, "/t/drf/", {"status": 503})
    replay = post(client, "/t/drf/", {"status": 503})
    assert replay.status_code == 503 and replay.content == first.content
    assert replay[REPLAYED_HEADER] == "true"
    assert SideEffect.objects.count() == 1


def test_exception_releases_the_key_and_rolls_back(alice: Any) -> None:
    client = token_client(alice, raise_request_exception=False)
    assert post(client, "/t/drf/", {"raise": True}).status_code == 500
    assert SideEffect.objects.count() == 0
    assert not IdempotencyKey.objects.exists()
    with pytest.raises(RuntimeError, match="the view failed"):
        post(token_client(alice), "/t/drf/", {"raise": True})
    assert post(client, "/t/drf/", {"raise": False}).status_code == 201


def test_validation_error_is_stored_and_replayed(alice: Any) -> None:
    client = token_client(alice)
    first = post(client, "/t/drf/", {"invalid": True})
    assert first.status_code == 400
    assert json.loads(first.content) == {"amount": ["bad"]}
    replay = post(client, "/t/drf/", {"invalid": True})
    assert replay.status_code == 400 and replay.content == first.content
    assert replay[REPLAYED_HEADER] == "true"
    assert SideEffect.objects.count() == 1
    assert IdempotencyKey.objects.get().response_status == 400


def test_example_charge_validation_error_is_stored(alice: Any) -> None:
    client = token_client(alice)
    first = post(client, "/api/charges/", {"amount": 0, "currency": "EURO"})
    assert first.status_code == 400
    replay = post(client, "/api/charges/", {"amount": 0, "currency": "EURO"})
    assert replay.content == first.content and replay[REPLAYED_HEADER] == "true"
    assert Charge.objects.count() == 0


def test_stored_headers_keep_location_and_content_type_only(alice: Any) -> None:
    client = APIClient()  # the plain view authenticates no token: it would refuse one
    client.force_login(alice)
    first = post(client, "/t/fn/", {"a": 1})  # the function view sets cookies and extras
    assert first["Set-Cookie"] == "session=secret" and first["X-Request-Private"]
    stored = IdempotencyKey.objects.get().response_headers
    assert {name.lower() for name in stored} == {"content-type", "location"}
    replay = post(client, "/t/fn/", {"a": 1})
    assert replay["Location"] == "/somewhere/1"
    assert replay["Content-Type"] == "application/json"
    assert "X-Request-Private" not in replay
    assert "Set-Cookie" not in replay


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_body_over_the_upload_limit_is_413(alice: Any) -> None:
    response = post(token_client(alice), "/t/drf/", {"note": "x" * 500})
    assert_problem(response, 413, "request-too-large")
    assert SideEffect.objects.count() == 0


def test_malformed_multipart_is_a_400_problem(alice: Any) -> None:
    response = token_client(alice).generic(
        "POST",
        "/t/drf/",
        b"--nope\r\ngarbage",  # type: ignore[arg-type]  # raw bytes, as a client may send
        content_type="multipart/form-data",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert_problem(response, 400, "invalid-body")
    assert SideEffect.objects.count() == 0


def test_charges_example_replays_and_keeps_the_provider_key(alice: Any) -> None:
    client = token_client(alice)
    body = {"amount": 1250, "currency": "eur"}
    first = post(client, "/api/charges/", body, key="order-1")
    assert first.status_code == 201, first.content
    charge = json.loads(first.content)
    expected = downstream_key(conf.DOWNSTREAM_KEY_SECRET, f"user:{alice.pk}", "order-1", "psp")
    assert charge["psp_reference"] == f"psp_{expected[:24]}"
    replay = post(client, "/api/charges/", body, key="order-1")
    assert replay[REPLAYED_HEADER] == "true" and json.loads(replay.content) == charge
    assert Charge.objects.count() == 1
    # A retry that runs the view again (the key was lost, e.g. purged) hands the
    # provider the same key, so the provider deduplicates the charge.
    IdempotencyKey.objects.all().delete()
    again = post(client, "/api/charges/", body, key="order-1")
    assert json.loads(again.content)["psp_reference"] == charge["psp_reference"]
    other = post(client, "/api/charges/", body, key="order-2")
    assert json.loads(other.content)["psp_reference"] != charge["psp_reference"]


@pytest.mark.urls("tests.support.gates")
@pytest.mark.django_db(transaction=True)
def test_fencing_takeover_while_the_handler_runs_rolls_it_back() -> None:
    the_gate.reset()
    response = APIClient().post(
        "/stolen-drf/", {"a": 1}, format="json", HTTP_IDEMPOTENCY_KEY="fenced"
    )
    assert_problem(response, 409, "lease-lost")
    (theft,) = the_gate.thefts
    assert theft.taken_over
    assert SideEffect.objects.count() == 0
    assert IdempotencyKey.objects.get(key="fenced").claim_token == theft.token


def test_validation_error_under_atomic_requests_rolls_back_and_is_stored(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ATOMIC_REQUESTS, DRF marks the transaction for rollback after an APIException:
    the handler's writes are undone, and the 400 is still stored (after the rollback)."""
    from django.db import connections

    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    client = token_client(alice)
    first = post(client, "/t/drf/", {"invalid": True})
    assert first.status_code == 400
    assert SideEffect.objects.count() == 0
    replay = post(client, "/t/drf/", {"invalid": True})
    assert replay.status_code == 400 and replay.content == first.content
    assert replay[REPLAYED_HEADER] == "true"
    assert SideEffect.objects.count() == 0


# -- requests the view cannot handle leave no record --------------------------------------


@pytest.mark.parametrize("path", ["/t/drf/", "/t/drf-narrow/"])
def test_a_method_the_view_does_not_handle_is_not_claimed(alice: Any, path: str) -> None:
    """PATCH is in the default METHODS: on a view without a PATCH handler (or with PATCH
    outside ``http_method_names``) the 405 is DRF's, not stored under the key, and a POST
    with the same key then runs the view."""
    client = token_client(alice)
    for _ in range(2):
        response = client.patch(path, {"a": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k405")
        assert response.status_code == 405 and REPLAYED_HEADER not in response
    assert not IdempotencyKey.objects.exists()
    created = post(client, path, {"a": 1}, key="k405")
    assert created.status_code == 201, created.content
    assert post(client, path, {"a": 1}, key="k405")[REPLAYED_HEADER] == "true"
    assert IdempotencyKey.objects.count() == 1
    assert SideEffect.objects.count() == 1


@pytest.mark.parametrize(
    ("status", "extra"),
    [(401, {}), (403, {"HTTP_X_DENY": "1"}), (429, {"HTTP_X_THROTTLE": "1"})],
    ids=["unauthenticated", "permission-denied", "throttled"],
)
def test_a_request_rejected_before_the_handler_is_not_claimed(
    alice: Any, status: int, extra: dict[str, str]
) -> None:
    """Authentication, permissions and throttling answer before the key is claimed: the
    rejection is not stored, and the accepted request with the same key (in the same
    scope, the tenant) runs the view once."""
    rejected_by = APIClient() if status == 401 else token_client(alice)
    rejected = post(rejected_by, "/t/drf-guarded/", {"a": 1}, key="guarded", **extra)
    assert rejected.status_code == status, rejected.content
    if status == 429:
        assert rejected["Retry-After"] == "7"
    assert not IdempotencyKey.objects.exists()
    assert SideEffect.objects.count() == 0
    client = token_client(alice)
    created = post(client, "/t/drf-guarded/", {"a": 1}, key="guarded")
    assert created.status_code == 201, created.content
    assert post(client, "/t/drf-guarded/", {"a": 1}, key="guarded")[REPLAYED_HEADER] == "true"
    assert IdempotencyKey.objects.count() == 1
    assert SideEffect.objects.count() == 1


class _Declared(IdempotencyMixin):
    idempotency_ttl = 30.0


def test_view_options_are_shared_for_the_same_declared_values() -> None:
    first, second = view_options(_Declared()), view_options(_Declared())
    assert first is second
    assert first.ttl == 30.0 and first.methods is None


def test_view_options_take_a_list_of_methods_that_cannot_be_cached() -> None:
    view = _Declared()
    view.idempotency_methods = ["put", "post"]  # type: ignore[attr-defined]
    options = view_options(view)
    assert options.methods == frozenset({"PUT", "POST"})
    assert options.applies_to("put") and not options.applies_to("PATCH")
