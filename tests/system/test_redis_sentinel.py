"""The ``redis`` and ``hybrid`` strategies through Redis Sentinel, configured by the recipe
of docs/redis.md ("Sentinel"), on a private master, replica and three sentinels.

Every request goes through the test DRF view, which writes one ``SideEffect`` row per
execution; a 500 would raise out of the test client. The failover is real: the master
is killed with SIGKILL and the sentinels promote the replica.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from rest_framework.test import APIClient

from django_idempotency.conf import conf
from django_idempotency.models import IdempotencyKey
from django_idempotency.strategies.redis import store as redis_store
from tests.testapp import holds
from tests.testapp.models import SideEffect

from ..support.api import (
    api_client,
    assert_runs_once_and_replays,
    post_json,
    race_held,
    replayed,
    wait_in_progress,
)
from ..support.assertions import problem_slug
from ..support.connects import Connects, counting
from ..support.docs import recipe
from ..support.factories import UserFactory
from ..support.redis_servers import RedisSentinels, wait_replicated
from ..support.threads import in_background, run_at_once
from ..support.waiting import wait_until

pytestmark = [
    pytest.mark.sentinel,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("forget_queued_drains"),
]

DOC_SENTINELS = [f'("sentinel-{n}.internal", 26379)' for n in (1, 2, 3)]


def sentinel_recipe(topology: RedisSentinels) -> dict[str, Any]:
    """CACHES and IDEMPOTENCY exactly as docs/redis.md shows them, with the test's
    sentinel addresses in place of the example ones."""
    ours = [f'("127.0.0.1", {port})' for _host, port in topology.addresses]
    return recipe("redis.md", "Sentinel", 0, dict(zip(DOC_SENTINELS, ours, strict=True)))


@pytest.fixture
def configure(settings: Any) -> Iterator[Callable[..., dict[str, Any]]]:
    """``configure(topology, **more)``: the docs recipe on ``topology``, ``more`` on top of
    its IDEMPOTENCY (the strategy, the failure mode); ``timeout=``: the recipe's timeouts
    (0.25 s, for the sentinels and the master) replaced, and the clients made again."""

    def apply(
        topology: RedisSentinels, timeout: float | None = None, **more: Any
    ) -> dict[str, Any]:
        assert topology.service == "mymaster"  # the name in the recipe's LOCATION
        namespace = sentinel_recipe(topology)
        cache = namespace["CACHES"]["idempotency"]
        if timeout is not None:
            options = cache["OPTIONS"]
            kwargs = options["SENTINEL_KWARGS"]
            kwargs["socket_connect_timeout"] = kwargs["socket_timeout"] = timeout
            options["SOCKET_CONNECT_TIMEOUT"] = options["SOCKET_TIMEOUT"] = timeout
        settings.CACHES = {**settings.CACHES, "idempotency": cache}
        settings.IDEMPOTENCY = {**namespace["IDEMPOTENCY"], **more}
        if timeout is not None:
            # After the settings: a client made in between (a waiter's listener, say) from
            # the old ones would be the process's client, and its pool django-redis's.
            redis_store.reset_clients()
            _forget_django_redis_pools()
        return namespace

    yield apply
    redis_store.reset_clients()
    _forget_django_redis_pools()


def _forget_django_redis_pools() -> None:
    """django-redis keeps its pools per LOCATION for the process: the next test's
    topology has the same LOCATION and other sentinels."""
    from django_redis.pool import ConnectionFactory

    for pool in ConnectionFactory._pools.values():
        pool.disconnect()
    ConnectionFactory._pools.clear()


@pytest.fixture(scope="module")
def sentinels() -> Iterator[RedisSentinels]:
    topology = RedisSentinels().start()
    try:
        yield topology
    finally:
        topology.stop()


@pytest.fixture
def topology() -> Iterator[RedisSentinels]:
    """A topology of its own, for a test that kills its master."""
    topology = RedisSentinels().start()
    try:
        yield topology
    finally:
        topology.stop()


def _sentinel_pool() -> Any:
    """The connection pool of the store's client: redis-py's ``SentinelConnectionPool``."""
    from redis.sentinel import SentinelConnectionPool

    client = redis_store.get_client()
    assert isinstance(client, redis.Redis)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    return pool


def _record_on(port: int, prefix: str) -> list[bytes]:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        return list(client.scan_iter(match=f"{prefix}:*:rec", count=1000))
    finally:
        client.close()


def test_the_recipe_is_a_django_redis_sentinel_cache(
    sentinels: RedisSentinels, configure: Any
) -> None:
    from django.core.cache import caches
    from django_redis.client import SentinelClient

    configure(sentinels, STRATEGY="redis")
    assert isinstance(getattr(caches["idempotency"], "client", None), SentinelClient)
    pool = _sentinel_pool()
    assert pool.service_name == "mymaster"
    assert redis_store.get_client().ping()
    assert sentinels.master is not None
    assert pool.get_master_address() == ("127.0.0.1", sentinels.master.port)


@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
def test_new_key_replay_and_race_through_sentinel(
    sentinels: RedisSentinels, configure: Any, strategy: str
) -> None:
    assert sentinels.master is not None
    configure(sentinels, STRATEGY=strategy)
    prefix = conf.REDIS_KEY_PREFIX
    user = UserFactory()
    client = api_client(user)
    key = uuid.uuid4().hex
    assert_runs_once_and_replays(client, key)
    assert SideEffect.objects.count() == 1
    # Redis held the claim, on the master the sentinels named: no db-strategy row.
    assert IdempotencyKey.objects.count() == 0
    assert _record_on(sentinels.master.port, prefix)

    raced = uuid.uuid4().hex
    clients = [api_client(user) for _ in range(10)]
    responses = race_held(10, lambda i, body: post_json(clients[i], raced, body), raced)
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 1, 409: 9}, statuses  # the others came while it ran
    assert sum(r.status_code == 201 and not replayed(r) for r in responses) == 1
    assert SideEffect.objects.count() == 2
    assert replayed(post_json(client, raced, {"hold": raced}))
    assert SideEffect.objects.count() == 2


# -- a failover ------------------------------------------------------------------------------


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> Connects:
    return counting(monkeypatch)


class Ledger:
    """Every response the failover test got, by key: an execution is a 201 that is not a
    replay (the view writes one SideEffect row per execution that commits); and, for the
    request that opened the most connections to one server, how many."""

    def __init__(self, client: APIClient, connects: Connects) -> None:
        self.client = client
        self.connects = connects
        self.responses: dict[str, list[Any]] = {}
        self.bodies: dict[str, dict[str, Any]] = {}
        self.most = 0

    def note(self, opened: Counter[int]) -> None:
        self.most = max(self.most, *opened.values(), 0)

    def post(self, key: str) -> Any:
        """One more request for ``key``, with the body its first request had."""
        body = self.bodies.setdefault(key, {"amount": 5})
        response, opened = self.connects.around(lambda: post_json(self.client, key, body))
        self.note(opened)
        assert response.status_code in {201, 409, 503}, (response.status_code, response.content)
        self.responses.setdefault(key, []).append(response)
        return response

    def record(self, key: str, body: dict[str, Any], responses: list[Any]) -> None:
        """Responses to requests sent with ``body`` by other clients (threads)."""
        self.bodies.setdefault(key, body)
        self.responses.setdefault(key, []).extend(responses)

    def executions(self, key: str) -> int:
        return sum(r.status_code == 201 and not replayed(r) for r in self.responses.get(key, []))

    def total(self) -> int:
        return sum(self.executions(key) for key in self.responses)


def _during_the_outage(
    topology: RedisSentinels, ledger: Ledger, user: Any, retry: list[str]
) -> list[str]:
    """Requests from the kill until the sentinels name the replica and a new key is served
    through Redis again: one race of 5 threads on one key, then one new key and a retry of
    each key in ``retry`` every round. Returns the new keys."""
    assert topology.replica is not None
    raced = uuid.uuid4().hex
    clients = [api_client(user) for _ in range(5)]
    answers = run_at_once(
        5, lambda i: ledger.connects.around(lambda: post_json(clients[i], raced, {"amount": 5}))
    )
    for _response, opened in answers:
        ledger.note(opened)
    ledger.record(raced, {"amount": 5}, [response for response, _opened in answers])
    keys = [raced]
    deadline = time.monotonic() + 90  # for a promotion that never comes, not a slow one
    while time.monotonic() < deadline:
        key = uuid.uuid4().hex
        keys.append(key)
        ledger.post(key)
        for old in retry:
            ledger.post(old)
        live = [sentinel for sentinel in topology.sentinels if sentinel.running]
        promoted = topology.reported_master(live[0]) == topology.replica.port
        served = ledger.responses[key][-1].status_code == 201
        if promoted and served and not IdempotencyKey.objects.filter(key=key).exists():
            return keys  # served through Redis (no db-strategy row), on the new master
        time.sleep(0.05)
    raise AssertionError("the requests did not reach the promoted replica within 90 s")


def answered(ledger: Ledger, key: str) -> None:
    """Post ``key`` until it is answered 201 (run now, or replayed). A key answered 503 in
    the outage because its claim's outcome was unknown (sent to the master as it died)
    never ran; if that claim reached the replica, the key is in progress (409) until its
    lease lapses, and runs then: once."""
    wait_until(lambda: ledger.post(key).status_code == 201, timeout=120)


def _outage_statuses(ledger: Ledger, outage: list[str], retry: list[str]) -> Counter[int]:
    during = [r for key in outage[:-1] for r in ledger.responses[key]]
    during += [r for key in retry for r in ledger.responses[key][1:]]
    return Counter(r.status_code for r in during)


@pytest.mark.parametrize("mode", ["fail_closed", "db"])
@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
def test_a_master_killed_is_failed_over_and_no_key_runs_twice_unless_documented(
    topology: RedisSentinels, configure: Any, connects: Connects, strategy: str, mode: str
) -> None:
    """SIGKILL the master: requests get 503 or the db fallback (per REDIS_FAILURE_MODE; a
    claim whose outcome is unknown, sent as the master died, is 503 in either mode), never
    a 500 nor a hang; the client follows the promoted replica; a key the replica had
    is replayed; a key it missed is replayed from PostgreSQL under hybrid, and runs again
    under redis (the documented limit)."""
    assert topology.master is not None and topology.replica is not None
    configure(topology, STRATEGY=strategy, REDIS_FAILURE_MODE=mode)
    user = UserFactory()
    ledger = Ledger(api_client(user), connects)
    replicated, missed = uuid.uuid4().hex, uuid.uuid4().hex
    assert ledger.post(replicated).status_code == 201
    wait_replicated(topology.master.port)
    topology.cut_replication()
    assert ledger.post(missed).status_code == 201  # on the master only

    inflight = uuid.uuid4().hex
    held = {"hold": inflight}  # the view runs until the test releases it
    running = in_background(lambda: post_json(api_client(user), inflight, held))
    with contextlib.ExitStack() as stack:
        try:
            wait_in_progress(f"user:{user.pk}", inflight)
            # The sentinels are paused while the in-flight request completes: it meets the
            # dead master, however long it takes, not the promoted replica.
            for sentinel in topology.sentinels:
                stack.enter_context(sentinel.paused())
            topology.master.kill()  # while the in-flight request is inside its view
        finally:
            holds.release(inflight)
        ledger.record(inflight, held, [running.result(60)])
    # Under hybrid the completed keys are retried during the outage too: PostgreSQL has them.
    retry = [replicated, missed] if strategy == "hybrid" else []
    outage = _during_the_outage(topology, ledger, user, retry)
    # redis cannot store its response: the view's writes roll back, 503 (whatever the
    # mode); hybrid committed it with the outbox row in PostgreSQL: 201.
    answered = ledger.responses[inflight][0]
    assert answered.status_code == (503 if strategy == "redis" else 201), answered.content
    statuses = _outage_statuses(ledger, outage, retry)
    if mode == "fail_closed":
        assert statuses[503] >= 5 and set(statuses) <= {201, 503}, statuses
    else:
        assert set(statuses) <= {201, 409, 503}, statuses
        assert IdempotencyKey.objects.filter(key=outage[0]).exists()  # the db fallback ran
    # Never a hang nor a retry loop: no request opened more than two connections to one
    # server (redis-py's connection retries, each waiting longer, would be more), and each
    # one waits at most the recipe's 0.25 s timeouts (a dead process refuses at once).
    assert ledger.most <= 2, ledger.most
    topology.wait_master(topology.replica.port)
    assert _sentinel_pool().get_master_address() == ("127.0.0.1", topology.replica.port)

    # After the failover the promise is one run per key: the sentinels' lookups get timeouts
    # a loaded machine does not reach (at 0.25 s, a lookup that a busy machine served late
    # was "no master found": that racer fell back to the db strategy beside the others).
    configure(topology, timeout=5.0, STRATEGY=strategy, REDIS_FAILURE_MODE=mode)
    client: Any = redis_store.get_client()
    sentinel = client.connection_pool.sentinel_manager.sentinels[0]
    assert sentinel.connection_pool.connection_kwargs["socket_timeout"] == 5.0
    _after_the_failover(topology, ledger, user, strategy, [replicated, missed, inflight, *outage])
    # Nothing ran that the responses do not show, and nothing twice but the documented.
    assert SideEffect.objects.count() == ledger.total()
    runs_again = set() if strategy == "hybrid" else {missed}
    if strategy == "redis" and mode == "db":
        # Each key a request handed to the db fallback (its row), in the outage or in the
        # race after it: Redis did not see that run (the documented limit).
        runs_again |= {
            key for key in ledger.responses if IdempotencyKey.objects.filter(key=key).exists()
        }
    twice = {key for key in ledger.responses if ledger.executions(key) > 1}
    assert twice == runs_again, (twice, runs_again)
    assert all(ledger.executions(key) <= 2 for key in ledger.responses)


def _after_the_failover(
    topology: RedisSentinels, ledger: Ledger, user: Any, strategy: str, keys: list[str]
) -> None:
    """``keys``: the replicated, the missed and the in-flight key, then the outage's.
    Every one is replayed (or, when it never ran or is a documented loss, runs now, once);
    a new key runs once on the new master; a race on one key runs once."""
    assert topology.replica is not None
    replicated, missed, inflight = keys[:3]
    assert replayed(ledger.post(replicated))
    for key in keys[1:]:
        answered(ledger, key)
        assert replayed(ledger.post(key)), ledger.responses[key][-1].content
    if strategy == "hybrid":
        assert replayed(ledger.responses[missed][-2])  # from PostgreSQL, not run again
        assert replayed(ledger.responses[inflight][1])  # committed there before the kill
    else:
        assert ledger.executions(missed) == 2  # the documented limit of the redis strategy

    key = uuid.uuid4().hex
    assert not replayed(ledger.post(key)) and replayed(ledger.post(key))
    prefix = conf.REDIS_KEY_PREFIX
    record = redis_store.get_store().record_key(f"user:{user.pk}", key)
    assert record.encode() in _record_on(topology.replica.port, prefix)

    raced = uuid.uuid4().hex
    clients = [api_client(user) for _ in range(10)]
    responses = race_held(10, lambda i, body: post_json(clients[i], raced, body), raced)
    ledger.record(raced, {"hold": raced}, responses)
    # A racer that could not reach Redis at that moment is answered as the failure mode
    # says: a 503 (fail_closed), or the db strategy (db), which Redis does not see: the
    # documented limit of the redis strategy, the only way to a second run here. On a
    # machine at a load near 15, one or two of the ten new connections (each asking the
    # sentinels first) failed before a command was sent, even with 5 s timeouts.
    fell_back = IdempotencyKey.objects.filter(key=raced).exists()
    assert ledger.executions(raced) == 1 or (fell_back and ledger.executions(raced) == 2)
    refused = [r for r in ledger.responses[raced] if r.status_code not in (201, 409)]
    assert all(problem_slug(r) == "store-unavailable" for r in refused), refused


def test_a_dead_sentinel_costs_no_request_more_than_a_timeout(
    topology: RedisSentinels, configure: Any, connects: Connects
) -> None:
    """The first sentinel of SENTINELS dies, then the master: the two others still elect
    the replica, and no request waits for redis-py's retries of the dead sentinel (the
    recipe's ``retry`` in SENTINEL_KWARGS; with redis-py's retries, the requests wait for
    seconds): counted, not timed, each discovery of the master asks the dead sentinel
    without retrying it."""
    assert topology.master is not None and topology.replica is not None
    configure(topology, STRATEGY="hybrid", REDIS_FAILURE_MODE="db")
    user = UserFactory()
    ledger = Ledger(api_client(user), connects)
    before = uuid.uuid4().hex
    assert ledger.post(before).status_code == 201
    wait_replicated(topology.master.port)
    topology.sentinels[0].kill()
    topology.master.kill()
    outage = _during_the_outage(topology, ledger, user, [before])
    # The dead sentinel was asked, and not retried: no request waits for redis-py's retries
    # of it (each a back-off longer; redis-py 8 retries a connect ten times by default).
    # Once per discovery, or more when racing requests discover at once: discover_master
    # moves the sentinel that answered to the front of the list it shares with the other
    # threads, so a discovery that asked the dead one may meet it again in a later slot
    # (twice in make stress-test, seed 534943228). One pass of that list: a connect per
    # slot at most.
    dead = topology.sentinels[0].port
    slots = len(topology.sentinels)
    assert 1 <= connects.per_discovery[dead] <= slots, (dead, connects.per_discovery)
    assert ledger.most <= 2, ledger.most
    topology.wait_master(topology.replica.port)
    assert _sentinel_pool().get_master_address() == ("127.0.0.1", topology.replica.port)
    for key in [before, *outage]:
        if ledger.executions(key) == 0:
            answered(ledger, key)  # 503 in the outage: its claim's outcome was unknown
        assert replayed(ledger.post(key))
    assert all(ledger.executions(key) == 1 for key in ledger.responses if key != outage[0])
    assert ledger.executions(outage[0]) <= 1  # the race: db claims, 409s or one run
    assert SideEffect.objects.count() == ledger.total()
