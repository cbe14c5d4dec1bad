"""The ``redis`` strategy when a claim's outcome is unknown: a private ``redis-server`` stopped
with SIGSTOP while a request claims, so that its claim times out after it was sent. With the
default ``REDIS_FAILURE_MODE = "db"`` such a request used to run under the ``db`` strategy
beside the duplicate that held the key in Redis: two executions. Every run of the view body is
counted (``SideEffect`` rows), with real threads."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from django_idempotency.models import IdempotencyKey
from django_idempotency.strategies.redis.store import get_store
from tests.testapp.models import SideEffect

from ...support.api import post_json
from ...support.assertions import assert_problem
from ...support.gates import Background, Gate
from ...support.redis_servers import RedisServer
from ...support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def on_private_redis(redis_settings: Any, running_private_redis: RedisServer) -> Any:
    """``apply(**more)``: the strategy (``redis`` unless given) on the private server, with
    the default ``REDIS_FAILURE_MODE`` ``"db"``."""

    def apply(**more: Any) -> dict[str, Any]:
        more.setdefault("REDIS_FAILURE_MODE", "db")
        return redis_settings(running_private_redis.url, **more)

    return apply


def _post(key: str, path: str = "/gated/") -> Any:
    return Client().post(
        path, {"amount": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def _records() -> list[Any]:
    """The names of the records in Redis under the test's prefix."""
    store = get_store()
    return list(store.client.scan_iter(match=f"{store.prefix}:*:rec"))


def racer_of_a_hung_claim(server: RedisServer, gate: Gate) -> tuple[Any, Any, str]:
    """A request holds a key in Redis and waits in its view; Redis stops; a duplicate comes
    (its claim times out: the SET was sent, perhaps applied); Redis runs again and the view
    finishes. The holder's response, the duplicate's, and the key."""
    key = uuid.uuid4().hex
    holder = Background("/gated/", key)
    assert gate.entered.wait(timeout=30)
    with server.paused():
        racer = _post(key)
    gate.opened.set()
    return holder.result(), racer, key


@pytest.mark.urls("tests.support.gates")
def test_a_duplicate_whose_claim_times_out_is_503_and_the_view_runs_once(
    on_private_redis: Any, running_private_redis: RedisServer, gate: Gate
) -> None:
    on_private_redis()
    first, racer, key = racer_of_a_hung_claim(running_private_redis, gate)
    assert first.status_code == 201
    assert_problem(racer, 503, "store-unavailable")
    assert int(racer["Retry-After"]) >= 1
    assert SideEffect.objects.count() == 1, "the duplicate never ran under the db strategy"
    assert not IdempotencyKey.objects.exists()
    retry = _post(key)
    assert retry.status_code == 201 and retry["Idempotent-Replayed"] == "true"
    assert SideEffect.objects.count() == 1


def test_a_claim_applied_after_its_timeout_holds_the_key_until_its_lease_lapses(
    on_private_redis: Any, running_private_redis: RedisServer, api: APIClient
) -> None:
    server = running_private_redis
    on_private_redis(LOCK_TIMEOUT=1)
    key = uuid.uuid4().hex
    get_store().client.ping()  # connected: the claim is what reaches the stopped server
    with server.paused():
        first = post_json(api, key, {"amount": 1})
    assert_problem(first, 503, "store-unavailable")
    assert SideEffect.objects.count() == 0 and not IdempotencyKey.objects.exists()
    # Redis applied the claim once it ran again: the key is held, by nobody running.
    wait_until(lambda: len(_records()) == 1)
    assert post_json(api, key, {"amount": 1}).status_code == 409
    wait_until(lambda: not _records(), timeout=10)  # its lease (LOCK_TIMEOUT 1 s) lapsed
    again = post_json(api, key, {"amount": 1})
    assert again.status_code == 201
    assert SideEffect.objects.count() == 1


@pytest.mark.urls("tests.support.gates")
def test_a_completion_applied_after_the_rollback_is_deleted_before_the_next_claim(
    on_private_redis: Any, running_private_redis: RedisServer, gate: Gate
) -> None:
    """Redis stops while the view stores its response: the completion goes unanswered twice,
    the view's writes roll back (503), and the deletion of the record cannot be sent either.
    Redis applies the completion once it runs again; the process deletes it before its next
    claim, so the retry runs the view (once) instead of replaying a response whose writes
    were rolled back (or, when the completion never left the client, waiting for the lease of
    a claim nobody runs any more)."""
    on_private_redis()
    gate.opened.set()
    assert _post(uuid.uuid4().hex).status_code == 201  # the scripts are loaded
    gate.reset()
    key = uuid.uuid4().hex
    holder = Background("/gated/", key)
    assert gate.entered.wait(timeout=30)
    with running_private_redis.paused():
        gate.opened.set()
        first = holder.result()
    assert_problem(first, 503, "store-unavailable")
    assert SideEffect.objects.count() == 1, "rolled back"
    store = get_store()
    wait_until(lambda: _completed(store.get("anonymous", key)))  # the completion, applied late
    retry = _post(key)
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry, retry.content
    assert SideEffect.objects.count() == 2
    assert _post(key)["Idempotent-Replayed"] == "true"
    assert SideEffect.objects.count() == 2


def _completed(record: Any) -> bool:
    """Whether ``record`` holds a response (prepared before COMMIT, or completed)."""
    return record is not None and (record.completed or record.prepared)
