"""The capacity model's figures: per strategy, what a new key and a replay cost, and how fast.

One private PostgreSQL cluster (initdb; ``pg_stat_statements`` preloaded, autovacuum off, no
checkpoint by time or size: its counters are this measure's alone) and one private
redis-server. The key table is migrated and filled with --rows completed keys (uuid4 keys,
300-byte JSON responses, as ``python -m benchmarks table``), vacuumed; then:

1. Counts (one pass of --requests keys per case, through the real strategies,
   ``Lifecycle(strategy, attempt)`` as a view drives it; uuid4 keys; each case after a
   ``CHECKPOINT``): for db, advisory_lock, redis and hybrid, per new key (claim, then
   ``complete()`` of the 300-byte response) and per replay of a completed key: SQL
   statements (``pg_stat_statements``), COMMITs sent, transactions that wrote WAL (its
   ``Transaction/COMMIT`` records), key table row versions, WAL bytes, full-page images;
   Redis commands (``INFO commandstats``, a script's commands included), bytes in and out,
   keys left and their ``MEMORY USAGE``. hybrid is counted in the steady state (its loss
   check as a Redis that has lost nothing for a TTL leaves it) and as "hybrid, DB check"
   (HYBRID_DB_CHECK "always": every new key also looked up in PostgreSQL, as on a Redis
   Cluster or for a TTL after a loss); "hybrid drain" is the drain of those keys' outbox
   rows, per row. Storage: bytes per row of the filled table, its heap and each index.
2. Speed (--rounds interleaved rounds of --requests new keys, one thread): each strategy's
   keys/s and client CPU per key, against the same work written on the raw drivers (see
   ``speed.py``), the ratio taken within each round.
3. The drain (``python -m benchmarks drain``'s cases "reference" and "library", --drain-rows
   rows per round, --drain-workers workers) and the purge (``python -m benchmarks purge``'s
   fill and statement path, --purge-rows expired rows per round): rows/s.

Counts are exact (they do not depend on the machine); WAL and full-page images depend on
the table's size and on where the checkpoint falls; speeds depend on the machine and are
only printed, with their spread.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from typing import Any

from benchmarks.harness.cli import Measure, names
from benchmarks.harness.inprocess import close_connections, configure
from benchmarks.harness.postgres import django_database, private_server
from benchmarks.harness.redis import redis_server
from benchmarks.harness.report import conditions, emit
from benchmarks.measures import table as key_table

from . import tables
from .stages import count_all, drain_rounds, purge_rounds, settings_for, speed_rounds, storage

STRATEGIES = ("db", "advisory_lock", "redis", "hybrid")

#: The private cluster (beside initdb's defaults).
SERVER = {
    "shared_buffers": "256MB",
    "shared_preload_libraries": "pg_stat_statements",
    "autovacuum": "off",
    "checkpoint_timeout": "1d",
    "max_wal_size": "20GB",
    "full_page_writes": "on",
}


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rows", type=int, default=100_000,
        help="completed keys in the table before the counts (default: %(default)s)")  # fmt: skip
    add("--drain-rows", type=int, default=50_000, help="outbox rows per drain round")
    add("--drain-workers", type=int, default=1, help="drainers at once (default: 1)")
    add("--purge-rows", type=int, default=200_000, help="expired rows per purge round")
    add("--stages", type=names, default=["counts", "speed", "drain", "purge"],
        help="default: counts,speed,drain,purge")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    import django_idempotency

    what = (f"{args.requests} keys per count and run, {args.rounds} speed rounds, "
            f"{args.rows:,} rows in the table")  # fmt: skip
    print(conditions(what), flush=True)
    found: list[Any] = []
    with ExitStack() as stack:
        server = stack.enter_context(private_server(SERVER))
        redis_url, _port = stack.enter_context(redis_server())
        stack.callback(close_connections)
        url = key_table.create_database(server)
        configure({"default": django_database(url)}, idempotency=settings_for(redis_url, "db"))
        key_table.sql("CREATE EXTENSION pg_stat_statements")
        print(f"library {django_idempotency.__file__}; "
              f"migrations up to {key_table.latest_migration()}")  # fmt: skip
        print(f"PostgreSQL {key_table.sql('SHOW server_version')[0][0]}, {SERVER}", flush=True)
        print(key_table.fill(args.rows, None), flush=True)
        found.append(tables.storage(storage(args.rows)))
        if "counts" in args.stages:
            found += tables.counts(count_all(server, url, redis_url, args))
        if "speed" in args.stages:
            found.append(tables.speed(speed_rounds(url, redis_url, args), args.strategies))
        if "drain" in args.stages:
            found.append(tables.drain(drain_rounds(url, args), args.drain_workers))
        if "purge" in args.stages:
            found.append(tables.purge(purge_rounds(args)))
    emit(found, args.json)
    return 0


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=5,
    requests=1000,
    strategies=STRATEGIES,
    quick={
        "rows": 5_000,
        "requests": 100,
        "rounds": 2,
        "drain_rows": 5_000,
        "purge_rows": 10_000,
    },
)
