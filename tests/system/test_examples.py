"""The examples of the integration pages (tests/examples, included in docs/*.md): each
runs once per key, replays to a retry, and never replays one user's key to another."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from django_idempotency.models import IdempotencyKey
from example_project.payments import psp
from example_project.payments.models import Charge

from ..support.api import replayed, token_client
from ..support.assertions import assert_problem
from ..support.factories import UserFactory
from ..support.threads import run_at_once

pytestmark = pytest.mark.django_db

CHARGE = {"amount": 500, "currency": "eur"}


def session_client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("path", "client_for"),
    [
        ("/ex/drf-class/", token_client),
        ("/ex/viewset/charges/", token_client),
        ("/ex/drf-function/", token_client),
        ("/ex/plain/", session_client),
    ],
)
def test_each_example_runs_once_and_keeps_users_apart(path: str, client_for: Any) -> None:
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")

    def post(client: Any) -> Any:
        return client.post(
            path, json.dumps(CHARGE), content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"
        )

    first = post(client_for(alice))
    assert first.status_code == 201, first.content
    retry = post(client_for(alice))
    assert retry.status_code == 201 and replayed(retry) and retry.content == first.content
    other = post(client_for(bob))
    assert other.status_code == 201 and not replayed(other)
    assert sorted(Charge.objects.values_list("user__username", flat=True)) == ["alice", "bob"]


@pytest.mark.parametrize("path", ["/ex/drf-class/", "/ex/drf-function/", "/ex/viewset/charges/"])
def test_the_drf_examples_require_a_key_and_a_user(path: str) -> None:
    alice = UserFactory()
    assert token_client(alice).post(path, CHARGE, format="json").status_code == 400
    assert (
        APIClient().post(path, CHARGE, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 401
    )
    assert not Charge.objects.exists()


# -- the ModelViewSet of the quick start (tests/examples/drf_viewset.py) -----------------------

VIEWSET = "/ex/viewset/charges/"


def send(client: Any, method: str, path: str, body: dict[str, Any], key: str | None) -> Any:
    """``method`` ``path`` with ``body`` as JSON, with ``Idempotency-Key: key`` unless None."""
    headers = {"Idempotency-Key": key} if key is not None else {}
    return getattr(client, method.lower())(path, body, format="json", headers=headers)


def test_the_viewset_example_protects_create_and_partial_update() -> None:
    """The default METHODS are POST and PATCH: ``create`` and ``partial_update`` run once
    per key and require one; ``update`` (PUT) and ``destroy`` (DELETE) are not covered."""
    client = token_client(UserFactory(username="alice"))

    assert_problem(send(client, "POST", VIEWSET, CHARGE, None), 400, "missing-key")
    assert not Charge.objects.exists()
    created = send(client, "POST", VIEWSET, CHARGE, "create-1")
    assert created.status_code == 201, created.content
    again = send(client, "POST", VIEWSET, CHARGE, "create-1")
    assert again.status_code == 201 and replayed(again) and again.content == created.content
    assert_problem(
        send(client, "POST", VIEWSET, {**CHARGE, "amount": 9}, "create-1"), 422, "key-reused"
    )
    assert Charge.objects.count() == 1

    detail = f"{VIEWSET}{created.json()['id']}/"
    assert_problem(send(client, "PATCH", detail, {"amount": 700}, None), 400, "missing-key")
    assert Charge.objects.get().amount == 500
    patched = send(client, "PATCH", detail, {"amount": 700}, "patch-1")
    assert patched.status_code == 200 and patched.json()["amount"] == 700
    send(client, "PUT", detail, {"amount": 650, "currency": "EUR"}, None)  # between the two
    again = send(client, "PATCH", detail, {"amount": 700}, "patch-1")
    assert again.status_code == 200 and replayed(again) and again.content == patched.content
    assert Charge.objects.get().amount == 650  # the replay did not run the update again
    assert_problem(send(client, "PATCH", detail, {"amount": 800}, "patch-1"), 422, "key-reused")

    # PUT and DELETE are not in METHODS: no key needed, and a key sent is not honoured.
    for amount in (900, 901):
        put = send(client, "PUT", detail, {"amount": amount, "currency": "EUR"}, "put-1")
        assert put.status_code == 200 and not replayed(put) and put.json()["amount"] == amount
    assert client.get(VIEWSET).status_code == 200
    assert send(client, "DELETE", detail, {}, None).status_code == 204
    assert not Charge.objects.exists()
    assert set(IdempotencyKey.objects.values_list("key", flat=True)) == {"create-1", "patch-1"}


@pytest.mark.django_db(transaction=True)
def test_the_viewset_example_charges_once_under_a_race(monkeypatch: pytest.MonkeyPatch) -> None:
    """Duplicates of one create, released together on real threads: one charge; the
    provider call of the request that runs holds until every duplicate has its answer (a
    409 while it runs), so the race overlaps however loaded the machine is."""
    alice = UserFactory(username="alice")
    duplicates_answered = threading.Event()
    answered: list[int] = []
    charge = psp.charge

    def slow_charge(*args: Any, **kwargs: Any) -> str:
        assert duplicates_answered.wait(60), f"the duplicates never answered: {answered}"
        return charge(*args, **kwargs)

    monkeypatch.setattr(psp, "charge", slow_charge)

    def post(_: int) -> tuple[int, bool, Any]:
        response = send(token_client(alice), "POST", VIEWSET, CHARGE, "race-1")
        answered.append(response.status_code)
        if response.status_code == 409 and len(answered) == 7:
            duplicates_answered.set()
        return response.status_code, replayed(response), json.loads(response.content)

    answers = run_at_once(8, post)
    assert Charge.objects.count() == 1, answers
    fresh = [body for status, again, body in answers if status == 201 and not again]
    assert len(fresh) == 1, answers
    conflicts = [body for status, _again, body in answers if status == 409]
    assert len(conflicts) == 7, answers
    assert all(body["type"].endswith("/request-in-progress") for body in conflicts), answers
