"""Purging expired keys on PostgreSQL: throughput, batch length, memory.

A scratch database is migrated and filled with --rows expired keys (each with a stored JSON
response, like real ones) plus --live keys that have not expired, in one INSERT … SELECT
generate_series each. Then the expired keys are deleted through
IdempotencyKey.objects.iter_delete_expired, the generator behind manage.py
purge_idempotency_keys and the Celery purge task, one short transaction per batch (--orm:
the ORM path used on other databases instead, the batch's ids read first, then deleted;
--compare: both in turn, batch by batch, on one table, the fair comparison on a busy
machine, with the ratio of each ORM batch's duration to the statement batch before it).
Reported:

* rows deleted per second (wall clock, whole purge);
* the duration of each batch transaction: median, 99th percentile and the longest;
* peak Python heap during the purge (tracemalloc) and the process's peak resident set size;
* that every live key survived (the exit status is 1 otherwise).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

from benchmarks.harness.cli import Measure
from benchmarks.harness.inprocess import close_connections, configure
from benchmarks.harness.postgres import django_database, scratch_database
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.stats import ratio

INSERT = """
    INSERT INTO {table} (scope, key, fingerprint, status, claim_token, locked_at,
        request_method, request_path, response_status, response_headers, response_body,
        created_at, completed_at, expires_at)
    SELECT 'user:' || (g %% 10000), %s || g, md5(g::text) || md5((g + 1)::text),
        'completed', gen_random_uuid(), NULL, 'POST', '/api/charges/', 201,
        '{{"Content-Type": "application/json", "Location": "/api/charges/1/"}}'::jsonb,
        convert_to('{{"id":' || g || ',"amount":1000,"currency":"EUR",'
                   '"psp_reference":"psp_' || md5(g::text) || '"}}', 'UTF8'),
        now() - interval '2 days', now() - interval '2 days', {expires}
    FROM generate_series(1, %s) AS g
"""


def fill(rows: int, live: int) -> tuple[float, str]:
    """Insert the rows server-side: the seconds it took, and the table's size then."""
    from django.db import connection

    from django_idempotency.models import IdempotencyKey

    table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        # Expired ones spread over the last day, as a steady stream of traffic leaves them.
        expired = "now() - (g %% 86400) * interval '1 second'"
        cursor.execute(INSERT.format(table=table, expires=expired), ["expired-", rows])
        alive = "now() + interval '1 day'"
        cursor.execute(INSERT.format(table=table, expires=alive), ["live-", live])
        cursor.execute(f"VACUUM ANALYZE {table}")
        seconds = time.perf_counter() - started
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size(%s))", [table.strip('"')])
        return seconds, str(cursor.fetchone()[0])


def batches(path: str, batch_size: int) -> Iterator[int]:
    """The rows each batch of ``path`` ("statement" or "orm") deletes."""
    from django.utils import timezone

    from django_idempotency.models import IdempotencyKey

    manager: Any = IdempotencyKey.objects
    cutoff = timezone.now()
    deleted: Iterator[int]
    if path == "orm":
        deleted = manager._iter_delete_expired_orm(batch_size, cutoff, "default", None)
    else:
        deleted = manager.iter_delete_expired(batch_size=batch_size, cutoff=cutoff)
    return deleted


def durations_ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(v * 1000 for v in values)
    return {
        "median": statistics.median(ordered),
        "mean": statistics.mean(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "longest": ordered[-1],
    }


def purge(path: str, batch_size: int) -> dict[str, Any]:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    durations: list[float] = []
    total = 0
    tracemalloc.start()
    started = batch_started = time.perf_counter()
    for deleted in batches(path, batch_size):
        durations.append(time.perf_counter() - batch_started)
        total += deleted
        batch_started = time.perf_counter()
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "deleted": total,
        "batches": len(durations),
        "seconds": elapsed,
        "rows/s": total / elapsed,
        **durations_ms(durations),
        "heap peak KiB": peak / 1024,
        "max RSS before MiB": rss_before / 1024,
        "max RSS after MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def compare(batch_size: int) -> dict[str, dict[str, Any]]:
    """Both paths on one table, batch by batch in turn, so that the load of the machine
    weighs on both alike."""
    paths = {name: batches(name, batch_size) for name in ("statement", "orm")}
    durations: dict[str, list[float]] = {name: [] for name in paths}
    deleted = dict.fromkeys(paths, 0)
    turn = 0
    while paths:
        name = sorted(paths, reverse=True)[turn % len(paths)]  # statement first, then orm
        turn += 1
        started = time.perf_counter()
        try:
            count = next(paths[name])
        except StopIteration:
            del paths[name]
            continue
        durations[name].append(time.perf_counter() - started)
        deleted[name] += count
    return {
        name: {
            "deleted": deleted[name],
            "batches": len(values),
            **durations_ms(values),
            "durations": values,
        }
        for name, values in durations.items()
    }


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rows", type=int, default=1_000_000, help="expired rows to purge (default: %(default)s)")
    add("--live", type=int, default=100_000, help="rows that must survive (default: %(default)s)")
    add("--batch-size", type=int, default=1000, help="rows per batch (default: %(default)s)")
    add("--orm", action="store_true", help="the ORM path (ids read first, then deleted)")
    add("--compare", action="store_true", help="both paths in turn, batch by batch")


def run(args: argparse.Namespace) -> int:
    print(conditions(f"batches of {args.batch_size}"), flush=True)
    path = "orm" if args.orm else "statement"
    with ExitStack() as stack:
        url = stack.enter_context(scratch_database("idem_purge_"))
        stack.callback(close_connections)
        configure({"default": django_database(url)})
        from django_idempotency.models import IdempotencyKey

        seconds, size = fill(args.rows, args.live)
        print(f"filled {args.rows:,} expired + {args.live:,} live rows in {seconds:.1f}s ({size})")
        results = compare(args.batch_size) if args.compare else {path: purge(path, args.batch_size)}
        live_left = IdempotencyKey.objects.filter(key__startswith="live-").count()
        survivors = IdempotencyKey.objects.count()
    emit([report(results)], args.json)
    deleted = sum(figures["deleted"] for figures in results.values())
    ok = live_left == survivors == args.live and deleted == args.rows
    print(f"live rows left: {live_left:,} of {args.live:,}; deleted {deleted:,} of {args.rows:,}")
    return 0 if ok else 1


def report(results: dict[str, dict[str, Any]]) -> Table:
    headings = [h for h in next(iter(results.values())) if h != "durations"]
    columns = [Column(h, ".1f" if h != "seconds" else ".2f") for h in headings]
    table = Table("Purge (batch transaction durations in ms)", [Column("path"), *columns])
    for path, figures in results.items():
        table.add(path, *(figures[h] for h in headings))
    if "orm" in results and "statement" in results:
        orm, statement = results["orm"]["durations"], results["statement"]["durations"]
        pairs = min(len(orm), len(statement))
        each = ratio(orm[:pairs], statement[:pairs])
        table.note = f"ORM batch / statement batch, batch by batch: {each.format()}"
    return table


MEASURE = Measure(__doc__, run, options, quick={"rows": 20_000, "live": 2_000})
