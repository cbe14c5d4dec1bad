"""The completion and the view's COMMIT in one round trip (PostgreSQL, psycopg 3).

For ``db``, ``advisory_lock`` and ``hybrid`` the statement that stores the response is
sent as ``WITH stored AS (<the fenced write>) SELECT …; COMMIT`` when the session's
transaction is the connection's outermost: the store and Django's COMMIT in one query. A
write that stores nothing (a lost fence) fails inside the statement, which aborts the
transaction and skips the COMMIT. These tests read what the connection really sends
(libpq's trace, ``tests/support/wire.py``), look at the rows from another connection, and
break the statement's parts: the fence, the COMMIT (a deferred constraint), the hooks
that run after it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import DataError, connections, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIClient
from rest_framework.views import APIView

from django_idempotency import signals, strategies
from django_idempotency.decorators import idempotent
from django_idempotency.mixins import IdempotencyMixin
from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.store.sql.postgresql import commits_in_statement
from django_idempotency.store.sql.statement import NOT_STORED_MARKER, not_stored
from django_idempotency.store.status import COMPLETED

from ..support.api import replayed, token_client
from ..support.assertions import problem_slug
from ..support.factories import UserFactory
from ..support.redis_servers import RedisServer
from ..support.services import postgres_url
from ..support.wire import queries_sent
from ..testapp.models import SideEffect

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls(__name__),
]

#: What the views' on_commit hooks saw, from a connection of their own.
seen: list[dict[str, Any]] = []


def _committed_rows(label: str, key: str) -> dict[str, Any]:
    """The view's row and the key's record, as another connection sees them now."""
    name = connections["default"].settings_dict["NAME"]
    url = postgres_url()
    assert url is not None
    with psycopg.connect(url, dbname=name, autocommit=True) as other:
        effects = other.execute(
            f"SELECT count(*) FROM {SideEffect._meta.db_table} WHERE label = %s", [label]
        ).fetchone()
        key_row = other.execute(
            f"SELECT status FROM {IdempotencyKey._meta.db_table} WHERE key = %s", [key]
        ).fetchone()
        outbox_row = other.execute(
            f"SELECT 1 FROM {IdempotencyOutbox._meta.db_table} WHERE key = %s", [key]
        ).fetchone()
    assert effects is not None
    return {
        "effects": effects[0],
        "key": key_row[0] if key_row else None,
        "outbox": outbox_row is not None,
    }


class HookView(IdempotencyMixin, APIView):
    """Writes one row and registers an on_commit hook that looks at what committed."""

    def post(self, request: Request) -> Response:
        key = request.headers["Idempotency-Key"]
        label = "commit-" + key
        SideEffect.objects.create(label=label)
        transaction.on_commit(lambda: seen.append(_committed_rows(label, key)))
        if dict(request.data).get("deferred_violation"):
            with connections["default"].cursor() as cursor:
                cursor.execute("INSERT INTO idem_test_deferred VALUES (1), (1)")
        return Response({"label": label}, status=201)


@csrf_exempt
@idempotent
def hook_function(request: HttpRequest) -> HttpResponse:
    key = request.headers["Idempotency-Key"]
    label = "commit-" + key
    SideEffect.objects.create(label=label)
    transaction.on_commit(lambda: seen.append(_committed_rows(label, key)))
    return HttpResponse(json.dumps({"label": label}), status=201, content_type="application/json")


urlpatterns = [
    path("hook/", HookView.as_view()),
    path("hook-fn/", hook_function),
]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    seen.clear()
    strategies.reset()
    yield
    strategies.reset()


@pytest.fixture(params=["db", "advisory_lock", "hybrid"])
def folding(request: pytest.FixtureRequest, settings: Any) -> str:
    """A strategy whose completion commits the view's transaction."""
    strategy = str(request.param)
    if strategy == "hybrid":
        request.applymarker(pytest.mark.redis)
        server: RedisServer = request.getfixturevalue("running_private_redis")
        request.getfixturevalue("forget_queued_drains")
        settings.IDEMPOTENCY = {
            "STRATEGY": "hybrid",
            "REDIS_URL": server.url,
            "REDIS_KEY_PREFIX": "fold-" + uuid.uuid4().hex,
            "HYBRID_DB_CHECK": "always",
        }
    else:
        settings.IDEMPOTENCY = {"STRATEGY": strategy}
    return strategy


@pytest.fixture
def api() -> APIClient:
    return token_client(UserFactory())


def _post(api: APIClient, key: str, route: str = "/hook/", **body: Any) -> Any:
    """POST to the DRF view with ``api``'s token, or to the plain view anonymously (it
    refuses a credential it did not authenticate)."""
    client = api if route == "/hook/" else APIClient()
    return client.post(route, body or {"amount": 1}, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_the_connection_can_commit_in_a_statement() -> None:
    connection = connections["default"]
    connection.ensure_connection()
    assert commits_in_statement(connection)


@pytest.mark.parametrize("route", ["/hook/", "/hook-fn/"])
def test_the_completion_carries_the_commit(folding: str, api: APIClient, route: str) -> None:
    """No COMMIT of its own: the one query that commits is the completion (``…; COMMIT``),
    the view's on_commit hook then sees its row and the completed key from another
    connection, and a retry replays."""
    key = uuid.uuid4().hex
    with queries_sent() as sent:
        first = _post(api, key, route)
    assert first.status_code == 201, first.content
    assert "COMMIT" not in sent, sent
    committing = [query for query in sent if "COMMIT" in query]
    assert len(committing) == 1 and committing[0].endswith("; COMMIT"), committing
    assert committing[0].startswith("WITH "), committing[0]
    assert sent[-1] == committing[0]  # nothing of the request after its commit
    # The hook ran once, after the commit, which was durable for others to read.
    if folding == "hybrid":
        assert seen == [{"effects": 1, "key": None, "outbox": True}]
    else:
        assert seen == [{"effects": 1, "key": COMPLETED, "outbox": False}]
    retry = _post(api, key, route)
    assert retry.status_code == 201 and replayed(retry)
    assert SideEffect.objects.filter(label="commit-" + key).count() == 1


def test_the_redis_strategy_keeps_djangos_commit(
    api: APIClient, redis_settings: Any, running_private_redis: RedisServer
) -> None:
    """Its completion goes to Redis after COMMIT: nothing to fold the COMMIT into."""
    redis_settings(running_private_redis.url)
    key = uuid.uuid4().hex
    with queries_sent() as sent:
        assert _post(api, key).status_code == 201
    assert "COMMIT" in sent and not any(query.endswith("; COMMIT") for query in sent)
    assert len(seen) == 1 and seen[0]["effects"] == 1


def test_inside_an_outer_transaction_the_commit_stays_the_callers(
    folding: str, api: APIClient
) -> None:
    """A session nested in an ``atomic`` block commits nothing itself: the caller's
    COMMIT, after the block, makes the view's row and the completion durable."""
    key = uuid.uuid4().hex
    with queries_sent() as sent, transaction.atomic():
        response = _post(api, key, "/hook-fn/")
        assert response.status_code == 201
        assert seen == []  # the hook waits for the outer COMMIT
        committed_early = [query for query in sent if "COMMIT" in query]
    assert committed_early == []
    assert sent[-1] == "COMMIT"
    assert len(seen) == 1 and seen[0]["effects"] == 1


def test_a_transaction_managed_by_hand_is_refused_before_the_claim(
    folding: str, api: APIClient
) -> None:
    """With autocommit off (``set_autocommit(False)``) Django has no on_commit, so the
    session could not tell when the response is durable: it refuses with a clear error
    before it claims anything, and the key is free once the caller is back in autocommit."""
    key = uuid.uuid4().hex
    transaction.set_autocommit(False)
    try:
        with (
            queries_sent() as sent,
            pytest.raises(
                transaction.TransactionManagementError, match="manual transaction management"
            ),
        ):
            _post(api, key, "/hook-fn/")
        assert not any("idempotency" in query for query in sent), sent
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    assert _committed_rows("commit-" + key, key) == {"effects": 0, "key": None, "outbox": False}
    assert _post(api, key, "/hook-fn/").status_code == 201


def test_server_side_binding_keeps_djangos_commit(
    api: APIClient, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Server-side binding prepares each statement, and a prepared statement holds one
    command: the completion and Django's COMMIT are then two round trips, as before."""
    settings.IDEMPOTENCY = {"STRATEGY": "db"}
    connection = connections["default"]
    options = {**connection.settings_dict.get("OPTIONS", {}), "server_side_binding": True}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    connection.close()
    try:
        connection.ensure_connection()
        assert not commits_in_statement(connection)
        key = uuid.uuid4().hex
        first = _post(api, key)
        assert first.status_code == 201
        assert seen == [{"effects": 1, "key": COMPLETED, "outbox": False}]
        assert _post(api, key).status_code == 201
    finally:
        connection.close()


@pytest.fixture
def deferred_violation() -> Iterator[None]:
    """A table whose unique constraint is checked at COMMIT (the view inserts a duplicate)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "CREATE TABLE idem_test_deferred (n int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
        )
    yield
    with connections["default"].cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS idem_test_deferred")


def test_a_commit_that_fails_rolls_everything_back(
    folding: str, api: APIClient, deferred_violation: None
) -> None:
    """The COMMIT in the completion's query fails (a deferred constraint): neither the
    view's row nor the response committed, the client gets a 503 (not a 500), the key is
    given back, and the retry runs the view."""
    key = uuid.uuid4().hex
    first = _post(api, key, deferred_violation=True)
    assert first.status_code == 503 and problem_slug(first) == "store-unavailable"
    assert seen == []
    assert _committed_rows("commit-" + key, key) == {"effects": 0, "key": None, "outbox": False}
    retry = _post(api, key)
    assert retry.status_code == 201 and not replayed(retry)
    assert SideEffect.objects.filter(label="commit-" + key).count() == 1


def test_a_lost_fence_commits_nothing(api: APIClient, settings: Any) -> None:
    """The db claim is taken over while its view runs (another token on the row): the
    completion's fence finds no row, its statement fails before the COMMIT, and the
    view's row is rolled back; the other owner's row is left as it is."""
    settings.IDEMPOTENCY = {"STRATEGY": "db"}
    key = uuid.uuid4().hex
    other = uuid.uuid4()

    def take_over(**kwargs: Any) -> None:
        # From another connection, as a takeover commits.
        name = connections["default"].settings_dict["NAME"]
        url = postgres_url()
        assert url is not None
        with psycopg.connect(url, dbname=name, autocommit=True) as conn:
            conn.execute(
                f"UPDATE {IdempotencyKey._meta.db_table} SET claim_token = %s WHERE key = %s",
                [other, key],
            )

    signals.key_claimed.connect(take_over, weak=False)
    try:
        with queries_sent() as sent:
            first = _post(api, key)
    finally:
        signals.key_claimed.disconnect(take_over)
    assert first.status_code == 409 and problem_slug(first) == "lease-lost", first.content
    assert any(query.endswith("; COMMIT") for query in sent)
    assert seen == []
    assert SideEffect.objects.filter(label="commit-" + key).count() == 0
    row = IdempotencyKey.objects.get(key=key)
    assert row.claim_token == other and row.status != COMPLETED


def test_a_receiver_that_raises_after_the_commit_leaves_the_key_completed(
    folding: str, api: APIClient
) -> None:
    """``response_stored`` is sent once the completion has committed: a receiver that
    raises is an error after COMMIT (like an on_commit hook's). The view's hook has run,
    the key stays completed, the retry replays."""
    key = uuid.uuid4().hex

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("a metrics receiver failed")

    signals.response_stored.connect(broken, weak=False)
    try:
        with pytest.raises(RuntimeError, match="a metrics receiver failed"):
            _post(api, key)
    finally:
        signals.response_stored.disconnect(broken)
    assert len(seen) == 1 and seen[0]["effects"] == 1
    retry = _post(api, key)
    assert retry.status_code == 201 and replayed(retry)
    assert SideEffect.objects.filter(label="commit-" + key).count() == 1


def test_only_the_marker_counts_as_not_stored() -> None:
    """Another error of the same class is not read as a refusal of the store."""
    connection = connections["default"]
    with pytest.raises(DataError) as marked, connection.cursor() as cursor:
        cursor.execute("SELECT CAST(%s AS integer)", [NOT_STORED_MARKER + "0"])
    with pytest.raises(DataError) as other, connection.cursor() as cursor:
        cursor.execute("SELECT CAST(%s AS integer)", ["not a number"])
    assert not_stored(marked.value) and not not_stored(other.value)
