"""API clients and the requests the strategy tests send through the test views."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.test import Client
from rest_framework.test import APIClient

from django_idempotency.protocol.replay import REPLAYED_HEADER
from django_idempotency.strategies.redis.store import get_store
from django_idempotency.strategies.waiting import hub

from ..testapp import holds
from .threads import in_background, run_at_once
from .waiting import wait_until

T = TypeVar("T")


def api_client(user: Any = None) -> APIClient:
    """An ``APIClient``, authenticated as ``user`` when one is given."""
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def token_client(user: Any = None, **kwargs: Any) -> APIClient:
    """An ``APIClient`` that sends ``user``'s DRF token, when a user is given."""
    client = APIClient(**kwargs)
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {user.auth_token.key}")
    return client


def post_json(client: Client, key: str, body: dict[str, Any], path: str = "/t/drf/") -> Any:
    """POST ``body`` as JSON to ``path`` with ``Idempotency-Key: key``."""
    return client.post(
        path, json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def replayed(response: Any) -> bool:
    return response.headers.get(REPLAYED_HEADER) == "true"


def wait_in_progress(scope: str, key: str) -> None:
    """Until the Redis record of ``key`` is in progress (its owner is inside the view);
    the deadline is for a request that never claims, not for a slow one."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        record = get_store().get(scope, key)
        if record is not None and record.status == "in_progress":
            return
        time.sleep(0.01)
    raise AssertionError("the first request never claimed the key")


def assert_runs_once_and_replays(client: Client, key: str) -> Any:
    """A new ``key`` (body ``{"amount": 5}`` on the DRF test view) answers 201, its retry
    replays the same bytes, and another body under it is a 422; returns the first answer."""
    first = post_json(client, key, {"amount": 5})
    assert first.status_code == 201 and not replayed(first)
    again = post_json(client, key, {"amount": 5})
    assert again.status_code == 201 and replayed(again) and again.content == first.content
    assert post_json(client, key, {"amount": 6}).status_code == 422
    return first


def race_held(
    n: int,
    send: Callable[[int, dict[str, Any]], T],
    hold: str,
    waiting: Callable[[], int] = hub.waiters,
) -> list[T]:
    """``send(i, {"hold": hold})`` from ``n`` threads released together (``run_at_once``);
    the results in thread order. The request that runs the test view waits in it until
    every request has its answer, waits for another's (``waiting()`` of them: by default
    this process's waiting hub, under ``WAIT``) or is in the view itself (a second
    execution is let go too, for the test's counts to see). So every duplicate arrives
    while the first one runs, however slow the machine (a view that slept for a while
    promised nothing). ``waiting`` is asked from another thread (its own connection)."""
    answered = [0]
    lock = threading.Lock()

    def everyone() -> bool:
        return answered[0] + waiting() + holds.arrived(hold) >= n

    def work(i: int) -> T:
        try:
            return send(i, {"hold": hold})
        finally:
            with lock:
                answered[0] += 1

    def release() -> None:
        try:
            wait_until(lambda: holds.released(hold) or everyone(), timeout=holds.LIMIT)
        finally:
            holds.release(hold)

    releaser = in_background(release)
    try:
        return run_at_once(n, work)
    finally:
        holds.release(hold)
        releaser.result(timeout=holds.LIMIT + 10)


def advisory_waiters(alias: str = "default") -> int:
    """How many sessions wait for an advisory lock on ``alias``'s PostgreSQL database
    (the ``advisory_lock`` strategy's duplicates queue on their key's lock)."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND NOT l.granted "
            "AND d.datname = current_database()"
        )
        (count,) = cursor.fetchone()
    return int(count)
