"""The db strategy's statements on the request path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from django_idempotency import strategies
from django_idempotency.models import IdempotencyOutbox

from .factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def fresh_strategies() -> Iterator[None]:
    strategies.reset()
    yield
    strategies.reset()


def _statements_for_new_key(user: Any, key: str) -> list[str]:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {user.auth_token.key}")
    with CaptureQueriesContext(connections["default"]) as queries:
        response = client.post("/t/drf/", {"a": 1}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201
    return [q["sql"] for q in queries.captured_queries]


@override_settings(IDEMPOTENCY={"STRATEGY": "db"})
def test_a_project_without_hybrid_never_reads_the_outbox(fresh_strategies: None) -> None:
    outbox = IdempotencyOutbox._meta.db_table
    sql = _statements_for_new_key(UserFactory(), "k-plain")
    assert any("INSERT INTO" in s and "idempotencykey" in s for s in sql)
    assert not [s for s in sql if outbox in s]


@override_settings(IDEMPOTENCY={"STRATEGY": "db"})
def test_once_hybrid_is_loaded_new_db_claims_read_the_outbox(fresh_strategies: None) -> None:
    strategies.load_strategy("hybrid")  # a view of this project uses it
    outbox = IdempotencyOutbox._meta.db_table
    sql = _statements_for_new_key(UserFactory(), "k-mixed")
    assert len([s for s in sql if outbox in s]) == 1
