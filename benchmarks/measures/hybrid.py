"""What the hybrid strategy costs PostgreSQL, against db and no idempotency at all.

1. Commits per request, from pg_stat_database.xact_commit of a scratch database, for
   POST /api/charges/ of the example project under gunicorn:

   * baseline: /baseline/charges/, the same view without the mixin;
   * db: the db strategy; hybrid: the hybrid strategy with a private redis-server, which
     holds no loss marker: every new key is also looked up in the database (as with
     HYBRID_DB_CHECK "always", or for one TTL after a loss).

   Each case runs three times on a fresh server: with no measured requests, with
   --requests requests on new keys, and with --requests replays of one key. The server is
   stopped before the counter is read (a backend flushes its statistics when it exits), and
   the run with no requests is subtracted, so that start-up, warm-up and the reads of the
   counter itself cancel out. Every read-only statement outside a transaction counts as a
   commit too (DRF's token lookup, for instance), which is why the baseline is not zero.

2. Rows per drain transaction under load: the hybrid server and one real Celery worker
   (celery -A example_project.celery worker) while client threads send new keys for
   --load-seconds; the worker's log says how many rows each drain moved in how many
   transactions. The same load against db gives its request rate and commits. --rounds
   load runs of each strategy, the order flipping every round; the figures are summed.
"""

from __future__ import annotations

import argparse
import ast
import re
import threading
import time
import uuid
from typing import Any

from benchmarks.harness.cli import Measure
from benchmarks.harness.example import TOKEN, celery_worker, example_database, example_server
from benchmarks.harness.postgres import scalar
from benchmarks.harness.redis import redis_server
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.rounds import orders
from benchmarks.harness.web import request

CHARGE = {"amount": 1999, "currency": "EUR"}
BATCH = 1000  # OUTBOX_BATCH_SIZE, the default
OUTBOX = "django_idempotency_idempotencyoutbox"
SUCCEEDED = re.compile(
    r"Task django_idempotency\.drain_outbox\[[^\]]+\] succeeded in [^:]+: (\{[^}]*\})"
)


def counters(db_url: str) -> tuple[int, int]:
    """(xact_commit, xact_rollback) of the scratch database, once they stop moving."""
    name = db_url.rsplit("/", 1)[1]
    sql = "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s"
    admin = db_url.rsplit("/", 1)[0] + "/postgres"
    last: tuple[int, int] | None = None
    for _ in range(50):
        import psycopg

        with psycopg.connect(admin, autocommit=True) as conn:
            row = conn.execute(sql, (name,)).fetchone()
        assert row is not None
        current = (int(row[0]), int(row[1]))
        if current == last:
            return current
        last = current
        time.sleep(0.3)
    assert last is not None
    return last


def count_outbox(db: str) -> int:
    return int(scalar(db, f"SELECT COUNT(*) FROM {OUTBOX}"))


def server_env(strategy: str, redis_url: str) -> dict[str, str]:
    return {
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "IDEMPOTENCY_REDIS_PREFIX": f"bench-{strategy}-{uuid.uuid4().hex[:6]}",
    }


def run_phase(db: str, redis_url: str, case: str, phase: str, n: int) -> tuple[int, int]:
    """Commits and rollbacks of one server lifetime running ``phase``."""
    strategy = "db" if case == "baseline" else case
    path = "/baseline/charges/" if case == "baseline" else "/api/charges/"
    before = counters(db)
    with example_server(
        db, strategy, workers=1, threads=4, env=server_env(strategy, redis_url)
    ) as server:
        url = server.url + path
        replay_key = f"warm-{uuid.uuid4().hex}"
        for i in range(10):  # warm-up: connections, caches, the key replayed below
            key = replay_key if i == 0 else uuid.uuid4().hex
            status, _ = request(url, key=key, body=CHARGE, token=TOKEN)
            assert status == 201, status
        for _ in range(n if phase != "none" else 0):
            key = uuid.uuid4().hex if phase == "new" else replay_key
            status, body = request(url, key=key, body=CHARGE, token=TOKEN)
            assert status == 201, (status, body)
            if phase == "replay" and case != "baseline":
                assert body["_headers"].get("idempotent-replayed") == "true"
    after = counters(db)
    return after[0] - before[0], after[1] - before[1]


def commits_per_request(db: str, redis_url: str, n: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    for case in ("baseline", "db", "hybrid"):
        empty = run_phase(db, redis_url, case, "none", n)
        new = run_phase(db, redis_url, case, "new", n)
        replay = run_phase(db, redis_url, case, "replay", n)
        results[case] = {
            "new_commits": (new[0] - empty[0]) / n,
            "new_rollbacks": (new[1] - empty[1]) / n,
            "replay_commits": (replay[0] - empty[0]) / n,
            "replay_rollbacks": (replay[1] - empty[1]) / n,
        }
        print(
            f"  {case:8} new key: {results[case]['new_commits']:.2f} commits "
            f"({results[case]['new_rollbacks']:.2f} rollbacks) per request; "
            f"replay: {results[case]['replay_commits']:.2f} commits per request",
            flush=True,
        )
    return results


def load(url: str, seconds: float, clients: int) -> int:
    """New-key requests from ``clients`` threads for ``seconds``; returns how many."""
    stop = time.monotonic() + seconds
    done = [0] * clients
    failures: list[Any] = []

    def client(index: int) -> None:
        while time.monotonic() < stop:
            status, body = request(url, key=uuid.uuid4().hex, body=CHARGE, token=TOKEN)
            if status != 201:
                failures.append((status, body))
                return
            done[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} failed requests, first: {failures[0]!r}")
    return sum(done)


def load_round(
    db: str, redis_url: str, strategy: str, seconds: float, clients: int
) -> dict[str, float]:
    """One load run of ``strategy`` with a Celery worker, until the outbox is empty."""
    before = counters(db)
    worker_env = {"REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url}
    with celery_worker(db, {**worker_env, "IDEMPOTENCY_LOG_LEVEL": "INFO"}) as log:
        with example_server(
            db, strategy, workers=2, threads=8, env=server_env(strategy, redis_url)
        ) as server:
            started = time.monotonic()
            requests = load(server.url + "/api/charges/", seconds, clients)
            elapsed = time.monotonic() - started
        # The last follow-up drain runs some seconds after the last commit.
        deadline = time.monotonic() + 60
        while count_outbox(db) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(0.5)
        text = log.read_text(errors="replace")
        runs = [ast.literal_eval(m.group(1)) for m in SUCCEEDED.finditer(text)]
    after = counters(db)
    rows = sum(int(run["drained"]) + int(run["discarded"]) for run in runs)
    # A run's transactions are full batches but its last; count the full ones.
    full = sum((int(run["drained"]) + int(run["discarded"])) // BATCH for run in runs)
    return {
        "requests": requests,
        "seconds": elapsed,
        "commits": after[0] - before[0],
        "drained_rows": rows,
        "drain_transactions": sum(int(run["transactions"]) for run in runs),
        "full_batches": full,
        "left_in_outbox": count_outbox(db),
    }


def print_round(index: int, strategy: str, result: dict[str, float]) -> None:
    line = (
        f"  round {index + 1} {strategy:8} {result['requests']:.0f} requests, "
        f"{result['requests'] / result['seconds']:.0f}/s, "
        f"{result['commits'] / result['requests']:.2f} commits per request"
    )
    if strategy == "hybrid":
        short = result["drain_transactions"] - result["full_batches"]
        line += (
            f" (drains included); drained {result['drained_rows']:.0f} rows in "
            f"{result['drain_transactions']:.0f} transactions "
            f"({result['full_batches']:.0f} full batches of {BATCH}, {short:.0f} shorter)"
            f", {result['left_in_outbox']:.0f} left"
        )
    print(line, flush=True)


def drain_under_load(
    db: str, redis_url: str, seconds: float, clients: int, rounds: int
) -> dict[str, dict[str, float]]:
    """``rounds`` load runs of each strategy, the order flipping every round (the load
    of a shared machine drifts); the figures are summed over the rounds."""
    totals: dict[str, dict[str, float]] = {}
    for index, order in enumerate(orders(["db", "hybrid"], rounds, "flip")):
        for strategy in order:
            result = load_round(db, redis_url, strategy, seconds, clients)
            total = totals.setdefault(strategy, dict.fromkeys(result, 0.0))
            for name, value in result.items():
                total[name] += value
            print_round(index, strategy, result)
    results: dict[str, dict[str, float]] = {}
    for strategy, total in totals.items():
        results[strategy] = {
            **total,
            "requests_per_second": total["requests"] / total["seconds"],
            "commits_per_request": total["commits"] / total["requests"],
            "rows_per_drain_transaction": (
                total["drained_rows"] / total["drain_transactions"]
                if total["drain_transactions"]
                else 0.0
            ),
        }
    hybrid = results["hybrid"]
    print(
        f"  hybrid: {hybrid['drained_rows']:.0f} rows in {hybrid['drain_transactions']:.0f} "
        f"drain transactions, {hybrid['rows_per_drain_transaction']:.0f} rows per transaction; "
        f"{hybrid['full_batches']:.0f} full batches of {BATCH}",
        flush=True,
    )
    return results


def report(
    per_request: dict[str, dict[str, float]], loaded: dict[str, dict[str, float]]
) -> list[Table]:
    commits = Table(
        "Commits per request (pg_stat_database.xact_commit)",
        [Column("case"), Column("new key", ".2f"), Column("rollbacks", ".2f"),
         Column("replay", ".2f")],
    )  # fmt: skip
    for case, figures in per_request.items():
        commits.add(
            case, figures["new_commits"], figures["new_rollbacks"], figures["replay_commits"]
        )
    under_load = Table(
        "Under load, summed over the rounds",
        [Column("strategy"), Column("requests/s", ".0f"), Column("commits/request", ".2f"),
         Column("drained rows", ".0f"), Column("drain transactions", ".0f"),
         Column("rows/transaction", ".0f")],
    )  # fmt: skip
    for strategy, figures in loaded.items():
        under_load.add(strategy, figures["requests_per_second"], figures["commits_per_request"],
                       figures["drained_rows"], figures["drain_transactions"],
                       figures["rows_per_drain_transaction"])  # fmt: skip
    return [commits, under_load]


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--load-seconds",
        type=float,
        default=20.0,
        help="seconds per load run (default: %(default)s)",
    )
    add("--clients", type=int, default=16, help="client threads of the load (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    with redis_server() as (redis_url, _port), example_database("postgres") as db:
        version = scalar(db, "SHOW server_version")
        print(conditions(f"PostgreSQL {version}; {args.requests} requests per phase"), flush=True)
        print("Commits per request (pg_stat_database.xact_commit):", flush=True)
        per_request = commits_per_request(db, redis_url, args.requests)
        base = per_request["baseline"]["new_commits"]
        for case in ("db", "hybrid"):
            extra = per_request[case]["new_commits"] - base
            print(f"  {case:8} adds {extra:+.2f} commits per new-key request", flush=True)
        ratio = per_request["hybrid"]["new_commits"] / per_request["db"]["new_commits"]
        print(f"  hybrid / db commits per new-key request: {ratio:.2f}", flush=True)
        print(
            f"Under load ({args.clients} clients, {args.load_seconds:.0f} s per run, "
            f"{args.rounds} rounds):",
            flush=True,
        )
        loaded = drain_under_load(db, redis_url, args.load_seconds, args.clients, args.rounds)
    speed = loaded["hybrid"]["requests_per_second"] / loaded["db"]["requests_per_second"]
    print(f"  hybrid / db requests per second: {speed:.2f}", flush=True)
    emit(report(per_request, loaded), args.json, per_request=per_request, under_load=loaded)
    return 0


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=2,
    requests=300,
    quick={"rounds": 1, "requests": 30, "load_seconds": 3.0},
)
