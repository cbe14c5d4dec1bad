"""The ``hybrid`` strategy through Redis episodes, with the default ``HYBRID_DB_CHECK =
"after_loss"``, on a private ``redis-server`` and the real PostgreSQL database.

* A claim whose outcome is unknown (the server stopped with SIGSTOP) answers 503: the
  duplicate of a running request never runs under the ``db`` strategy.
* Keys that fell back to PostgreSQL while Redis refused (the URL of a closed port), and a
  key whose completed record could not be written to Redis after its commit (an ACL that
  refuses ``SET`` for a moment), are looked up in PostgreSQL when Redis answers again, in this
  process and, through their suspect marks, in any other, although Redis lost nothing (no
  flush, no restart: the loss check has nothing to see). They used to run the view again.

Every run of a view body is counted (``SideEffect`` rows), with real threads.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from django_idempotency.conf import conf
from django_idempotency.models import IdempotencyKey, IdempotencyOutbox, IdempotencySuspect
from django_idempotency.strategies.hybrid import HybridClaim
from django_idempotency.strategies.redis.store import get_client, get_store
from django_idempotency.strategies.redis.suspects import suspects
from tests.testapp.models import SideEffect

from ..support import faults
from ..support.api import api_client, post_json, replayed
from ..support.assertions import assert_problem
from ..support.factories import UserFactory
from ..support.gates import Background, Gate
from ..support.redis_servers import RedisClusterNodes, RedisServer, closed_port_url
from ..support.threads import run_at_once
from ..support.waiting import wait_until

pytestmark = [
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("forget_queued_drains"),
]


@pytest.fixture
def hybrid(redis_settings: Any, running_private_redis: RedisServer) -> Any:
    """``hybrid(**more)``: the hybrid strategy on the private server, default settings."""

    def apply(**more: Any) -> dict[str, Any]:
        more.setdefault("STRATEGY", "hybrid")
        more.setdefault("REDIS_URL", running_private_redis.url)
        return redis_settings(more.pop("REDIS_URL"), **more)

    apply()
    return apply


def _quiet() -> None:
    """The loss marker of a server that has lost nothing for a while: the loss check has
    nothing to report, so only what this change adds can send a claim to PostgreSQL."""
    client, store = get_client(), get_store()
    info = client.info("server") | client.info("stats")
    marker, _checked, suspect = store.loss_keys()
    client.set(marker, f"{info['run_id']} {info['evicted_keys']}")
    client.delete(suspect)


def _post(key: str, path: str = "/gated/") -> Any:
    return Client().post(
        path, {"amount": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


@pytest.mark.urls("tests.support.gates")
def test_a_duplicate_whose_claim_times_out_is_503_and_the_view_runs_once(
    hybrid: Any, running_private_redis: RedisServer, gate: Gate
) -> None:
    key = uuid.uuid4().hex
    holder = Background("/gated/", key)
    assert gate.entered.wait(timeout=30)
    with running_private_redis.paused():
        racer = _post(key)
    gate.opened.set()
    assert holder.result().status_code == 201
    assert_problem(racer, 503, "store-unavailable")
    assert int(racer["Retry-After"]) >= 1
    assert SideEffect.objects.count() == 1, "the duplicate never ran under the db strategy"
    assert not IdempotencyKey.objects.exists(), "nothing went to the db strategy"
    retry = _post(key)
    assert retry.status_code == 201 and replayed(retry)
    assert SideEffect.objects.count() == 1


def test_keys_that_fell_back_are_looked_up_in_postgresql_in_every_process(
    hybrid: Any, api: APIClient
) -> None:
    post_json(api, uuid.uuid4().hex, {"amount": 1})  # the marker exists
    _quiet()
    keys = [uuid.uuid4().hex for _ in range(3)]
    hybrid(REDIS_URL=closed_port_url())  # Redis refuses: the db strategy takes the keys
    first = {key: post_json(api, key, {"amount": 2}) for key in keys}
    assert all(response.status_code == 201 for response in first.values())
    assert IdempotencyKey.objects.filter(key__in=keys, status="completed").count() == 3
    hybrid()  # Redis answers again; it lost nothing
    _quiet()

    # This process remembers them.
    again = post_json(api, keys[0], {"amount": 2})
    assert again.status_code == 201 and replayed(again), again.content
    assert again.content == first[keys[0]].content
    # Its claim above wrote their marks to Redis: a process that never saw the episode
    # looks them up in PostgreSQL too.
    suspects.forget()
    for key in keys[1:]:
        retry = post_json(api, key, {"amount": 2})
        assert retry.status_code == 201 and replayed(retry), retry.content
        assert retry.content == first[key].content
    assert SideEffect.objects.count() == 1 + 3, "no fallen-back key ran twice"
    # A new key still costs no PostgreSQL read: it has no mark.
    store = get_store()
    assert get_client().exists(store.suspect_key(*_scope_of(keys[1])))
    assert not get_client().exists(store.suspect_key(*_scope_of(keys[1])[:1], "new"))


class _Clock:
    """The suspects' clock, moved by the test (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fall_back(api: APIClient, hybrid: Any, keys: list[str]) -> dict[str, Any]:
    """The keys' first requests while Redis refuses (the db strategy runs them), then Redis
    answers again, having lost nothing."""
    post_json(api, uuid.uuid4().hex, {"amount": 1})  # the marker exists
    _quiet()
    hybrid(REDIS_URL=closed_port_url())
    first = {key: post_json(api, key, {"amount": 2}) for key in keys}
    assert all(response.status_code == 201 for response in first.values())
    hybrid()
    _quiet()
    return first


def test_keys_that_fell_back_are_looked_up_after_the_process_that_handled_them_ended(
    hybrid: Any, api: APIClient
) -> None:
    keys = [uuid.uuid4().hex for _ in range(3)]
    first = _fall_back(api, hybrid, keys)
    assert IdempotencySuspect.objects.filter(key__in=keys).count() == 3
    suspects.forget()  # the process ended before Redis answered it again; a new one runs
    for key in keys:
        retry = post_json(api, key, {"amount": 2})
        assert retry.status_code == 201 and replayed(retry), retry.content
        assert retry.content == first[key].content
    assert SideEffect.objects.count() == 1 + 3, "no fallen-back key ran twice"
    # The first claim wrote their marks to Redis and deleted the rows they cover.
    store = get_store()
    assert all(get_client().exists(store.suspect_key(*_scope_of(key))) for key in keys)
    assert not IdempotencySuspect.objects.filter(key__in=keys).exists()


def test_a_process_that_reaches_redis_learns_of_another_s_keys_at_its_next_read(
    hybrid: Any, api: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that never lost Redis reads the rows once every ``read_interval``: a key
    another process handled without Redis (and has not marked there yet) is looked up in
    PostgreSQL from that read on."""
    clock = _Clock()
    monkeypatch.setattr(suspects, "clock", clock)
    key = uuid.uuid4().hex
    first = _fall_back(api, hybrid, [key])
    suspects.forget()  # what the other process knows; this one read the rows before
    suspects.next_read = clock.now + suspects.read_interval
    assert IdempotencySuspect.objects.filter(key=key).exists()
    clock.now += suspects.read_interval
    retry = post_json(api, key, {"amount": 2})
    assert retry.status_code == 201 and replayed(retry), retry.content
    assert retry.content == first[key].content
    assert SideEffect.objects.count() == 1 + 1
    assert suspects.next_read == clock.now + suspects.read_interval


def test_a_suspect_row_lives_as_long_as_its_key_by_the_database_clock(
    hybrid: Any, api: APIClient
) -> None:
    """The row of a completed fallback key expires with the key's record (``TTL``, on the
    database's clock); the live rows give the seconds left, and an expired one is read by no
    one and deleted by the purge."""
    key = uuid.uuid4().hex
    _fall_back(api, hybrid, [key])
    ttl = conf.TTL
    row = IdempotencySuspect.objects.get(key=key)
    record = IdempotencyKey.objects.get(key=key)
    assert abs((row.expires_at - record.expires_at).total_seconds()) < 60
    (live,) = [s for s in IdempotencySuspect.objects.live(using="default") if s.key == key]
    assert ttl - 60 < live.seconds <= ttl
    IdempotencySuspect.objects.filter(key=key).update(expires_at=timezone.now() - timedelta(1))
    assert not [s for s in IdempotencySuspect.objects.live(using="default") if s.key == key]
    assert IdempotencySuspect.objects.delete_expired(using="default") >= 1
    assert not IdempotencySuspect.objects.filter(key=key).exists()


def _scope_of(key: str) -> tuple[str, str]:
    """(scope, key) of a key the test views handled (their scope is the user's)."""
    row = IdempotencyOutbox.objects.filter(key=key).first()
    assert row is not None
    return row.scope, key


@pytest.mark.urls("tests.support.gates")
def test_a_completion_that_did_not_reach_redis_is_looked_up_in_postgresql(
    hybrid: Any, running_private_redis: RedisServer, gate: Gate
) -> None:
    hybrid(LOCK_TIMEOUT=1)
    warm = Background("/gated/", uuid.uuid4().hex)  # the marker exists
    assert gate.entered.wait(timeout=30)
    gate.opened.set()
    assert warm.result().status_code == 201
    _quiet()
    gate.reset()
    server = running_private_redis
    key = uuid.uuid4().hex
    holder = Background("/gated/", key)
    assert gate.entered.wait(timeout=30)  # claimed in Redis
    server.cli("ACL", "SETUSER", "default", "-set")  # the post-commit SET is refused
    try:
        gate.opened.set()
        first = holder.result()
    finally:
        server.cli("ACL", "SETUSER", "default", "+set")
    assert first.status_code == 201
    # Redis holds the claim, in progress, until its lease (LOCK_TIMEOUT 1 s) lapses.
    scope = _scope_of(key)
    record = get_store().get(*scope)
    assert record is not None and not record.completed
    wait_until(lambda: get_store().get(*scope) is None, timeout=10)
    gate.reset()
    gate.opened.set()
    assert _post(uuid.uuid4().hex).status_code == 201  # this process's next claim: the mark
    suspects.forget()  # another process
    retry = _post(key)
    assert retry.status_code == 201 and replayed(retry), retry.content
    assert retry.content == first.content
    assert SideEffect.objects.count() == 3, "the key ran once"


def _quiet_slot(scope: str, key: str) -> None:
    """The loss keys of the slot of (scope, key) as on a node that lost nothing lately, with
    the INFO comparison not due for ten minutes."""
    keys = get_store().loss_keys_for(scope, key)
    node = get_client().get_node_from_key(keys[0])  # type: ignore[union-attr]
    primary = redis.Redis(host=node.host, port=node.port, socket_timeout=5)
    try:
        info = primary.info("server") | primary.info("stats")
        primary.set(keys[0], f"{info['run_id']} {info['evicted_keys']}")
        primary.set(keys[1], "1", px=600_000)
        primary.delete(keys[2])
    finally:
        primary.close()


@pytest.mark.redis_cluster
def test_on_a_cluster_each_mark_is_in_its_keys_slot(
    redis_settings: Any, redis_cluster: RedisClusterNodes
) -> None:
    def on(url: str) -> None:
        redis_settings(url, STRATEGY="hybrid", REDIS_CLUSTER=True, TTL=600, REDIS_SOCKET_TIMEOUT=2)

    on(redis_cluster.url)
    client = api_client(UserFactory())
    keys = [uuid.uuid4().hex for _ in range(4)]
    on(closed_port_url())  # no node answers: the db strategy takes the keys
    first = {key: post_json(client, key, {"amount": 2}) for key in keys}
    assert all(response.status_code == 201 for response in first.values())
    on(redis_cluster.url)
    scope = IdempotencyKey.objects.get(key=keys[0]).scope
    warm = uuid.uuid4().hex
    for key in [*keys, warm]:
        _quiet_slot(scope, key)
    assert post_json(client, warm, {"amount": 1}).status_code == 201  # writes the marks
    store, cluster = get_store(), get_client()
    for key in keys:  # each in its record's slot (so on the node that serves it)
        mark, record = store.suspect_key(scope, key), store.record_key(scope, key)
        assert cluster.keyslot(mark) == cluster.keyslot(record)  # type: ignore[union-attr]
        assert cluster.exists(mark)
    suspects.forget()  # another process
    for key in keys:
        retry = post_json(client, key, {"amount": 2})
        assert retry.status_code == 201 and replayed(retry), retry.content
        assert retry.content == first[key].content
    assert SideEffect.objects.count() == len(keys) + 1


@pytest.fixture
def counted_runs() -> Iterator[list[str]]:
    """Every run of the fault views' body, by key, counted outside any transaction (a run
    whose commit is refused rolls its row back, but not this)."""
    faults.reset()
    runs: list[str] = []
    faults.interference.append(runs.append)
    faults.plan.extend(["interfere"] * 1000)
    yield runs
    faults.reset()


def _fault(key: str) -> Any:
    return Client().post(
        "/fault/fn/", {"amount": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


@pytest.mark.urls("tests.support.faults")
def test_a_redis_that_hangs_mid_traffic_runs_each_key_once(
    hybrid: Any, running_private_redis: RedisServer, counted_runs: list[str]
) -> None:
    """Redis stops (SIGSTOP) under concurrent requests for new keys: a request on a pooled
    connection sends its claim (unknown: 503), one that opens a connection never gets to send
    it (not done: the db fallback runs it). Once Redis runs again, every key's retries are
    answered by its one run: replayed from PostgreSQL, or run once after the lease of a claim
    applied late lapsed. Before, the keys of the fallback ran again on their first retry."""
    hybrid(LOCK_TIMEOUT=1)
    assert _fault(faults.new_key()).status_code == 201  # connections, scripts, the marker
    _quiet()
    keys = [faults.new_key() for _ in range(6)]
    with running_private_redis.paused():
        during = run_at_once(len(keys), lambda i: _fault(keys[i]))
    assert {r.status_code for r in during} <= {201, 503}, [r.content for r in during]
    answered = {key: r for key, r in zip(keys, during, strict=True) if r.status_code == 201}
    seen: list[Any] = []

    def settled(key: str) -> bool:
        response = _fault(key)
        seen.append(response)
        return response.status_code == 201

    for key in keys:
        wait_until(lambda key=key: settled(key), timeout=15)  # type: ignore[misc]
        if key in answered:
            assert replayed(seen[-1]) and seen[-1].content == answered[key].content
    assert all(r.status_code in {201, 409} for r in seen), [r.content for r in seen]
    assert not [r for r in seen if b"lease-lost" in r.content], "a view ran twice"
    assert Counter(counted_runs[1:]) == dict.fromkeys(keys, 1), counted_runs


def _lease_lapsed(scope: str, key: str) -> bool:
    """Whether the in-progress record of (scope, key) lapsed with its lease (its PX): a
    claim in Redis now takes the key over."""
    return get_store().get(scope, key) is None


@pytest.mark.urls("tests.support.faults")
@pytest.mark.parametrize("drained", [False, True], ids=["in-the-outbox", "drained"])
def test_a_claim_that_takes_over_a_lapsed_lease_looks_the_key_up_in_postgresql(
    hybrid: Any, counted_runs: list[str], monkeypatch: pytest.MonkeyPatch, drained: bool
) -> None:
    """The worker is killed right after its COMMIT, before the completed record reaches
    Redis: Redis still holds its claim, in progress, until the lease lapses. No loss, no
    fallback episode: the retry's claim takes the key over, and used to run the view again
    (a second call to the payment provider) before the outbox refused its commit."""
    hybrid(LOCK_TIMEOUT=1)
    assert _fault(faults.new_key()).status_code == 201  # the marker, the scripts
    _quiet()
    key = faults.new_key()
    with monkeypatch.context() as patch:
        # The process dies here: nothing runs after COMMIT (no publication, no drain queued).
        patch.setattr(HybridClaim, "after_commit", lambda self: None)
        first = _fault(key)
    assert first.status_code == 201  # the answer its client never received
    scope = _scope_of(key)
    if drained:
        IdempotencyOutbox.objects.drain(100)
        assert IdempotencyKey.objects.filter(key=key, status="completed").exists()
        assert not IdempotencyOutbox.objects.filter(key=key).exists()
    record = get_store().get(*scope)
    assert record is not None and not record.completed
    wait_until(lambda: _lease_lapsed(*scope), timeout=15)

    retry = _fault(key)
    assert retry.status_code == 201 and replayed(retry), retry.content
    assert retry.content == first.content
    assert Counter(counted_runs[1:]) == {key: 1}, "the view body ran once"
    again = _fault(key)  # Redis was refilled
    assert again.status_code == 201 and replayed(again) and again.content == first.content
    assert Counter(counted_runs[1:]) == {key: 1}
