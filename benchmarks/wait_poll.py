"""What one fallback poll of a waiting duplicate costs (``WAIT_POLL_INTERVAL``).

A waiter that no notification reaches claims its key again every poll interval; while the
first request still runs, that claim finds the key in progress. This measures the client
CPU (``time.process_time``) of that claim, through the strategy's session as the engine
opens it, against a replay of a completed key (the claim every duplicate pays once),
interleaved over rounds on one scratch PostgreSQL database, for ``db`` and ``redis``.
Reported: microseconds per claim (median over rounds, with min and max), the ratio to the
replay, and what a waiter's polls cost over a whole ``--wait``.

    .venv/bin/python benchmarks/wait_poll.py [--rounds 5] [--iterations 500] [--wait 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.claim import ADMIN_URL, configure_django  # noqa: E402
from tests.support.databases import pg_admin  # noqa: E402
from tests.support.services import REDIS_URL  # noqa: E402


def cases(strategy_name: str) -> dict[str, Callable[[], None]]:
    """``poll``: a claim of a key in progress; ``replay``: a claim of a completed key."""
    from django.test import override_settings

    from django_idempotency import strategies
    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.strategies.base import Attempt, InProgress, Replay
    from django_idempotency.strategies.redis import store as redis_store

    value = {"STRATEGY": strategy_name, "ADMIN_ENABLED": False}
    if strategy_name == "redis":
        value.update(REDIS_URL=REDIS_URL, REDIS_KEY_PREFIX="bench-poll-" + uuid.uuid4().hex[:8])
    override_settings(IDEMPOTENCY=value).enable()
    strategies.reset()
    redis_store.reset_clients()
    strategy = strategies.get_strategy()

    def attempt(key: str) -> Attempt:
        return Attempt("user:1", key, "f" * 64, ttl=3600, lock_timeout=60)

    held = attempt("held-" + uuid.uuid4().hex)
    holder = Lifecycle(strategy, held)
    holder.__enter__()  # in progress until the end of the run
    done = attempt("done-" + uuid.uuid4().hex)
    with Lifecycle(strategy, done) as lifecycle:
        lifecycle.complete(StoredResponse(201, {"Content-Type": "application/json"}, b'{"id": 1}'))

    def poll() -> None:
        with Lifecycle(strategy, held) as lifecycle:
            assert isinstance(lifecycle.outcome, InProgress)

    def replay() -> None:
        with Lifecycle(strategy, done) as lifecycle:
            assert isinstance(lifecycle.outcome, Replay)

    return {"poll": poll, "replay": replay}


def cpu_per_call(work: Callable[[], None], iterations: int) -> float:
    started = time.process_time()
    for _ in range(iterations):
        work()
    return (time.process_time() - started) / iterations


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--wait", type=float, default=5.0)
    parser.add_argument("--interval", type=float, default=0.5, help="WAIT_POLL_INTERVAL")
    parser.add_argument("--strategies", default="db,redis")
    args = parser.parse_args()

    pg_name = f"idem_bench_poll_{uuid.uuid4().hex[:8]}"
    pg_admin(f'CREATE DATABASE "{pg_name}"', ADMIN_URL)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            configure_django(pg_name, str(Path(tmp) / "bench.sqlite3"))
            polls = 1 + int(args.wait / args.interval)
            print(f"claims per waiter over a {args.wait:g} s wait without a wake-up: {polls}")
            print(f"{'strategy':10} {'claim':8} {'us (min/median/max)':>26} {'vs replay':>10}")
            for name in args.strategies.split(","):
                work = cases(name)
                times: dict[str, list[float]] = {case: [] for case in work}
                for case in work.values():  # warm up
                    cpu_per_call(case, 20)
                for _round in range(args.rounds):
                    for case, run in work.items():
                        times[case].append(cpu_per_call(run, args.iterations) * 1e6)
                replay = statistics.median(times["replay"])
                ratios = [p / r for p, r in zip(times["poll"], times["replay"], strict=True)]
                for case, values in times.items():
                    spread = f"{min(values):.0f} / {statistics.median(values):.0f} / "
                    spread += f"{max(values):.0f}"
                    ratio = statistics.median(values) / replay
                    print(f"{name:10} {case:8} {spread:>26} {ratio:>9.2f}x")
                print(
                    f"{name:10} poll/replay per round: {min(ratios):.2f}x to {max(ratios):.2f}x; "
                    f"a waiter's polls over {args.wait:g} s: "
                    f"{polls * statistics.median(times['poll']) / 1000:.2f} ms CPU"
                )
    finally:
        from django.db import connections

        connections.close_all()
        pg_admin(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)', ADMIN_URL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
