"""What one fallback poll of a waiting duplicate costs (WAIT_POLL_INTERVAL).

A waiter that no notification reaches claims its key again every poll interval; while the
first request still runs, that claim finds the key in progress. This measures the client
CPU (time.process_time) of that claim, through the strategy's session as the engine opens
it, against a replay of a completed key (the claim every duplicate pays once), interleaved
over rounds (the order flips every round) on one scratch PostgreSQL database (and, for
redis, a private redis-server). Reported per strategy: microseconds per claim of each,
median (min-max) over the rounds, the ratio poll / replay within each round, and what a
waiter's polls cost over a whole --wait.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack

from benchmarks.harness.cli import Measure
from benchmarks.harness.inprocess import close_connections, configure
from benchmarks.harness.postgres import django_database, scratch_database
from benchmarks.harness.redis import redis_server
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import ratio, spread


def cases(strategy_name: str, redis_url: str) -> dict[str, Callable[[], None]]:
    """``poll``: a claim of a key in progress; ``replay``: a claim of a completed key."""
    from django.test import override_settings

    from django_idempotency import strategies
    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.strategies.base import Attempt, InProgress, Replay
    from django_idempotency.strategies.redis import store as redis_store

    value = {"STRATEGY": strategy_name, "ADMIN_ENABLED": False}
    if strategy_name == "redis":
        value.update(REDIS_URL=redis_url, REDIS_KEY_PREFIX="bench-poll-" + uuid.uuid4().hex[:8])
    override_settings(IDEMPOTENCY=value).enable()
    strategies.reset()
    redis_store.reset_clients()
    strategy = strategies.get_strategy()

    def attempt(key: str) -> Attempt:
        # The held key's lease outlasts the run (no heartbeat renews it here): a poll on a
        # slow machine must still find it in progress, not take it over.
        return Attempt("user:1", key, "f" * 64, ttl=3600, lock_timeout=3600)

    held = attempt("held-" + uuid.uuid4().hex)
    Lifecycle(strategy, held).__enter__()  # in progress until the end of the run
    done = attempt("done-" + uuid.uuid4().hex)
    with Lifecycle(strategy, done) as lifecycle:
        assert lifecycle.claimed
        lifecycle.complete(StoredResponse(201, {"Content-Type": "application/json"}, b'{"id": 1}'))

    def poll() -> None:
        with Lifecycle(strategy, held) as lifecycle:
            assert isinstance(lifecycle.outcome, InProgress)

    def replay() -> None:
        with Lifecycle(strategy, done) as lifecycle:
            assert isinstance(lifecycle.outcome, Replay)

    return {"poll": poll, "replay": replay}


def cpu_per_call(work: Callable[[], None], iterations: int) -> float:
    """Microseconds of this process's CPU per call of ``work``."""
    started = time.process_time()
    for _ in range(iterations):
        work()
    return (time.process_time() - started) / iterations * 1e6


def measure(table: Table, name: str, redis_url: str, args: argparse.Namespace) -> None:
    work = cases(name, redis_url)
    for case in work.values():  # warm up
        cpu_per_call(case, 20)
    times = interleave(
        list(work), args.rounds, lambda c, _r: cpu_per_call(work[c], args.requests), "flip"
    )
    polls = 1 + int(args.wait / args.interval)
    table.add(
        name,
        spread(times["poll"]),
        spread(times["replay"]),
        ratio(times["poll"], times["replay"]),
        polls * spread(times["poll"]).median / 1000,
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", type=float, default=5.0, help="WAIT (default: %(default)s)")
    parser.add_argument(
        "--interval", type=float, default=0.5, help="WAIT_POLL_INTERVAL (default: %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    polls = 1 + int(args.wait / args.interval)
    print(conditions(f"{args.rounds} rounds of {args.requests} claims"), flush=True)
    table = Table(
        f"CPU per claim; a waiter not woken over a {args.wait:g} s wait claims {polls} times",
        [Column("strategy"), Column("poll µs", ".0f"), Column("replay µs", ".0f"),
         Column("poll/replay", ".2f"), Column(f"polls over {args.wait:g} s, ms CPU", ".2f")],
    )  # fmt: skip
    with ExitStack() as stack:
        pg_url = stack.enter_context(scratch_database())
        redis_url = stack.enter_context(redis_server())[0]
        stack.callback(close_connections)
        configure({"default": django_database(pg_url)})
        for name in args.strategies:
            measure(table, name, redis_url, args)
    emit([table], args.json)
    return 0


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=5,
    requests=500,
    strategies=("db", "redis"),
    quick={"rounds": 3, "requests": 100},
)
