"""The examples of the integration pages (tests/examples, included in docs/*.md): each
runs once per key, replays to a retry, and never replays one user's key to another."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from example_project.payments.models import Charge

from .factories import UserFactory
from .support.api import replayed, token_client

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


@pytest.mark.parametrize("path", ["/ex/drf-class/", "/ex/drf-function/"])
def test_the_drf_examples_require_a_key_and_a_user(path: str) -> None:
    alice = UserFactory()
    assert token_client(alice).post(path, CHARGE, format="json").status_code == 400
    assert (
        APIClient().post(path, CHARGE, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 401
    )
    assert not Charge.objects.exists()
