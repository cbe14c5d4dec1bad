"""The hybrid outbox drain on PostgreSQL: rows/s per worker, client CPU and WAL per row.

A private PostgreSQL server (its own cluster, so that the WAL counted is the drain's alone;
--shared: the BENCH_DATABASE_URL server instead) gets a scratch database, migrated. Each
round and case, the outbox is filled server-side with --rows live rows (300-byte JSON
bodies, as the hybrid strategy writes them), the key table emptied, a CHECKPOINT taken;
then --workers threads, each with its own connection, drain the outbox at once in batches
of --batch-size until it is empty. The cases, interleaved round by round:

* reference: the set-based statement written by hand (one ``WITH batch … FOR UPDATE SKIP
  LOCKED, moved AS (DELETE … RETURNING …) INSERT … SELECT … ON CONFLICT … DO UPDATE``
  per batch) on a bare psycopg connection in autocommit: the ceiling;
* library: ``IdempotencyOutbox.objects.drain(batch_size)``, what ``drain_outbox`` and
  ``manage.py drain_idempotency_outbox`` run;
* orm: the manager's ORM path (the batch read, ``bulk_create`` of the keys, a DELETE), the
  one kept for SQLite and MariaDB, and PostgreSQL's before the one statement.

Reported per case: rows/s (all workers) and per worker; the client's CPU per row
(``time.process_time`` of this process over the drain, every worker's thread included);
WAL bytes per row (``pg_current_wal_lsn()`` before and after); and, round by round, the
case's rows/s and CPU per row as a ratio to the reference's. Then --rounds more rounds in
which the cases take batches of one outbox in turn on one thread, each batch timed alone, so
that a busy moment of the machine weighs on every case alike (the steadier ratio on a shared
machine). Every round checks that each row became exactly one key and the outbox is empty
(the exit status is 1 otherwise).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from benchmarks.harness.cli import Measure, names
from benchmarks.harness.inprocess import close_connections, configure
from benchmarks.harness.postgres import (
    ADMIN_URL,
    django_database,
    private_server,
    scalar,
    scratch_database,
)
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import Spread, ratio, spread

CASES = ("reference", "library", "orm")
OUTBOX = "django_idempotency_idempotencyoutbox"
KEYS = "django_idempotency_idempotencykey"

#: The private server: no background writer of WAL between two readings of the position.
SERVER = {"autovacuum": "off", "max_wal_size": "4GB", "checkpoint_timeout": "1h"}

FILL = f"""
    INSERT INTO {OUTBOX} (scope, key, fingerprint, request_method, request_path,
        response_status, response_headers, response_body, created_at, expires_at)
    SELECT 'user:' || (g %% 10000), md5(g::text || %s), md5(g::text) || md5((g + 1)::text),
        'POST', '/api/charges/', 201,
        '{{"Content-Type": "application/json", "Location": "/api/charges/1/"}}'::jsonb,
        convert_to(rpad('{{"id":' || g || ',"amount":1000,"currency":"EUR","note":"', 298, 'x')
                   || '"}}', 'UTF8'),
        now(), now() + interval '1 day'
    FROM generate_series(1, %s) AS g
"""

#: The reference: the move written by hand, as one would without the library.
REFERENCE = f"""
WITH batch AS (
    SELECT id FROM {OUTBOX} ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM {OUTBOX} o USING batch b WHERE o.id = b.id
    RETURNING o.scope, o.key, o.fingerprint, o.request_method, o.request_path,
        o.response_status, o.response_headers, o.response_body, o.created_at, o.expires_at
)
INSERT INTO {KEYS} AS k (scope, key, fingerprint, status, claim_token, locked_at,
    request_method, request_path, response_status, response_headers, response_body,
    created_at, completed_at, expires_at)
SELECT scope, key, fingerprint, 'completed', gen_random_uuid(), NULL, request_method,
    request_path, response_status, response_headers, response_body, created_at,
    created_at, expires_at
FROM moved WHERE expires_at > statement_timestamp()
ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
    status = EXCLUDED.status, claim_token = EXCLUDED.claim_token, locked_at = NULL,
    request_method = EXCLUDED.request_method, request_path = EXCLUDED.request_path,
    response_status = EXCLUDED.response_status, response_headers = EXCLUDED.response_headers,
    response_body = EXCLUDED.response_body, created_at = EXCLUDED.created_at,
    completed_at = EXCLUDED.completed_at, expires_at = EXCLUDED.expires_at
"""


Batch = Callable[[], int]


def reference_batch(url: str, batch_size: int) -> tuple[Batch, Callable[[], None]]:
    """One batch of :data:`REFERENCE` on a bare psycopg connection in autocommit, opened
    now (before the clock starts), and what closes it; a batch returns the rows it moved."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)

    def batch() -> int:
        return int(conn.execute(REFERENCE, (batch_size,)).rowcount)

    return batch, conn.close


def library_batch(case: str, batch_size: int) -> tuple[Batch, Callable[[], None]]:
    """One batch through the manager (``case`` "library": ``drain()``, "orm": its ORM
    path) on this thread's Django connection, opened now, and what closes it."""
    from django.db import connection

    from django_idempotency.models import IdempotencyOutbox

    manager: Any = IdempotencyOutbox.objects
    connection.ensure_connection()

    def batch() -> int:
        if case == "orm":
            return int(manager._drain_orm("default", batch_size, None).rows)
        return int(manager.drain(batch_size).rows)

    return batch, connection.close


def batcher(case: str, url: str, batch_size: int) -> tuple[Batch, Callable[[], None]]:
    if case == "reference":
        return reference_batch(url, batch_size)
    return library_batch(case, batch_size)


def prepare(url: str, rows: int, salt: str) -> int:
    """An outbox of ``rows`` rows, an empty key table, a checkpoint; the WAL position."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {KEYS}, {OUTBOX}")
        conn.execute(FILL, (salt, rows))
        conn.execute(f"VACUUM ANALYZE {OUTBOX}")
        conn.execute(f"VACUUM ANALYZE {KEYS}")
        conn.execute("CHECKPOINT")
    return int(scalar(url, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def run_case(url: str, case: str, args: argparse.Namespace, round_: int) -> dict[str, float]:
    """One round of ``case``: fill, then every worker drains at once; its figures."""
    wal_before = prepare(url, args.rows, f"{case}-{round_}")
    started = threading.Barrier(args.workers + 1)
    moved: list[int] = []

    def thread() -> None:
        batch, close = batcher(case, url, args.batch_size)  # connected before the clock
        started.wait()
        rows = 0
        try:
            while (count := batch()) == args.batch_size:
                rows += count
            moved.append(rows + count)
        finally:
            close()

    threads = [threading.Thread(target=thread) for _ in range(args.workers)]
    for each in threads:
        each.start()
    started.wait()
    cpu, wall = time.process_time(), time.perf_counter()
    for each in threads:
        each.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    wal = int(scalar(url, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")) - wal_before
    keys = scalar(url, f"SELECT count(DISTINCT key) FROM {KEYS}")
    left = scalar(url, f"SELECT count(*) FROM {OUTBOX}")
    total = sum(moved)
    return {
        "rows/s": total / wall,
        "cpu": cpu / total * 1e6,
        "wal": wal / total,
        "ok": float(total == keys == args.rows and left == 0),
    }


def run_paired(url: str, args: argparse.Namespace, round_: int) -> dict[str, dict[str, float]]:
    """One round of the cases taking batches of one outbox in turn, on this thread (the
    order rotating every turn), each batch timed alone: the load of the machine weighs on
    every case alike. Each case's rows/s over its own batches, and CPU per row."""
    prepare(url, args.rows, f"paired-{round_}")
    batches = {case: batcher(case, url, args.batch_size) for case in args.cases}
    figures = {case: {"rows": 0.0, "wall": 0.0, "cpu": 0.0} for case in args.cases}
    turn, running = 0, list(args.cases)
    try:
        while running:
            shift = turn % len(running)
            for case in running[shift:] + running[:shift]:
                cpu, wall = time.process_time(), time.perf_counter()
                count = batches[case][0]()
                figures[case]["wall"] += time.perf_counter() - wall
                figures[case]["cpu"] += time.process_time() - cpu
                figures[case]["rows"] += count
                if count < args.batch_size:
                    running.remove(case)
            turn += 1
    finally:
        for _batch, close in batches.values():
            close()
    keys = scalar(url, f"SELECT count(DISTINCT key) FROM {KEYS}")
    ok = float(keys == sum(f["rows"] for f in figures.values()) == args.rows)
    return {
        case: {"rows/s": f["rows"] / f["wall"], "cpu": f["cpu"] / f["rows"] * 1e6, "ok": ok}
        for case, f in figures.items()
    }


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rows", type=int, default=50_000, help="outbox rows per round (default: %(default)s)")
    add("--batch-size", type=int, default=1000, help="rows per batch (default: %(default)s)")
    add("--workers", type=int, default=1, help="drainers at once (default: %(default)s)")
    add("--cases", type=names, default=list(CASES), help="default: " + ",".join(CASES))
    add("--shared", action="store_true", help="the BENCH_DATABASE_URL server, not a private one")


def run(args: argparse.Namespace) -> int:
    print(
        conditions(
            f"{args.rows:,} rows per round, batches of {args.batch_size}, "
            f"{args.workers} worker(s), {'shared' if args.shared else 'private'} server"
        ),
        flush=True,
    )
    with ExitStack() as stack:
        server = ADMIN_URL if args.shared else stack.enter_context(private_server(SERVER)).url
        url = stack.enter_context(scratch_database("idem_drain_", server))
        stack.callback(close_connections)
        configure({"default": django_database(url)})

        def progress(r: int, figures: dict[str, dict[str, float]]) -> None:
            shown = ", ".join(f"{case} {f['rows/s']:,.0f}/s" for case, f in figures.items())
            print(f"round {r + 1}: {shown}", flush=True)

        results = interleave(
            args.cases,
            args.rounds,
            lambda case, r: run_case(url, case, args, r),
            "rotate",
            progress,
        )
        paired: dict[str, list[dict[str, float]]] = {case: [] for case in args.cases}
        for r in range(args.rounds):
            for case, figures in run_paired(url, args, r).items():
                paired[case].append(figures)
            print(f"paired round {r + 1} done", flush=True)
    emit([report(results, args.workers), report_paired(paired)], args.json)
    every = [f for found in (results, paired) for rounds in found.values() for f in rounds]
    return 0 if all(f["ok"] for f in every) else 1


def report(results: dict[str, list[dict[str, float]]], workers: int) -> Table:
    table = Table(
        "Outbox drain (rows/s and ratios: median (min-max) of the rounds)",
        [
            Column("case"),
            Column("rows/s", ",.0f"),
            Column("rows/s per worker", ",.0f"),
            Column("client CPU µs/row", ".1f"),
            Column("WAL bytes/row", ".0f"),
            Column("rows/s ÷ reference", ".2f"),
            Column("CPU/row ÷ reference", ".2f"),
        ],
    )
    base = results.get("reference")
    for case, rounds in results.items():
        rate = [f["rows/s"] for f in rounds]
        rate_ratio, cpu_ratio = _ratios(rounds, base)
        table.add(
            case,
            spread(rate),
            spread([r / workers for r in rate]),
            spread([f["cpu"] for f in rounds]),
            spread([f["wal"] for f in rounds]),
            rate_ratio,
            cpu_ratio,
        )
    table.note = "every row moved exactly once in every round: " + (
        "yes" if all(f["ok"] for rounds in results.values() for f in rounds) else "NO"
    )
    return table


def report_paired(results: dict[str, list[dict[str, float]]]) -> Table:
    table = Table(
        "Batch by batch, the cases in turn on one outbox (median (min-max) of the rounds)",
        [
            Column("case"),
            Column("rows/s in its batches", ",.0f"),
            Column("client CPU µs/row", ".1f"),
            Column("rows/s ÷ reference", ".2f"),
            Column("CPU/row ÷ reference", ".2f"),
        ],
    )
    base = results.get("reference")
    for case, rounds in results.items():
        table.add(
            case,
            spread([f["rows/s"] for f in rounds]),
            spread([f["cpu"] for f in rounds]),
            *_ratios(rounds, base),
        )
    return table


def _ratios(
    rounds: list[dict[str, float]], base: list[dict[str, float]] | None
) -> tuple[Spread | None, Spread | None]:
    """A case's rows/s and CPU per row over the reference's, round by round (None without
    a reference)."""
    if base is None:
        return None, None
    return (
        ratio([f["rows/s"] for f in rounds], [f["rows/s"] for f in base]),
        ratio([f["cpu"] for f in rounds], [f["cpu"] for f in base]),
    )


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=5,
    quick={"rounds": 2, "rows": 5_000, "cases": ["reference", "library"]},
)
