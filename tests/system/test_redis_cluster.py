"""The Redis store and the ``redis`` strategy on a private 6-node Redis Cluster
(3 primaries, 3 replicas), started once per test session."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from django_idempotency.protocol.lifecycle import Lifecycle
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.strategies.base import Attempt, Claim, InProgress, Replay
from django_idempotency.strategies.redis import store as redis_store
from django_idempotency.strategies.redis.store import RedisStore, get_client, get_store
from django_idempotency.strategies.redis.strategy import RedisStrategy

from ..support.connects import counting, port_of
from ..support.redis_servers import RedisClusterNodes
from ..support.threads import run_at_once

pytestmark = pytest.mark.redis_cluster

RESPONSE = StoredResponse(201, {"Content-Type": "application/json"}, b'{"ok": true}')


@pytest.fixture
def cluster_client(redis_cluster: RedisClusterNodes) -> Any:
    client = RedisCluster.from_url(redis_cluster.url, socket_timeout=2, socket_connect_timeout=2)
    yield client
    client.close()


def _keys_per_primary(cluster: RedisClusterNodes, prefix: str) -> dict[int, int]:
    counts = {}
    for port in cluster.primaries():
        node = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
        counts[port] = sum(1 for _ in node.scan_iter(match=f"{prefix}:*", count=1000))
        node.close()
    return counts


def test_keys_spread_over_all_three_primaries(
    redis_cluster: RedisClusterNodes, cluster_client: Any
) -> None:
    prefix = f"spread-{uuid.uuid4().hex[:8]}"
    store = RedisStore(cluster_client, prefix)
    tokens = {}
    for i in range(300):
        tokens[i] = uuid.uuid4().hex
        assert store.claim(f"user:{i % 7}", f"key-{i}", "fp", tokens[i], 60_000)[0]
    # The Lua scripts run on whichever primary owns each key's slot.
    for i in range(0, 300, 3):
        assert store.renew(f"user:{i % 7}", f"key-{i}", tokens[i], 60_000)
        assert store.complete(f"user:{i % 7}", f"key-{i}", tokens[i], RESPONSE, 60_000)
        assert store.get(f"user:{i % 7}", f"key-{i}").response == RESPONSE  # type: ignore[union-attr]
    counts = _keys_per_primary(redis_cluster, prefix)
    assert len(counts) == 3
    assert sum(counts.values()) == 300
    assert min(counts.values()) >= 60, counts  # about 100 each; a hash tag per key, not one slot


def test_strategy_works_through_redis_cluster(
    redis_cluster: RedisClusterNodes, redis_settings: Any
) -> None:
    redis_settings(redis_cluster.url, REDIS_CLUSTER=True)
    assert isinstance(get_client(), RedisCluster)
    strategy = RedisStrategy()
    attempt = Attempt("user:1", uuid.uuid4().hex, "fp", ttl=60, lock_timeout=5, atomic=False)
    with Lifecycle(strategy, attempt) as claim_life:
        claim = claim_life.outcome
        assert isinstance(claim, Claim)
        assert claim.renew()
        with Lifecycle(strategy, attempt) as duplicate_life:
            duplicate = duplicate_life.outcome
            assert isinstance(duplicate, InProgress)
        claim_life.complete(RESPONSE)
    with Lifecycle(strategy, attempt) as replay_life:
        replay = replay_life.outcome
        assert isinstance(replay, Replay) and replay.response == RESPONSE
    assert 55_000 < get_store().pttl(attempt.scope, attempt.key) <= 60_000


def test_twenty_threads_claim_one_key_on_the_cluster(
    redis_cluster: RedisClusterNodes, redis_settings: Any
) -> None:
    redis_settings(redis_cluster.url, REDIS_CLUSTER=True)
    strategy = RedisStrategy()
    attempt = Attempt("user:1", uuid.uuid4().hex, "fp", ttl=60, lock_timeout=5, atomic=False)

    def run(_: int) -> str:
        with Lifecycle(strategy, attempt) as outcome_life:
            outcome = outcome_life.outcome
            name = type(outcome).__name__ if not isinstance(outcome, Claim) else "Claim"
            if isinstance(outcome, Claim):
                time.sleep(0.1)
                outcome_life.complete(RESPONSE)
        return name

    seen = run_at_once(20, run)  # a thread's error is re-raised here
    summary = Counter(seen)
    assert summary["Claim"] == 1, summary
    assert set(summary) <= {"Claim", "InProgress", "Replay"}, summary
    assert sum(summary.values()) == 20


def test_unreachable_cluster_is_redis_unavailable(
    redis_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ..support.redis_servers import closed_port_url

    url = closed_port_url()
    redis_settings(url, REDIS_CLUSTER=True, REDIS_FAILURE_MODE="fail_closed")
    connects = counting(monkeypatch)
    with pytest.raises(redis_store.RedisUnavailable):
        get_client()
    # Refused once and not tried again (no retry loop with back-off): a refusal costs a
    # request one connection attempt, however slow the machine.
    assert connects.total == Counter({port_of(url): 1}), connects.total
    from django_idempotency.errors import StoreUnavailable

    attempt = Attempt("user:1", "k", "fp", ttl=60, lock_timeout=5, atomic=False)
    with pytest.raises(StoreUnavailable), Lifecycle(RedisStrategy(), attempt):
        pass


@pytest.mark.server
@pytest.mark.postgres
def test_race_through_the_example_server_on_the_cluster(redis_cluster: RedisClusterNodes) -> None:
    from ..support.databases import count_rows
    from ..support.example import example_server, race, race_summary, request, scratch_database

    key = f"pay-{uuid.uuid4().hex[:8]}"
    charge = {"amount": 1999, "currency": "EUR"}
    with (
        scratch_database("postgres") as db,
        example_server(
            db, strategy="redis", psp_delay_ms=300, env={"REDIS_CLUSTER_URL": redis_cluster.url}
        ) as server,
    ):
        url = server.url + "/api/charges/"
        results = race(url, n=20, key=key, body=charge)
        statuses = race_summary(results)
        assert statuses["201"] == 1, statuses
        assert set(statuses) <= {"201", "201 replay", "409"}, statuses
        status, body = request(url, key=key, body=charge)
        assert status == 201 and body["_headers"]["idempotent-replayed"] == "true"
        assert count_rows(db, "payments_charge") == 1
        assert count_rows(db, "django_idempotency_idempotencykey") == 0
        assert "Traceback" not in server.log()


def test_a_primary_killed_mid_traffic_is_failed_over_and_requests_stay_bounded(
    redis_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL one primary of a private cluster: while its replica takes over, requests for
    its slots get a bounded 503 (never a hang); afterwards every completed key replays."""
    from django_idempotency.errors import StoreUnavailable

    connects = counting(monkeypatch)
    cluster = RedisClusterNodes().start()
    try:
        redis_settings(cluster.url, REDIS_CLUSTER=True, REDIS_FAILURE_MODE="fail_closed")
        strategy = RedisStrategy()
        attempts = [
            Attempt("user:1", f"failover-{i}", "fp", ttl=600, lock_timeout=5, atomic=False)
            for i in range(30)
        ]
        for attempt in attempts:
            with Lifecycle(strategy, attempt) as claim_life:
                claim = claim_life.outcome
                assert isinstance(claim, Claim)
                claim_life.complete(RESPONSE)
        victim_port = next(p for p in cluster.primaries() if p != cluster.nodes[0].port)
        # Let a replica acknowledge every write before the crash.
        cluster.wait_replicated(victim_port)
        victim = next(n for n in cluster.nodes if n.port == victim_port)
        victim.kill()

        most, unavailable = 0, 0
        deadline = time.monotonic() + 120  # for a failover that never comes, not a slow one
        while True:
            replays = 0
            for attempt in attempts:
                try:
                    with connects.opened() as opened, Lifecycle(strategy, attempt) as life:
                        replays += isinstance(life.outcome, Replay)
                except StoreUnavailable:
                    unavailable += 1
                most = max(most, *opened.values(), 0)
            if replays == len(attempts):
                break
            assert time.monotonic() < deadline, f"{replays}/{len(attempts)} replay after 120 s"
            time.sleep(0.2)  # polling interval
        assert unavailable > 0, "the outage was observed"
        # Never a hang nor a retry loop: no request opened more than two connections to one
        # node (redis-py's cluster retries, each after a back-off, would be more), each one
        # bounded by REDIS_SOCKET_TIMEOUT (a dead process refuses at once).
        assert most <= 2, most
        assert victim_port not in cluster.primaries()
    finally:
        cluster.stop()
