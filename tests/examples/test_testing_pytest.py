"""docs/testing.md's pytest-django example, run under each strategy
(``strategy`` below), with the plugin's automatic isolation
(tests/examples/conftest.py)."""

from typing import Any

# --8<-- [start:example]
import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from .models import Charge


@pytest.fixture
def client(db):
    client = APIClient()
    client.force_authenticate(User.objects.create_user("payer"))
    return client


def charge(client, key):
    body = {"amount": 500, "currency": "eur"}
    return client.post(
        "/ex/receipt/drf/",
        body,
        format="json",
        headers={"Idempotency-Key": key},
    )


def test_a_retry_replays_and_charges_once(
    client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        first = charge(client, "order-1")
    assert first.status_code == 201
    assert len(callbacks) == 1  # the view's receipt; the library adds none

    retry = charge(client, "order-1")
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json() == first.json()
    assert Charge.objects.count() == 1


def test_the_same_key_in_the_next_test_charges_again(client):
    # The key of the test above (on SQLite the same user id too): a record
    # of its own.
    response = charge(client, "order-1")
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response.headers
    assert Charge.objects.count() == 1


# --8<-- [end:example]


@pytest.fixture(autouse=True, params=["db", "redis", "hybrid"])
def strategy(request: pytest.FixtureRequest) -> Any:
    """In the docs the project's settings name the strategy; here each one in
    turn."""
    from django.test import override_settings

    from tests.support import services

    if request.param == "db":
        yield "db"
        return
    request.applymarker(pytest.mark.redis)
    value = {
        "STRATEGY": request.param,
        "REDIS_URL": services.REDIS_URL,
        "REDIS_KEY_PREFIX": "docs",
    }
    with override_settings(IDEMPOTENCY=value):
        yield request.param


def test_the_receipts_went_out_once(
    client: APIClient, django_capture_on_commit_callbacks: Any
) -> None:
    from . import receipts

    receipts.sent_receipts.clear()
    with django_capture_on_commit_callbacks(execute=True):
        first = charge(client, "order-2")
    assert charge(client, "order-2").json() == first.json()
    assert receipts.sent_receipts == [first.json()["id"]]
