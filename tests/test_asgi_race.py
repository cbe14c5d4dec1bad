"""Async views under a real ASGI server (uvicorn, two worker processes): concurrent
duplicates of one key, sent from real threads at one moment, charge exactly once.

Every test counts the side effect (rows in ``payments_charge``) afterwards, for
``@idempotent`` on an ``async def`` view and for ``IdempotencyMiddleware`` on the async
stack, over an ``async def`` view and over a plain sync view (which Django runs in a thread
of its own, with the middleware's session), with the ``db``, ``redis`` and ``hybrid``
strategies.
"""

from __future__ import annotations

import uuid

import pytest

from .support.asgi import uvicorn_server
from .support.databases import count_rows
from .support.example import race, race_summary, request, scratch_database, split_race
from .support.redis_servers import RedisServer

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.django_db(transaction=False)]

CHARGE = {"amount": 1999, "currency": "EUR"}
CLIENTS = 20
ROUTES = [
    pytest.param("/api/async/charges/", {}, id="decorator"),
    pytest.param("/api/middleware/charges/", {"EXAMPLE_MIDDLEWARE": "1"}, id="middleware"),
    pytest.param(
        "/api/middleware/sync-charges/", {"EXAMPLE_MIDDLEWARE": "1"}, id="middleware-sync"
    ),
]


def _redis_env(strategy: str, redis: RedisServer | None) -> dict[str, str]:
    if strategy == "db":
        return {}
    assert redis is not None
    return {
        "REDIS_URL": redis.url,
        "CELERY_BROKER_URL": redis.url,  # the hybrid strategy's drain messages
        "IDEMPOTENCY_REDIS_PREFIX": "asgi-" + uuid.uuid4().hex[:8],
    }


RACES = 3


def _race_once(server_url: str, route: str) -> bool:
    """One race of ``CLIENTS`` duplicates on a new key: one fresh 201, the others replays
    or 409s of it, and a replay afterwards. Whether any duplicate overlapped the first."""
    key = f"pay-{uuid.uuid4().hex[:8]}"
    url = server_url + route
    results = race(url, n=CLIENTS, key=key, body=CHARGE)
    fresh, replays, conflicts = split_race(results)
    summary = race_summary(results)
    assert len(fresh) == 1, summary
    assert len(fresh) + len(replays) + len(conflicts) == CLIENTS, summary
    assert all(body["id"] == fresh[0]["id"] for body in replays)
    status, body = request(url, key=key, body=CHARGE)
    assert status == 201 and body["_headers"]["idempotent-replayed"] == "true", body
    assert body["id"] == fresh[0]["id"]
    return bool(conflicts)


def _race(server_url: str, route: str) -> int:
    """Races on new keys until the duplicates of one overlapped its first request (a 409
    among the answers), at most ``RACES``: on a loaded machine the first request may finish
    before the others arrive. The number of races, hence of charges expected."""
    for races in range(1, RACES + 1):
        if _race_once(server_url, route):
            return races
    raise AssertionError(f"the duplicates did not overlap in {RACES} races")


@pytest.mark.parametrize(("route", "extra"), ROUTES)
def test_db_strategy_charges_once(route: str, extra: dict[str, str]) -> None:
    with (
        scratch_database("postgres") as db,
        uvicorn_server(db, strategy="db", psp_delay_ms=300, env=extra) as server,
    ):
        races = _race(server.url, route)
        assert count_rows(db, "payments_charge") == races
        # Without a key the view runs every time (and a key is required here).
        status, body = request(server.url + route, body=CHARGE)
        assert status == 400 and body["type"].endswith("/missing-key"), body
        assert "Traceback" not in server.log()


@pytest.mark.redis
@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
@pytest.mark.parametrize(("route", "extra"), ROUTES)
def test_redis_strategies_charge_once(
    running_private_redis: RedisServer, strategy: str, route: str, extra: dict[str, str]
) -> None:
    with (
        scratch_database("postgres") as db,
        uvicorn_server(
            db,
            strategy=strategy,
            psp_delay_ms=300,
            env={**extra, **_redis_env(strategy, running_private_redis)},
        ) as server,
    ):
        races = _race(server.url, route)
        assert count_rows(db, "payments_charge") == races
        assert "Traceback" not in server.log()


def test_an_exception_after_the_write_rolls_it_back_and_releases_the_key() -> None:
    """The view's async ORM write is in the claim's transaction: a 500 after it leaves no
    row, and the key is free for the retry."""
    with (
        scratch_database("postgres") as db,
        uvicorn_server(db, workers=1) as server,
    ):
        url = server.url + "/api/async/charges/"
        status, _ = request(url, key="boom", body={**CHARGE, "fail_after_write": True})
        assert status == 500
        assert count_rows(db, "payments_charge") == 0
        status, body = request(url, key="boom", body=CHARGE)
        assert status == 201 and "idempotent-replayed" not in body["_headers"], body
        assert count_rows(db, "payments_charge") == 1


@pytest.mark.parametrize(("route", "extra"), ROUTES)
def test_duplicates_wait_for_the_answer_under_uvicorn(route: str, extra: dict[str, str]) -> None:
    """``IDEMPOTENCY_WAIT=5``: the duplicates of a 500 ms request wait for its answer (each
    in the thread Django runs its session in, not on the event loop) and replay it; none
    gets a 409. ``WAIT_MAX_WAITERS`` (16 by default) bounds the waiters of one process, and
    the kernel may hand nearly all 20 connections to one of the two workers: room for every
    duplicate there keeps the test about waiting, not about where the requests landed."""
    env = {**extra, "IDEMPOTENCY_WAIT": "5", "IDEMPOTENCY_WAIT_MAX_WAITERS": str(CLIENTS)}
    with (
        scratch_database("postgres") as db,
        uvicorn_server(db, strategy="db", psp_delay_ms=500, env=env) as server,
    ):
        key = f"pay-{uuid.uuid4().hex[:8]}"
        results = race(server.url + route, n=CLIENTS, key=key, body=CHARGE)
        fresh, replays, conflicts = split_race(results)
        assert len(fresh) == 1 and not conflicts, race_summary(results)
        assert len(replays) == CLIENTS - 1
        assert all(body["id"] == fresh[0]["id"] for body in replays)
        assert count_rows(db, "payments_charge") == 1
        assert "Traceback" not in server.log()
