"""Claim + complete and replay throughput of the ``redis`` strategy against raw redis-py loops.

Cases, each measured against raw loops in the same run:

* ``claim+complete``: ``Lifecycle(RedisStrategy(), ...)`` on a fresh key (``SET NX PX GET``),
  then ``complete()`` (``EVALSHA`` of the compare-and-set script), one client, one
  thread. Baselines: a raw ``SET key value NX PX`` loop (one round trip: the floor any
  Redis claim pays), and a raw ``SET NX PX`` + ``SET PX`` loop (the same two round
  trips without the token check, JSON or Python around them).
* ``replay``: ``Lifecycle(RedisStrategy(), ...)`` on a completed key (the failed ``SET NX GET``
  returns the stored record; decoded into a ``Replay``). Baselines: a raw ``SET NX``
  loop on an existing key, and a raw ``GET`` loop of the same value.

Runs are interleaved (the cases run in a new random order every round) and the medians are
reported, so that drift on a shared machine hits every side. The client CPU time per
operation (``time.process_time``) is printed too: on a busy machine the wall clock mostly
measures waiting for a core, while the CPU time is what the code itself costs.

A private ``redis-server`` (no persistence) is started on a free loopback port and stopped
at the end; with ``--cluster`` a private 6-node Redis Cluster (3 primaries, 3 replicas) is
measured too.

    .venv/bin/python benchmarks/redis_claim.py [--rounds 5] [--iterations 3000]
        [--cluster] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCOPE = "user:1"
FINGERPRINT = "f" * 64
BODY = json.dumps({"id": 1, "amount": 1999, "currency": "EUR", "status": "succeeded"}).encode()


def setup_django(url: str, cluster: bool, prefix: str) -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=[
                "django.contrib.contenttypes",
                "django.contrib.auth",
                "django_idempotency",
            ],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            USE_TZ=True,
            SECRET_KEY="bench",
        )
        django.setup()
    settings.IDEMPOTENCY = {
        "STRATEGY": "redis",
        "REDIS_URL": url,
        "REDIS_CLUSTER": cluster,
        "REDIS_KEY_PREFIX": prefix,
        "REDIS_FAILURE_MODE": "fail_closed",  # a benchmark must not silently measure the db
        "REDIS_SOCKET_TIMEOUT": 2.0,
    }
    from django_idempotency.strategies.redis import store as redis_store

    redis_store.reset_clients()


def cases(url: str, cluster: bool, iterations: int) -> dict[str, Callable[[], float]]:
    """Each case runs ``iterations`` operations and returns the elapsed seconds."""
    import redis
    from redis.cluster import RedisCluster

    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.strategies.base import Attempt, Replay
    from django_idempotency.strategies.redis.store import get_client, get_store
    from django_idempotency.strategies.redis.strategy import RedisStrategy

    strategy = RedisStrategy()
    client: Any = get_client()
    raw: Any = (
        RedisCluster.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        if cluster
        else redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    )
    response = StoredResponse(201, {"Content-Type": "application/json"}, BODY)
    in_progress = json.dumps(
        {"s": "in_progress", "f": FINGERPRINT, "t": "t" * 32, "r": None}
    ).encode()
    completed = client.get  # for the raw GET loop, the same value the strategy reads

    def attempt(key: str) -> Attempt:
        return Attempt(SCOPE, key, FINGERPRINT, ttl=3600, lock_timeout=60, atomic=False)

    def strategy_claim_complete() -> float:
        keys = [uuid.uuid4().hex for _ in range(iterations)]
        started = time.perf_counter()
        for key in keys:
            with Lifecycle(strategy, attempt(key)) as lifecycle:
                assert lifecycle.claimed
                lifecycle.complete(response)
        return time.perf_counter() - started

    def raw_set_nx() -> float:
        keys = [f"raw:{{{uuid.uuid4().hex}}}:rec" for _ in range(iterations)]
        started = time.perf_counter()
        for key in keys:
            assert raw.set(key, in_progress, nx=True, px=60_000)
        return time.perf_counter() - started

    def raw_set_nx_then_set() -> float:
        keys = [f"raw:{{{uuid.uuid4().hex}}}:rec" for _ in range(iterations)]
        value = in_progress + BODY
        started = time.perf_counter()
        for key in keys:
            assert raw.set(key, in_progress, nx=True, px=60_000)
            raw.set(key, value, px=3_600_000)
        return time.perf_counter() - started

    # One completed key per client for the replay loops.
    replay_attempt = attempt("replayed-" + uuid.uuid4().hex)
    with Lifecycle(strategy, replay_attempt) as lifecycle:
        assert lifecycle.claimed
        lifecycle.complete(response)
    store = get_store()
    record_key = store.record_key(replay_attempt.scope, replay_attempt.key)
    stored_value = completed(record_key)

    def strategy_replay() -> float:
        started = time.perf_counter()
        for _ in range(iterations):
            with Lifecycle(strategy, replay_attempt) as lifecycle:
                assert isinstance(lifecycle.outcome, Replay)
        return time.perf_counter() - started

    raw_key = f"raw:{{{uuid.uuid4().hex}}}:rec"
    raw.set(raw_key, stored_value, px=3_600_000)

    def raw_set_nx_existing() -> float:
        started = time.perf_counter()
        for _ in range(iterations):
            assert not raw.set(raw_key, in_progress, nx=True, px=60_000)
        return time.perf_counter() - started

    def raw_get() -> float:
        started = time.perf_counter()
        for _ in range(iterations):
            assert raw.get(raw_key) is not None
        return time.perf_counter() - started

    return {
        "claim+complete: redis strategy": strategy_claim_complete,
        "claim+complete: raw SET NX PX": raw_set_nx,
        "claim+complete: raw SET NX PX + SET PX": raw_set_nx_then_set,
        "replay: redis strategy": strategy_replay,
        "replay: raw SET NX (existing key)": raw_set_nx_existing,
        "replay: raw GET": raw_get,
    }


def measure(
    label: str, url: str, cluster: bool, rounds: int, iterations: int
) -> dict[str, dict[str, float]]:
    setup_django(url, cluster, f"bench-{uuid.uuid4().hex[:8]}")
    runs = cases(url, cluster, iterations)
    for run in runs.values():  # warm up: connections, script load
        run()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    shuffle = random.Random(20261130).shuffle
    for _ in range(rounds):
        order = names[:]
        shuffle(order)  # a new order every round: no case always follows another
        for name in order:
            started = time.process_time()
            rates[name].append(iterations / runs[name]())
            cpu[name].append((time.process_time() - started) / iterations * 1e6)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    print(f"\n{label}: {iterations} operations x {rounds} rounds, medians")
    print(f"  {'':42s} {'ops/s':>10s} {'client CPU us/op':>17s}")
    for name, value in medians.items():
        print(f"  {name:42s} {value:10.0f} {cpu_medians[name]:17.1f}")
    pairs = [
        ("claim+complete: redis strategy", "claim+complete: raw SET NX PX"),
        ("claim+complete: redis strategy", "claim+complete: raw SET NX PX + SET PX"),
        ("replay: redis strategy", "replay: raw SET NX (existing key)"),
        ("replay: redis strategy", "replay: raw GET"),
    ]
    print("  throughput ratio (strategy / raw), and client CPU per op (raw / strategy):")
    for candidate, baseline in pairs:
        ratio = medians[candidate] / medians[baseline]
        cpu_ratio = cpu_medians[baseline] / cpu_medians[candidate]
        print(
            f"  {candidate.split(':')[0]:15s} vs {baseline.split(': ')[1]:26s}"
            f" {ratio:5.2f}x  (CPU {cpu_ratio:4.2f}x)"
        )
    return {"ops_per_second": medians, "client_cpu_us_per_op": cpu_medians}


def main() -> None:
    from tests.support.redis_servers import RedisClusterNodes, RedisServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--cluster", action="store_true", help="measure a 6-node cluster too")
    parser.add_argument("--json", help="write the medians to this file")
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    server = RedisServer().start()
    try:
        results["node"] = measure(
            f"one redis-server ({server.url})", server.url, False, args.rounds, args.iterations
        )
    finally:
        server.cleanup()
    if args.cluster:
        cluster = RedisClusterNodes().start()
        try:
            results["cluster"] = measure(
                "Redis Cluster (3 primaries, 3 replicas)",
                cluster.url,
                True,
                args.rounds,
                args.iterations,
            )
        finally:
            cluster.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
