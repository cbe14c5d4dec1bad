"""Time partitions on PostgreSQL: dropping a partition of expired keys against deleting its rows.

A scratch database is migrated, its key table partitioned (PARTITION_INTERVAL of an hour)
and, for each size of --rows, one partition ahead filled with that many completed keys. The
partition is then purged twice per round, in turn: dropped whole (``DETACH … CONCURRENTLY``
then ``DROP``, as the purge does with a partition whose range has passed) and, filled again,
deleted row by row (``iter_delete_expired``, batches of 1,000), while a thread claims new keys
without pause. Reported per size, as the median and range over --rounds rounds:

* how long the drop and the row purge took, and the row purge's time over the drop's;
* the claims' median and 99th percentile latency during each purge, over those of the same
  thread with no purge running (the idle phase of the same round): 1.0 is no effect.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from contextlib import ExitStack
from typing import Any

from benchmarks.harness.cli import Measure
from benchmarks.harness.inprocess import close_connections, configure
from benchmarks.harness.postgres import django_database, scratch_database
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.stats import ratio, spread
from benchmarks.measures.purge import INSERT

IDEMPOTENCY = {
    "PARTITION_INTERVAL": 3600,
    "PARTITION_AHEAD": 4 * 3600,
    "TTL": 3600,
    "ADMIN_ENABLED": False,
}


def fill(rows: int) -> Any:
    """``rows`` completed keys into the second partition ahead; its partition."""
    from django.db import connection

    from django_idempotency.models import IdempotencyKey
    from django_idempotency.store import partitions

    partitions.maintain("default")  # the partitions ahead, again after a drop
    target = partitions.partitions(connection)[2]
    table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
    with connection.cursor() as cursor:
        middle = target.lower + (target.upper - target.lower) / 2
        expires = f"'{middle.isoformat()}'::timestamptz"
        cursor.execute(INSERT.format(table=table, expires=expires), [f"k{time.time()}-", rows])
        cursor.execute(f"ANALYZE {table}")
    return target


def drop(target: Any) -> float:
    from django.db import connection

    from django_idempotency.store import partitions

    started = time.perf_counter()
    partitions.drop(connection, target)
    return time.perf_counter() - started


def delete_rows(target: Any) -> float:
    from django_idempotency.models import IdempotencyKey

    started = time.perf_counter()
    keys = IdempotencyKey.objects
    for _count in keys.iter_delete_expired(batch_size=1000, cutoff=target.upper):
        pass
    return time.perf_counter() - started


class Claimer:
    """A thread that claims new keys without pause; the latencies of a phase on demand."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        from django.db import connections

        from django_idempotency.models import IdempotencyKey

        n = 0
        while not self.stop.is_set():
            started = time.perf_counter()
            IdempotencyKey.objects.claim(
                "bench", f"c{n}-{started}", "f" * 64, ttl=60, lock_timeout=30
            )
            self.latencies.append(time.perf_counter() - started)
            n += 1
        connections.close_all()

    def phase(self, seconds: float | None = None, work: Any = None) -> tuple[list[float], Any]:
        """The latencies while ``work()`` runs (or for ``seconds``), and what it returned."""
        start = len(self.latencies)
        result = None
        if work is not None:
            result = work()
        else:
            time.sleep(seconds or 0)
        return self.latencies[start:] or [float("nan")], result


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def one_round(rows: int, claimer: Claimer) -> dict[str, float]:
    target = fill(rows)
    idle, _ = claimer.phase(seconds=0.5)
    during_drop, dropped = claimer.phase(work=lambda: drop(target))
    target = fill(rows)
    during_delete, deleted = claimer.phase(work=lambda: delete_rows(target))
    return {
        "drop_s": dropped,
        "delete_s": deleted,
        "idle_med": statistics.median(idle),
        "idle_p99": p99(idle),
        "drop_med": statistics.median(during_drop),
        "drop_p99": p99(during_drop),
        "delete_med": statistics.median(during_delete),
        "delete_p99": p99(during_delete),
    }


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rows", default="10000,100000,1000000", help="keys per partition, a comma-separated list")


def run(args: argparse.Namespace) -> int:
    sizes = [int(size) for size in str(args.rows).split(",") if size]
    print(conditions(f"{args.rounds} rounds, partitions of an hour"), flush=True)
    results: dict[int, list[dict[str, float]]] = {}
    with ExitStack() as stack:
        url = stack.enter_context(scratch_database("idem_partitions_"))
        stack.callback(close_connections)
        configure({"default": django_database(url)}, idempotency=IDEMPOTENCY)
        from django_idempotency.store import partitions

        partitions.convert("default")
        claimer = Claimer()
        claimer.thread.start()
        stack.callback(claimer.thread.join)
        stack.callback(claimer.stop.set)
        for rows in sizes:
            results[rows] = [one_round(rows, claimer) for _ in range(args.rounds)]
    emit([report(results)], args.json)
    return 0


def report(results: dict[int, list[dict[str, float]]]) -> Table:
    table = Table(
        "Purging one partition: dropped whole against deleted row by row (median (range))",
        [
            Column("keys"),
            Column("drop ms"),
            Column("row purge ms"),
            Column("row purge / drop"),
            Column("claim p50 during drop / idle"),
            Column("claim p99 during drop / idle"),
            Column("claim p50 during row purge / idle"),
        ],
    )
    for rows, rounds in results.items():

        def of(name: str, rounds: list[dict[str, float]] = rounds) -> list[float]:
            return [r[name] for r in rounds]

        table.add(
            f"{rows:,}",
            spread([v * 1000 for v in of("drop_s")]).format(".0f"),
            spread([v * 1000 for v in of("delete_s")]).format(".0f"),
            ratio(of("delete_s"), of("drop_s")).format(),
            ratio(of("drop_med"), of("idle_med")).format(),
            ratio(of("drop_p99"), of("idle_p99")).format(),
            ratio(of("delete_med"), of("idle_med")).format(),
        )
    return table


MEASURE = Measure(__doc__, run, options, rounds=3, quick={"rows": "2000,20000", "rounds": 2})
