"""Purging expired keys on PostgreSQL: throughput, batch length, memory.

A scratch database ``idem_purge_<pid>`` is created, migrated and filled with
``--rows`` expired keys (each with a stored JSON response, like real ones) plus
``--live`` keys that have not expired, in one ``INSERT … SELECT generate_series``
each. Then the expired keys are deleted through
``IdempotencyKey.objects.iter_delete_expired`` — the generator behind
``manage.py purge_idempotency_keys`` and the Celery purge task — one short
transaction per batch (``--orm`` measures the ORM path used on other databases
instead: the batch's ids read first, then deleted; ``--compare`` runs both in turn,
batch by batch, on one table, which is the fair comparison on a busy machine). Reported:

* rows deleted per second (wall clock, whole purge);
* the duration of each batch transaction (SELECT of the batch's ids + DELETE +
  COMMIT): median, 99th percentile and the longest;
* peak Python heap during the purge (``tracemalloc``) and the process's peak
  resident set size (``resource.getrusage``);
* that every live key survived.

The scratch database is dropped at the end.

    .venv/bin/python benchmarks/purge.py [--rows 1000000] [--live 100000]
        [--batch-size 1000] [--orm | --compare] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.databases import pg_admin  # noqa: E402

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def configure_django(name: str) -> None:
    import django
    from django.conf import settings

    admin = urlsplit(ADMIN_URL)
    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        TIME_ZONE="UTC",
        SECRET_KEY="benchmark",
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_idempotency"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": name,
                "USER": admin.username or "postgres",
                "PASSWORD": admin.password or "",
                "HOST": admin.hostname or "127.0.0.1",
                "PORT": str(admin.port or 5432),
                "CONN_MAX_AGE": None,
            }
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        IDEMPOTENCY={"ADMIN_ENABLED": False},
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(rows: int, live: int) -> float:
    """Insert the rows server-side; returns the seconds it took."""
    from django.db import connection

    from django_idempotency.models import IdempotencyKey

    table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
    insert = """
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
    started = time.perf_counter()
    with connection.cursor() as cursor:
        # Expired ones spread over the last day, as a steady stream of traffic leaves them.
        cursor.execute(
            insert.format(table=table, expires="now() - (g %% 86400) * interval '1 second'"),
            ["expired-", rows],
        )
        cursor.execute(
            insert.format(table=table, expires="now() + interval '1 day'"),
            ["live-", live],
        )
        cursor.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - started


def table_size() -> str:
    from django.db import connection

    from django_idempotency.models import IdempotencyKey

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_size_pretty(pg_total_relation_size(%s))", [IdempotencyKey._meta.db_table]
        )
        return str(cursor.fetchone()[0])


def purge(batch_size: int, orm: bool = False) -> dict[str, Any]:
    from django.utils import timezone

    from django_idempotency.models import IdempotencyKey

    cutoff = timezone.now()
    durations: list[float] = []
    total = 0
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    started = time.perf_counter()
    batch_started = started
    for deleted in IdempotencyKey.objects.iter_delete_expired(batch_size=batch_size, cutoff=cutoff):
        now = time.perf_counter()
        durations.append(now - batch_started)
        total += deleted
        batch_started = time.perf_counter()
    elapsed = time.perf_counter() - started
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ordered = sorted(durations)
    return {
        "deleted": total,
        "batches": len(durations),
        "seconds": round(elapsed, 2),
        "rows_per_second": round(total / elapsed),
        "batch_ms_median": round(statistics.median(ordered) * 1000, 1),
        "batch_ms_p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 1),
        "batch_ms_max": round(ordered[-1] * 1000, 1),
        "tracemalloc_peak_kib": round(peak / 1024),
        "maxrss_before_mib": round(rss_before / 1024, 1),
        "maxrss_after_mib": round(rss_after / 1024, 1),
    }


def compare(batch_size: int) -> dict[str, Any]:
    """Both paths on one table, batch by batch in turn, so that the load of the machine
    weighs on both alike; per-path batch durations."""
    from django.utils import timezone

    from django_idempotency.models import IdempotencyKey

    manager = IdempotencyKey.objects
    cutoff = timezone.now()
    paths = {
        "statement": manager.iter_delete_expired(batch_size=batch_size, cutoff=cutoff),
        "orm": manager._iter_delete_expired_orm(batch_size, cutoff, "default", None),
    }
    durations: dict[str, list[float]] = {name: [] for name in paths}
    deleted = dict.fromkeys(paths, 0)
    turn = 0
    while paths:
        names = sorted(paths, reverse=True)  # statement first, then orm
        name = names[turn % len(names)]
        turn += 1
        started = time.perf_counter()
        try:
            count = next(paths[name])
        except StopIteration:
            del paths[name]
            continue
        durations[name].append(time.perf_counter() - started)
        deleted[name] += count
    result: dict[str, Any] = {}
    for name, values in durations.items():
        ordered = sorted(values)
        result[name] = {
            "batches": len(ordered),
            "deleted": deleted[name],
            "batch_ms_median": round(statistics.median(ordered) * 1000, 2),
            "batch_ms_mean": round(statistics.mean(ordered) * 1000, 2),
            "batch_ms_p99": round(
                ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 1
            ),
            "batch_ms_max": round(ordered[-1] * 1000, 1),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="expired rows to purge")
    parser.add_argument("--live", type=int, default=100_000, help="rows that must survive")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument(
        "--orm",
        action="store_true",
        help="measure the ORM path (ids read first, then deleted) used on other databases",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="delete with both paths in turn, batch by batch, and compare their batches",
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    # A SIGTERM (a timeout, Ctrl-C in a runner) still drops the scratch database below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    name = f"idem_purge_{os.getpid()}"
    pg_admin(f'CREATE DATABASE "{name}"', ADMIN_URL)
    try:
        configure_django(name)
        import django
        from django.db import connection

        from django_idempotency.models import IdempotencyKey

        fill_seconds = fill(args.rows, args.live)
        size_before = table_size()
        print(
            f"filled {args.rows:,} expired + {args.live:,} live rows in {fill_seconds:.1f}s "
            f"(table + indexes: {size_before})"
        )
        if args.compare:
            both = compare(args.batch_size)
            for name, figures in both.items():
                print(
                    f"[{name}] {figures['deleted']:,} rows in {figures['batches']} batches: "
                    f"batch median {figures['batch_ms_median']} ms, mean "
                    f"{figures['batch_ms_mean']} ms, p99 {figures['batch_ms_p99']} ms, "
                    f"longest {figures['batch_ms_max']} ms"
                )
            live_left = IdempotencyKey.objects.filter(key__startswith="live-").count()
            print(f"live rows left: {live_left:,} of {args.live:,}; load {os.getloadavg()}")
            if args.json:
                Path(args.json).write_text(json.dumps(both, indent=2) + "\n")
            return
        result = purge(args.batch_size, orm=args.orm)
        survivors = IdempotencyKey.objects.count()
        live_left = IdempotencyKey.objects.filter(key__startswith="live-").count()
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            server = str(cursor.fetchone()[0]).split(" on ")[0]
        connection.close()
        result.update(
            {
                "rows": args.rows,
                "live": args.live,
                "batch_size": args.batch_size,
                "path": "orm" if args.orm else "statement",
                "survivors": survivors,
                "live_left": live_left,
                "fill_seconds": round(fill_seconds, 1),
                "table_size_before": size_before,
                "server": server,
                "django": django.get_version(),
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
            }
        )
    finally:
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # Django may not be set up yet
            pass
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', ADMIN_URL)

    print(
        f"[{result['path']}] purged {result['deleted']:,} rows in {result['batches']} batches "
        f"of {args.batch_size} "
        f"in {result['seconds']}s: {result['rows_per_second']:,} rows/s"
    )
    print(
        f"batch transaction: median {result['batch_ms_median']} ms, "
        f"p99 {result['batch_ms_p99']} ms, longest {result['batch_ms_max']} ms"
    )
    print(
        f"memory: tracemalloc peak {result['tracemalloc_peak_kib']} KiB during the purge; "
        f"max RSS {result['maxrss_before_mib']} MiB before, {result['maxrss_after_mib']} MiB after"
    )
    ok = result["survivors"] == args.live and result["live_left"] == args.live
    print(f"live rows left: {result['live_left']:,} of {args.live:,} ({'ok' if ok else 'WRONG'})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if not ok or result["deleted"] != args.rows:
        sys.exit(1)


if __name__ == "__main__":
    main()
