"""WAIT in the engine and its wake-ups (django_idempotency.strategies.waiting), in one process.

The gunicorn races are in tests/system/test_wait_race.py; here: no wait for a mismatch, the waiter
bound, the timeout, a release taken over by one waiter, and the listeners delivering a
notification sent from another connection.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections
from django.http import HttpResponse
from django.test import override_settings

from django_idempotency import signals
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.engine import handle
from django_idempotency.protocol.keys import key_digest
from django_idempotency.protocol.options import Options
from django_idempotency.protocol.replay import REPLAYED_HEADER
from django_idempotency.strategies import waiting
from tests.protocol.test_engine import request
from tests.support.waiting import wait_until
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def stop_listeners() -> Iterator[None]:
    """A listener's connection would keep the test database from being dropped."""
    yield
    waiting.reset_listeners()


@pytest.fixture
def events() -> Iterator[list[str]]:
    names = ["wait_started", "wait_replayed", "wait_timed_out", "request_conflict"]
    seen: list[str] = []
    receivers = {}
    for name in names:

        def receive(sender: Any, _name: str = name, **kwargs: Any) -> None:
            seen.append(_name)

        receivers[name] = receive
        getattr(signals, name).connect(receive, weak=False, dispatch_uid=f"test-{name}")
    yield seen
    for name in names:
        getattr(signals, name).disconnect(dispatch_uid=f"test-{name}")


def held(key: str, fingerprint_of: Any = None) -> None:
    """Another request holds ``key`` in progress (the default scope, anonymous)."""
    from django_idempotency.protocol.fingerprint import fingerprint

    IdempotencyKey.objects.claim(
        "anonymous", key, fingerprint(fingerprint_of or request(key)), ttl=60, lock_timeout=60
    )


def ok(label: str = "run") -> Callable[[], HttpResponse]:
    def run() -> HttpResponse:
        SideEffect.objects.create(label=label)
        return HttpResponse(b'{"id": 1}', status=201, content_type="application/json")

    return run


#: A wait no request of these tests sits out: an answer in less than half of it came
#: without waiting, however busy the machine.
LONG_WAIT = 60


@override_settings(IDEMPOTENCY={"WAIT": LONG_WAIT})
def test_a_different_fingerprint_is_422_without_waiting(events: list[str]) -> None:
    held("k-mismatch")
    started = time.monotonic()
    response = handle(request("k-mismatch", body={"amount": 7}), ok())
    assert response.status_code == 422
    assert time.monotonic() - started < LONG_WAIT / 2
    assert "wait_started" not in events


@override_settings(IDEMPOTENCY={"WAIT": LONG_WAIT, "WAIT_MAX_WAITERS": 1})
def test_a_waiter_past_the_bound_gets_the_409_at_once(events: list[str]) -> None:
    held("k-bound")
    assert waiting.slots.acquire()  # the one slot is taken by another waiter
    try:
        started = time.monotonic()
        response = handle(request("k-bound"), ok())
        assert response.status_code == 409
        assert time.monotonic() - started < LONG_WAIT / 2
        assert events == ["request_conflict"]
        assert waiting.slots.taken == 1
    finally:
        waiting.slots.release()
    assert waiting.slots.taken == 0


@override_settings(IDEMPOTENCY={"WAIT": 0.4, "WAIT_POLL_INTERVAL": 0.1})
def test_the_wait_runs_out_into_the_409(events: list[str]) -> None:
    held("k-timeout")
    started = time.monotonic()
    response = handle(request("k-timeout"), ok())
    elapsed = time.monotonic() - started
    assert response.status_code == 409
    assert "Retry-After" in response
    assert 0.4 <= elapsed < 30  # after WAIT; the upper bound tells a hang only
    assert events == ["wait_started", "wait_timed_out", "request_conflict"]
    assert waiting.slots.taken == 0
    assert waiting.hub.waiters() == 0


@pytest.mark.parametrize("failure", ["raises", "500"])
@override_settings(IDEMPOTENCY={"WAIT": LONG_WAIT, "WAIT_POLL_INTERVAL": 600})
def test_a_release_is_taken_over_by_one_waiter(failure: str, events: list[str]) -> None:
    """The first execution fails; of three waiters one runs the view, two replay it. The
    poll interval is longer than the test: only the wake-ups can answer them."""
    entered, go = threading.Event(), threading.Event()
    runs: list[str] = []

    def first() -> HttpResponse:
        runs.append("first")
        entered.set()
        go.wait(60)
        if failure == "raises":
            raise RuntimeError("the first execution fails")
        return HttpResponse(b"down", status=500)

    def later() -> HttpResponse:
        runs.append("later")
        time.sleep(0.2)
        return ok("later")()

    answers: list[Any] = []

    def call(view: Callable[[], HttpResponse]) -> None:
        try:
            answers.append(handle(request("k-release"), view))
        except RuntimeError as exc:
            answers.append(exc)
        finally:
            connections.close_all()

    owner = threading.Thread(target=call, args=(first,))
    owner.start()
    assert entered.wait(60)
    waiters = [threading.Thread(target=call, args=(later,)) for _ in range(3)]
    for thread in waiters:
        thread.start()
    wait_until(lambda: waiting.slots.taken >= 3, timeout=60)  # all three wait
    started = time.monotonic()
    go.set()
    for thread in [owner, *waiters]:
        thread.join(120)
    assert time.monotonic() - started < LONG_WAIT / 2  # woken: no poll (600 s), no 409
    assert runs == ["first", "later"]
    replayed = sorted(
        a.get(REPLAYED_HEADER) or ""
        for a in answers
        if isinstance(a, HttpResponse) and a.status_code == 201
    )
    assert replayed == ["", "true", "true"]
    assert SideEffect.objects.filter(label="later").count() == 1
    assert events.count("wait_started") == 3
    assert events.count("wait_replayed") == 2
    assert waiting.slots.taken == 0


@pytest.mark.postgres
def test_the_postgres_listener_delivers_a_notify_from_another_connection() -> None:
    if connections["default"].vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    listener = waiting.postgres_listener("default")
    assert listener.ensure(5)
    digest = key_digest("anonymous", uuid.uuid4().hex)
    params = dict(connections["default"].get_connection_params())
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    with waiting.hub.subscribe(digest) as woken, psycopg.connect(**params) as other:
        other.execute("SELECT pg_notify(%s, %s)", [waiting.CHANNEL, digest])
        assert not woken.wait(0.3), "delivered before COMMIT"
        other.commit()
        assert woken.wait(3)


@pytest.mark.redis
def test_the_redis_listener_delivers_a_publish(redis_settings: Any, shared_redis_url: str) -> None:
    from django_idempotency.strategies.redis.store import get_store

    redis_settings(shared_redis_url)
    store = get_store()
    listener = waiting.redis_listener(store)
    assert listener.ensure(5)
    key = uuid.uuid4().hex
    with waiting.hub.subscribe(key_digest("user:1", key)) as woken:
        store.notify("user:1", key)
        assert woken.wait(3)


def test_options_and_the_attempt_carry_the_wait() -> None:
    from django_idempotency.protocol.engine import IdempotentRequest
    from django_idempotency.protocol.scope import default_scope

    with override_settings(IDEMPOTENCY={"WAIT": 2}):
        idem = IdempotentRequest.from_request(request("k-opt"), default_scope, Options())
        assert idem is not None and idem.attempt.wait == 2
        idem = IdempotentRequest.from_request(request("k-opt"), default_scope, Options(wait=0))
        assert idem is not None and idem.attempt.wait == 0


@pytest.mark.redis_cluster
def test_the_redis_listener_on_a_cluster(
    redis_settings: Any, redis_cluster: Any, redis_prefix: str
) -> None:
    """On a cluster the PUBLISH reaches the subscriber whichever nodes the two use."""
    from django_idempotency.strategies.redis.store import get_store

    redis_settings(redis_cluster.url, REDIS_CLUSTER=True, REDIS_SOCKET_TIMEOUT=2)
    store = get_store()
    listener = waiting.redis_listener(store)
    assert listener.ensure(10)
    for _ in range(5):  # keys in different slots
        key = uuid.uuid4().hex
        with waiting.hub.subscribe(key_digest("user:1", key)) as woken:
            store.notify("user:1", key)
            assert woken.wait(3)


def test_a_redis_that_refuses_costs_no_request_a_wait_for_its_listener(
    redis_settings: Any,
) -> None:
    """The call that starts the listener waits for its first attempt, which a refused
    connection ends at once; every later call answers at once while the listener tries
    again: a Redis that is down (the ``redis`` strategy falling back to ``db``) costs no
    waiting request the listener's timeout (it polls)."""
    from django_idempotency.strategies.redis.store import get_store

    from ..support.redis_servers import closed_port_url

    redis_settings(closed_port_url())
    listener = waiting.redis_listener(get_store())
    started = time.monotonic()
    assert listener.ensure(60) is False
    assert listener.ensure(60) is False
    assert time.monotonic() - started < 30  # the timeouts were not waited out


def test_a_listener_that_hangs_costs_only_the_request_that_starts_it_a_wait() -> None:
    """A store that accepts and never answers: the first call waits its timeout, every
    later one answers at once (it is not listening) instead of waiting again."""
    release = threading.Event()

    class Hanging(waiting.Listener):
        def listen(self, ready: threading.Event, stop: threading.Event) -> None:
            release.wait()

    listener = Hanging("hanging")
    try:
        assert listener.ensure(0.01) is False
        started = time.monotonic()
        assert listener.ensure(60) is False
        assert time.monotonic() - started < 30  # not the 60 s of its timeout
    finally:
        listener.stop(timeout=0)
        release.set()
