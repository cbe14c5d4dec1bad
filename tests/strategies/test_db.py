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

from ..support.api import token_client
from ..support.factories import UserFactory

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
    """No statement of its own: the claim's INSERT checks the outbox (NOT EXISTS)."""
    outbox = IdempotencyOutbox._meta.db_table
    sql = _statements_for_new_key(UserFactory(), "k-plain")
    assert any("INSERT INTO" in s and "idempotencykey" in s for s in sql)
    assert [s for s in sql if outbox in s] == [
        s for s in sql if s.startswith("INSERT INTO") and "idempotencykey" in s
    ]


@override_settings(IDEMPOTENCY={"STRATEGY": "db"})
def test_with_hybrid_loaded_too_the_claim_insert_is_the_only_outbox_statement(
    fresh_strategies: None,
) -> None:
    strategies.load_strategy("hybrid")  # a view of this project uses it
    outbox = IdempotencyOutbox._meta.db_table
    sql = _statements_for_new_key(UserFactory(), "k-mixed")
    assert [s for s in sql if outbox in s and not s.startswith("INSERT INTO")] == []
    assert len([s for s in sql if outbox in s]) == 1


# -- switching STRATEGY from hybrid: keys still in the outbox ---------------------------------


def _move_to_outbox(key: str) -> None:
    """Turn the completed key row into what the hybrid strategy leaves before the drain: an
    outbox row for (scope, key, fingerprint) with the response, and no IdempotencyKey row."""
    from django_idempotency.models import IdempotencyKey
    from django_idempotency.protocol.replay import StoredResponse

    row = IdempotencyKey.objects.get(key=key)
    assert row.status == "completed"
    row.delete()
    assert IdempotencyOutbox.objects.add(
        row.scope,
        row.key,
        row.fingerprint,
        StoredResponse(
            status=int(row.response_status or 0),
            headers=dict(row.response_headers),
            body=bytes(row.response_body or b""),
        ),
        ttl=3600,
        method=row.request_method,
        path=row.request_path,
    )


@pytest.mark.parametrize(
    "strategy",
    ["db", pytest.param("advisory_lock", marks=pytest.mark.postgres)],
)
def test_a_key_completed_under_hybrid_and_not_drained_is_replayed_after_switching(
    strategy: str, fresh_strategies: None
) -> None:
    from tests.testapp.models import SideEffect

    client = token_client(UserFactory())
    with override_settings(IDEMPOTENCY={"STRATEGY": strategy}):
        first = client.post("/t/drf/", {"a": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k-moved")
        assert first.status_code == 201
        _move_to_outbox("k-moved")
        strategies.reset()  # the hybrid strategy was never loaded in this process
        assert all(s.name != "hybrid" for s in strategies._loaded.values())

        replay = client.post("/t/drf/", {"a": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k-moved")
        assert replay.status_code == 201
        assert replay.headers.get("Idempotent-Replayed") == "true"
        assert replay.content == first.content
        assert SideEffect.objects.count() == 1

        other = client.post("/t/drf/", {"a": 2}, format="json", HTTP_IDEMPOTENCY_KEY="k-moved")
        assert other.status_code == 422
        assert SideEffect.objects.count() == 1
        assert all(s.name != "hybrid" for s in strategies._loaded.values())
