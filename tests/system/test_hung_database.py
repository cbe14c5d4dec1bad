"""PostgreSQL that hangs instead of failing: the requests' connections reach it through a
proxy (tests/support/proxy.py) that falls silent, the sockets open, while a request
claims its key or completes it.

Each request ends in a bounded time (``DATABASE_TIMEOUT`` cuts the library's statement,
libpq's ``connect_timeout`` a new connection) with a documented 503, never a 500 and never
a hang; and the view body, counted in a ledger outside every transaction
(``faults.runs``), runs once per key across the request, its duplicate and the retries.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from rest_framework.test import APIClient

from django_idempotency import strategies
from django_idempotency.store.sql.deadline import watchdog
from django_idempotency.strategies.redis.strategy import RedisClaim
from django_idempotency.strategies.redis.suspects import suspects
from tests.testapp.models import SideEffect

from ..support import faults, services
from ..support.api import replayed
from ..support.assertions import problem_slug
from ..support.faults import Requester, settle
from ..support.proxy import FaultProxy, renewing_link, through_proxy
from ..support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.urls("tests.support.faults"),
    pytest.mark.django_db(transaction=True),
]

#: The documented 503 problem types.
DOCUMENTED_503 = {"store-unavailable", "transient-conflict", "database-unavailable"}
#: Seconds the library's statements may wait (the setting under test).
TIMEOUT = 1


@pytest.fixture
def proxied(
    settings: Any, api: APIClient, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[tuple[FaultProxy, Requester]]:
    """The db strategy (or the one of an indirect parameter, ``redis`` on the shared Redis)
    with ``DATABASE_TIMEOUT`` = 1 s and a short lease; persistent connections with libpq's
    ``connect_timeout`` (as docs/operations.md recommends), through a proxy; and a requester
    connected through it."""
    api.raise_request_exception = False
    strategy = getattr(request, "param", "db")
    settings.IDEMPOTENCY = {"STRATEGY": strategy, "DATABASE_TIMEOUT": TIMEOUT, "LOCK_TIMEOUT": 3}
    if strategy in ("redis", "hybrid"):
        settings.IDEMPOTENCY.update(
            REDIS_URL=services.REDIS_URL, REDIS_KEY_PREFIX=request.getfixturevalue("redis_prefix")
        )
    strategies.reset()
    faults.reset()
    database = connections["default"].settings_dict
    monkeypatch.setitem(database, "CONN_MAX_AGE", 600)
    with through_proxy("default") as proxy:
        # Its first connection is made while the proxy still answers, however long a busy
        # machine takes; the connections made after it are bounded by connect_timeout.
        requester = Requester(api)
        monkeypatch.setitem(database, "OPTIONS", {**database["OPTIONS"], "connect_timeout": 2})
        try:
            yield proxy, requester
        finally:
            proxy.heal()
            requester.stop()
    faults.reset()
    strategies.reset()


def committed(key: str) -> int:
    return SideEffect.objects.filter(label=key).count()


def test_a_claim_that_meets_a_silent_database(
    proxied: tuple[FaultProxy, Requester],
) -> None:
    """The claim is sent into the silence: cut after DATABASE_TIMEOUT, a 503; the
    duplicate, on a new connection, stops at connect_timeout, a 503. The claim reaches
    the server once the network heals (its outcome was unknown, not failed): the retries
    wait for its lease, then one of them runs the view, once."""
    proxy, requester = proxied
    key = faults.new_key()
    cut = watchdog.cut
    proxy.silence()
    first = requester.ask(key)
    duplicate = requester.ask(key)
    proxy.heal()
    for answer in (first, duplicate):
        assert answer.status_code == 503, answer.content
        assert problem_slug(answer) in DOCUMENTED_503
    assert watchdog.cut > cut
    assert faults.runs[key] == 0
    final = settle(requester, key)
    assert final.status_code == 201 and not replayed(final)
    again = requester.ask(key)
    assert again.status_code == 201 and replayed(again)
    assert faults.runs[key] == 1 and committed(key) == 1


@pytest.mark.usefixtures("forget_queued_drains")
@pytest.mark.parametrize("proxied", ["hybrid"], indirect=True)
def test_a_hybrid_replay_never_waits_on_a_silent_database_for_the_suspect_read(
    proxied: tuple[FaultProxy, Requester],
) -> None:
    """The read of the suspect rows (due here: a new process) is made only for a key new
    in Redis, whose view writes in the database anyway: a replay from Redis while the
    database is silent is answered without a statement sent there (none is cut)."""
    proxy, requester = proxied
    key = faults.new_key()
    first = requester.ask(key)
    assert first.status_code == 201, first.content
    suspects.forget()  # the read is due
    cut = watchdog.cut
    proxy.silence()
    again = requester.ask(key)
    proxy.heal()
    assert again.status_code == 201 and replayed(again), again.content
    assert watchdog.cut == cut, "no statement was sent into the silence"
    assert suspects.read_due(), "and the read was not made: still due"
    assert faults.runs[key] == 1


def test_a_completion_that_meets_a_silent_database(
    proxied: tuple[FaultProxy, Requester],
) -> None:
    """The view has written; the network falls silent before its completion (which
    carries the COMMIT) is answered: cut after DATABASE_TIMEOUT, a 503
    database-unavailable, whose detail says a committed request is replayed, not that it
    failed. The COMMIT reaches the server once the network heals: the retry replays the
    response of the one run of the view."""
    proxy, requester = proxied
    key = faults.new_key()
    faults.interference.append(lambda _key: proxy.silence())
    faults.plan.append("interfere_late")
    first = requester.ask(key)
    duplicate = requester.ask(key)
    proxy.heal()
    assert first.status_code == 503 and problem_slug(first) == "database-unavailable"
    assert "replayed" in first.json()["detail"]
    assert duplicate.status_code in (409, 503), duplicate.content
    assert problem_slug(duplicate) in {"request-in-progress", *DOCUMENTED_503}
    final = settle(requester, key)
    assert final.status_code == 201 and replayed(final), final.content
    assert faults.runs[key] == 1 and committed(key) == 1
    assert faults.body_of(final)["effect"] == SideEffect.objects.get(label=key).pk


@pytest.mark.redis
@pytest.mark.parametrize("proxied", ["redis"], indirect=True)
def test_a_redis_commit_cut_by_the_timeout_is_unknown_not_discarded(
    proxied: tuple[FaultProxy, Requester], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``redis`` the response is in Redis (prepared) before COMMIT; the network falls
    silent just then, and the COMMIT is cut after DATABASE_TIMEOUT: its outcome is unknown,
    so the prepared record is kept (before, it was deleted as if the COMMIT had failed). The
    COMMIT reaches the server once the network heals: the retry learns from the database
    that it committed and replays the one run of the view (before: it ran again, and a
    second effect committed)."""
    proxy, requester = proxied
    key = faults.new_key()
    store, once = RedisClaim.store, threading.Event()

    def prepared_then_silent(self: RedisClaim, response: Any, *, commit: bool) -> None:
        store(self, response, commit=commit)
        if self.attempt.key == key and not once.is_set():
            once.set()
            proxy.silence()

    monkeypatch.setattr(RedisClaim, "store", prepared_then_silent)
    cut = watchdog.cut
    first = requester.ask(key)
    proxy.heal()
    assert first.status_code == 503 and problem_slug(first) == "database-unavailable"
    assert watchdog.cut > cut, "the COMMIT was cut"
    final = settle(requester, key)
    assert final.status_code == 201 and replayed(final), final.content
    assert faults.runs[key] == 1 and committed(key) == 1
    assert faults.body_of(final)["effect"] == SideEffect.objects.get(label=key).pk


def _db_now() -> float:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM statement_timestamp())")
        return float(cursor.fetchone()[0])


def test_a_stalled_heartbeat_connection_costs_no_lease(
    settings: Any, api: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three requests run their views on persistent connections; only the heartbeat's
    connection falls silent, for twice LOCK_TIMEOUT by the database's clock. Their leases
    are renewed on a new connection all the same: a duplicate of each then gets a 409 (not
    a takeover that would run the view again), and each request completes its one run."""
    api.raise_request_exception = False
    # No DATABASE_TIMEOUT: the heartbeat's own bound is what is tested. A 6 s lease, renewed
    # every 2 s, a stalled renewal given up after 1 s: the renewals on the new connection
    # have 4 s before a lease could lapse (with 3 s, a starved thread on a loaded machine
    # missed that window and a duplicate took a live request's key over).
    lock_timeout = 6
    settings.IDEMPOTENCY = {
        "STRATEGY": "db",
        "DATABASE_TIMEOUT": None,
        "LOCK_TIMEOUT": lock_timeout,
    }
    strategies.reset()
    faults.reset()
    database = connections["default"].settings_dict
    monkeypatch.setitem(database, "CONN_MAX_AGE", 600)
    release = threading.Event()

    def hold(_key: str) -> None:
        release.wait(faults.HANG)

    faults.interference.append(hold)
    faults.plan.extend(["interfere"] * 3)
    keys = [faults.new_key() for _ in range(3)]
    with through_proxy("default") as proxy:
        requesters = [Requester(api) for _ in range(4)]
        try:
            for requester, key in zip(requesters, keys, strict=False):
                requester.send(key)
            wait_until(lambda: all(faults.runs[key] == 1 for key in keys), timeout=faults.HANG)
            stalled = renewing_link(proxy, timeout=faults.HANG)
            stalled.silence()
            silent_since = _db_now()
            wait_until(lambda: _db_now() > silent_since + 2 * lock_timeout, timeout=faults.HANG)
            duplicates = [requesters[3].ask(key) for key in keys]
            assert stalled.silent and not stalled.closed
            release.set()
            firsts = [requester.answer() for requester in requesters[:3]]
            retries = [requesters[3].ask(key) for key in keys]
        finally:
            release.set()
            proxy.heal()
            for requester in requesters:
                requester.stop()
    for duplicate in duplicates:
        assert duplicate.status_code == 409, duplicate.content
        assert problem_slug(duplicate) == "request-in-progress"
    for first, retry in zip(firsts, retries, strict=True):
        assert first.status_code == 201 and not replayed(first), first.content
        assert retry.status_code == 201 and replayed(retry)
    assert all(faults.runs[key] == 1 and committed(key) == 1 for key in keys)
    faults.reset()
    strategies.reset()
