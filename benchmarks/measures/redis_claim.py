"""Claim + complete and replay throughput of the redis strategy against raw redis-py loops.

Cases, each measured against raw loops in the same run:

* claim+complete: Lifecycle(RedisStrategy(), ...) on a fresh key (SET NX PX GET), then complete()
  (EVALSHA of the compare-and-set script), one client, one thread. Baselines: a raw
  SET key value NX PX loop (one round trip: the floor any Redis claim pays), and a raw
  SET NX PX + SET PX loop (the same two round trips without the token check, JSON or
  Python around them).
* replay: Lifecycle(RedisStrategy(), ...) on a completed key (the failed SET NX GET returns the
  stored record, decoded into a Replay). Baselines: a raw SET NX loop on an existing key,
  and a raw GET loop of the same value.

The cases run in a new random order every round (a fixed seed); the ratios are taken within
each round, the strategy's rate over the raw loop's, and the raw loop's client CPU per
operation over the strategy's (time.process_time: on a busy machine the wall clock mostly
measures waiting for a core, while the CPU time is what the code itself costs). A private
redis-server (no persistence) runs on a free loopback port; with --cluster a private 6-node
Redis Cluster (3 primaries, 3 replicas) is measured too.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.harness.cli import Measure
from benchmarks.harness.inprocess import configure
from benchmarks.harness.redis import redis_cluster, redis_server
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import ratio, spread

SCOPE = "user:1"
FINGERPRINT = "f" * 64
BODY = json.dumps({"id": 1, "amount": 1999, "currency": "EUR", "status": "succeeded"}).encode()
IN_PROGRESS = json.dumps({"s": "in_progress", "f": FINGERPRINT, "t": "t" * 32, "r": None}).encode()
PAIRS = (
    ("claim+complete: redis strategy", "claim+complete: raw SET NX PX"),
    ("claim+complete: redis strategy", "claim+complete: raw SET NX PX + SET PX"),
    ("replay: redis strategy", "replay: raw SET NX (existing key)"),
    ("replay: redis strategy", "replay: raw GET"),
)
Case = Callable[[], float]  # runs the operations, returns the seconds they took


def use_redis(url: str, cluster: bool) -> None:
    from django.conf import settings

    from django_idempotency.strategies.redis import store

    settings.IDEMPOTENCY = {
        "STRATEGY": "redis",
        "REDIS_URL": url,
        "REDIS_CLUSTER": cluster,
        "REDIS_KEY_PREFIX": f"bench-{uuid.uuid4().hex[:8]}",
        "REDIS_FAILURE_MODE": "fail_closed",  # a benchmark must not silently measure the db
        "REDIS_SOCKET_TIMEOUT": 2.0,
    }
    store.reset_clients()


def raw_client(url: str, cluster: bool) -> Any:
    import redis
    from redis.cluster import RedisCluster

    kind: Any = RedisCluster if cluster else redis.Redis
    return kind.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def attempt(key: str) -> Any:
    from django_idempotency.strategies.base import Attempt

    return Attempt(SCOPE, key, FINGERPRINT, ttl=3600, lock_timeout=60, atomic=False)


def timed(n: int, step: Callable[[int], None]) -> float:
    started = time.perf_counter()
    for i in range(n):
        step(i)
    return time.perf_counter() - started


def claim_cases(raw: Any, n: int) -> dict[str, Case]:
    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.strategies.redis.strategy import RedisStrategy

    strategy = RedisStrategy()
    response = StoredResponse(201, {"Content-Type": "application/json"}, BODY)
    value = IN_PROGRESS + BODY

    def strategy_claim_complete() -> float:
        keys = [uuid.uuid4().hex for _ in range(n)]

        def step(i: int) -> None:
            with Lifecycle(strategy, attempt(keys[i])) as lifecycle:
                assert lifecycle.claimed
                lifecycle.complete(response)

        return timed(n, step)

    def raw_set_nx() -> float:
        keys = [f"raw:{{{uuid.uuid4().hex}}}:rec" for _ in range(n)]
        return timed(n, lambda i: assert_true(raw.set(keys[i], IN_PROGRESS, nx=True, px=60_000)))

    def raw_set_nx_then_set() -> float:
        keys = [f"raw:{{{uuid.uuid4().hex}}}:rec" for _ in range(n)]

        def step(i: int) -> None:
            assert raw.set(keys[i], IN_PROGRESS, nx=True, px=60_000)
            raw.set(keys[i], value, px=3_600_000)

        return timed(n, step)

    return {
        "claim+complete: redis strategy": strategy_claim_complete,
        "claim+complete: raw SET NX PX": raw_set_nx,
        "claim+complete: raw SET NX PX + SET PX": raw_set_nx_then_set,
    }


def assert_true(value: Any) -> None:
    assert value


def replay_cases(raw: Any, n: int) -> dict[str, Case]:
    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.strategies.base import Replay
    from django_idempotency.strategies.redis.store import get_client, get_store
    from django_idempotency.strategies.redis.strategy import RedisStrategy

    strategy = RedisStrategy()
    replayed = attempt("replayed-" + uuid.uuid4().hex)  # one completed key per client
    with Lifecycle(strategy, replayed) as lifecycle:
        assert lifecycle.claimed
        lifecycle.complete(StoredResponse(201, {"Content-Type": "application/json"}, BODY))
    stored = get_client().get(get_store().record_key(replayed.scope, replayed.key))
    raw_key = f"raw:{{{uuid.uuid4().hex}}}:rec"
    raw.set(raw_key, stored, px=3_600_000)

    def strategy_replay(i: int) -> None:
        with Lifecycle(strategy, replayed) as lifecycle:
            assert isinstance(lifecycle.outcome, Replay)

    return {
        "replay: redis strategy": lambda: timed(n, strategy_replay),
        "replay: raw SET NX (existing key)": lambda: timed(
            n, lambda i: assert_true(not raw.set(raw_key, IN_PROGRESS, nx=True, px=60_000))
        ),
        "replay: raw GET": lambda: timed(n, lambda i: assert_true(raw.get(raw_key) is not None)),
    }


def measure(label: str, url: str, cluster: bool, args: argparse.Namespace) -> list[Table]:
    use_redis(url, cluster)
    raw = raw_client(url, cluster)
    cases = {**claim_cases(raw, args.requests), **replay_cases(raw, args.requests)}
    for case in cases.values():  # warm up: connections, script load
        case()

    def run(name: str, _round: int) -> tuple[float, float]:
        started = time.process_time()
        rate = args.requests / cases[name]()
        return rate, (time.process_time() - started) / args.requests * 1e6

    results = interleave(list(cases), args.rounds, run, "shuffle")
    rates = {name: [rate for rate, _cpu in runs] for name, runs in results.items()}
    cpu = {name: [us for _rate, us in runs] for name, runs in results.items()}
    cases_table = Table(
        f"{label}: {args.requests} operations x {args.rounds} rounds",
        [Column("case"), Column("ops/s", ".0f"), Column("client CPU µs/op", ".1f")],
    )
    for name in cases:
        cases_table.add(name, spread(rates[name]), spread(cpu[name]))
    ratios = Table(
        f"{label}: the strategy against a raw loop, within each round",
        [Column("strategy vs raw"), Column("throughput", ".2f"), Column("CPU raw/strategy", ".2f")],
    )
    for candidate, baseline in PAIRS:
        name = f"{candidate.split(':')[0]} vs {baseline.split(': ')[1]}"
        ratios.add(
            name, ratio(rates[candidate], rates[baseline]), ratio(cpu[baseline], cpu[candidate])
        )
    return [cases_table, ratios]


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", action="store_true", help="measure a 6-node cluster too")


def run(args: argparse.Namespace) -> int:
    print(conditions(f"{args.rounds} rounds of {args.requests} operations per case"), flush=True)
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    configure({"default": database}, migrate=False)
    with redis_server() as (url, _port):
        tables = measure("one redis-server", url, False, args)
    if args.cluster:
        with redis_cluster() as url:
            tables += measure("Redis Cluster (3 primaries, 3 replicas)", url, True, args)
    emit(tables, args.json)
    return 0


MEASURE = Measure(
    __doc__, run, options, rounds=5, requests=3000, quick={"rounds": 3, "requests": 300}
)
