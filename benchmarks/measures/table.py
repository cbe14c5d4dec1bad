"""Write amplification of the key table per new key: heap versions, index entries, WAL, FPIs.

A private PostgreSQL cluster (initdb; autovacuum off, no checkpoint by time or size, fsync
off: what is counted is the WAL written, not how fast it reaches the disk) holds the table,
so that its WAL counters are this measure's alone. The table is migrated and filled with
--rows completed keys (uuid4 keys, ~300-byte JSON responses, expiring over the next day),
vacuumed and analysed. Then, in interleaved rounds, each case starts after a CHECKPOINT (the
first write to each page after one logs a full-page image) and writes --requests new keys:

* uuid4: the db strategy, ``Lifecycle(DatabaseStrategy(), attempt)``, claim then
  ``complete()`` of a 300-byte response, one uuid4 key each (keys land on random leaves of
  the unique index);
* sequential: the same with keys that sort after every key in the table (the baseline:
  every index write at the right edge of its index);
* insert only: the completed row written by one hand-written ``INSERT`` in autocommit, with
  a uuid4 key (the least a new random key can cost: one heap row, one entry per index).

All keys are in one scope, as one client's. Per new key: heap row versions (inserts and
updates, pg_stat_user_tables), the share of updates that were HOT (``n_tup_hot_upd`` over
``n_tup_upd``), index entries (the leaf inserts of ``pg_waldump --stats=record``), WAL
bytes (``pg_current_wal_lsn()`` before and after), WAL records and full-page images
(``pg_stat_wal``). Ratios are taken within each round: uuid4's WAL over sequential's and
over insert only's, median (min-max) over the rounds.
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

from benchmarks.harness.cli import Measure
from benchmarks.harness.inprocess import close_connections, configure
from benchmarks.harness.postgres import PrivateServer, django_database, private_server
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import ratio, spread

SCOPE = "user:1"
FINGERPRINT = "f" * 64
TTL = 86400.0
HEADERS = {"Content-Type": "application/json", "Location": "/api/charges/ch_1/"}
BODY = (
    b'{"id":"ch_3Q0aVb2eZvKYlo2C1x7Jd9Qm","object":"charge","amount":1999,"currency":"eur",'
    b'"status":"succeeded","captured":true,"customer":"cus_R4nd0mCu5t0m3r","description":'
    b'"Order 2026-000123","payment_method":"pm_1Q0aVa2eZvKYlo2CkS3nWmXy","receipt_url":'
    b'"https://pay.example.com/receipts/acct_1/ch_3Q0aVb2eZ","created":1764662400}'
)
CASES = ("uuid4", "sequential", "insert only")

#: The private cluster's settings (beside initdb's defaults).
SERVER = {
    "shared_buffers": "1GB",
    "autovacuum": "off",
    "checkpoint_timeout": "1d",
    "max_wal_size": "20GB",
    "fsync": "off",
    "full_page_writes": "on",
    "synchronous_commit": "on",
}

FILL = """
    INSERT INTO {table} (scope, key, fingerprint, status, claim_token, locked_at,
        request_method, request_path, response_status, response_headers, response_body,
        created_at, completed_at, expires_at)
    SELECT %s, gen_random_uuid()::text, %s, 'completed', gen_random_uuid(), NULL, 'POST',
        '/api/charges/', 201, %s::jsonb, %s, now() - interval '1 hour',
        now() - interval '1 hour', now() + interval '1 day' - (g %% 86400) * interval '1 second'
    FROM generate_series(1, %s) AS g
"""

INSERT_ONE = """
    INSERT INTO {table} (scope, key, fingerprint, status, claim_token, locked_at,
        request_method, request_path, response_status, response_headers, response_body,
        created_at, completed_at, expires_at)
    VALUES (%s, %s, %s, 'completed', %s, NULL, 'POST', '/api/charges/', 201, %s::jsonb, %s,
        statement_timestamp(), statement_timestamp(),
        statement_timestamp() + make_interval(secs => %s))
"""

#: The btree records that add an entry to a leaf (a split carries its new entry too).
LEAF_INSERTS = ("Btree/INSERT_LEAF", "Btree/INSERT_POST", "Btree/SPLIT_L", "Btree/SPLIT_R")


def table_name() -> str:
    from django_idempotency.models import IdempotencyKey

    return IdempotencyKey._meta.db_table


def sql(statement: str, params: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
    """Run ``statement`` on Django's connection (autocommit); its rows, if any."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def fill(rows: int, fillfactor: int | None) -> str:
    """The table filled with ``rows`` completed keys, vacuumed; what it is, in one line."""
    import json

    table = table_name()
    if fillfactor is not None:
        sql(f"ALTER TABLE {table} SET (fillfactor = {int(fillfactor)})")
    headers = json.dumps(HEADERS)
    sql(FILL.format(table=table), [SCOPE, FINGERPRINT, headers, BODY, rows])
    sql(f"ANALYZE {table}")
    options = sql("SELECT reloptions FROM pg_class WHERE relname = %s", [table])[0][0]
    pages = "pg_relation_size(indexname::regclass) / current_setting('block_size')::int"
    indexes = [
        f"{name} ({count:,} pages)"
        for name, count in sql(
            f"SELECT indexname, {pages} FROM pg_indexes WHERE tablename = %s ORDER BY indexname",
            [table],
        )
    ]
    size = sql("SELECT pg_size_pretty(pg_total_relation_size(%s))", [table])[0][0]
    return (
        f"{rows:,} rows ({size}); table options {options or 'none'}; "
        f"{len(indexes)} indexes: {', '.join(indexes)}"
    )


def partition() -> str:
    """The filled table partitioned by expiry (``PARTITION_INTERVAL``), vacuumed; what it
    is, in one line: the partitions, and the rows and unique-index pages of the one that
    this measure's new keys go to (they expire a ``TTL`` from now)."""
    from django.db import connection

    from django_idempotency.store import partitions

    partitions.convert("default")
    table = table_name()
    sql(f"VACUUM ANALYZE {table}")
    found = partitions.partitions(connection)
    now = sql("SELECT statement_timestamp()")[0][0]
    newest = next(p for p in found if p.lower <= now + timedelta(seconds=TTL) < p.upper)
    pages = "pg_relation_size(indexrelid) / current_setting('block_size')::int"
    index_pages = sql(
        f"SELECT {pages} FROM pg_index WHERE indrelid = to_regclass(%s) AND indisunique "
        "AND indnatts = 2",
        [newest.name],
    )[0][0]
    rows = sql(f'SELECT count(*) FROM "{newest.name}"')[0][0]
    return (
        f"partitioned: {len(found)} partitions; the new keys' one, {newest.name}: "
        f"{rows:,} rows, unique (scope, key) index {index_pages:,} pages"
    )


def strategy_keys(next_key: Callable[[], str]) -> Callable[[int], None]:
    """``n`` new keys claimed and completed through the db strategy's Lifecycle."""
    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.strategies import load_strategy
    from django_idempotency.strategies.base import Attempt

    strategy = load_strategy("db")
    response = StoredResponse(status=201, headers=dict(HEADERS), body=BODY)

    def run(n: int) -> None:
        for _ in range(n):
            attempt = Attempt(scope=SCOPE, key=next_key(), fingerprint=FINGERPRINT, ttl=TTL,
                              lock_timeout=60.0, method="POST", path="/api/charges/",
                              database="default")  # fmt: skip
            with Lifecycle(strategy, attempt) as lifecycle:
                if not lifecycle.claimed:
                    raise RuntimeError(f"fresh key not claimed: {lifecycle.outcome!r}")
                lifecycle.complete(response)

    return run


def insert_only(n: int) -> None:
    """``n`` completed rows with uuid4 keys, one hand-written INSERT (autocommit) each."""
    import json

    statement = INSERT_ONE.format(table=table_name())
    headers = json.dumps(HEADERS)
    for _ in range(n):
        sql(statement, [SCOPE, str(uuid.uuid4()), FINGERPRINT, uuid.uuid4(), headers, BODY, TTL])


def sequential() -> Callable[[], str]:
    """Keys in increasing order, after every uuid4 key (``~`` sorts after hex digits); one
    counter for every thread (``next`` of an ``itertools.count`` is atomic)."""
    numbers = itertools.count(1)
    return lambda: f"~{next(numbers):012d}"


def uuid4_key() -> str:
    return str(uuid.uuid4())


def in_threads(write: Callable[[int], None], threads: int) -> Callable[[int], None]:
    """``write`` shared among ``threads`` threads, each on a connection of its own, which
    flushes its statistics and closes before the thread ends."""
    if threads <= 1:
        return write

    def run(n: int) -> None:
        from django.db import connection

        def part(count: int) -> None:
            try:
                write(count)
                sql("SELECT pg_stat_force_next_flush()")
                sql("SELECT 1")
            finally:
                connection.close()

        shares = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]
        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(part, share) for share in shares]:
                done.result()

    return run


def counters() -> dict[str, int]:
    """The table's and the server's counters now (this session's statistics flushed)."""
    sql("SELECT pg_stat_force_next_flush()")
    sql("SELECT 1")  # the flush happens when the session goes idle after the line above
    # The table's own, or its partitions' summed (a partitioned table has no rows itself).
    ins, upd, hot = sql(
        "SELECT sum(n_tup_ins)::bigint, sum(n_tup_upd)::bigint, sum(n_tup_hot_upd)::bigint "
        "FROM pg_stat_user_tables "
        "WHERE relid = to_regclass(%s) OR relid IN (SELECT inhrelid FROM pg_inherits "
        "WHERE inhparent = to_regclass(%s))",
        [table_name(), table_name()],
    )[0]
    lsn, records, fpi = sql(
        "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, wal_records, wal_fpi FROM pg_stat_wal"
    )[0]
    return {"ins": ins, "upd": upd, "hot": hot, "lsn": int(lsn), "records": records, "fpi": fpi}


def waldump(server: PrivateServer, start: int, end: int) -> dict[str, int]:
    """``pg_waldump --stats=record`` between two LSNs: each record type's count."""

    def lsn(value: int) -> str:
        return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"

    result = subprocess.run(
        [str(server.bindir / "pg_waldump"), "--stats=record", "-p", str(server.data / "pg_wal"),
         "-s", lsn(start), "-e", lsn(end)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    counts = {}
    for line in result.stdout.splitlines():
        found = re.match(r"^(\w+/\w+)\s+(\d+)\s", line)
        if found:
            counts[found.group(1)] = int(found.group(2))
    return counts


def measure_case(server: PrivateServer, write: Callable[[int], None], n: int) -> dict[str, float]:
    """One case: CHECKPOINT, ``n`` new keys, their per-key figures."""
    sql("CHECKPOINT")
    before = counters()
    write(n)
    after = counters()
    delta = {name: after[name] - before[name] for name in after}
    records = waldump(server, before["lsn"], after["lsn"])
    return {
        "heap versions": (delta["ins"] + delta["upd"]) / n,
        "updates": delta["upd"] / n,
        "HOT %": 100.0 * delta["hot"] / delta["upd"] if delta["upd"] else 0.0,
        "index entries": sum(records.get(name, 0) for name in LEAF_INSERTS) / n,
        "WAL bytes": delta["lsn"] / n,
        "WAL records": delta["records"] / n,
        "FPI": delta["fpi"] / n,
    }


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rows", type=int, default=100_000,
        help="completed keys in the table before the rounds (default: %(default)s)")  # fmt: skip
    add("--fillfactor", type=int, default=None,
        help="ALTER TABLE … SET (fillfactor) before the fill (default: as migrated)")  # fmt: skip
    add("--threads", type=int, default=1,
        help="threads writing each case's keys at once (default: %(default)s)")  # fmt: skip
    add("--wal-compression", default="off",
        help="the server's wal_compression: off, pglz, lz4 or zstd (default: off)")  # fmt: skip
    add("--partition-interval", type=int, default=None, metavar="SECONDS",
        help="the table partitioned by expiry after the fill (PARTITION_INTERVAL; "
             "default: the plain table)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    import django_idempotency

    settings = {**SERVER, "wal_compression": args.wal_compression}
    what = f"{args.rounds} rounds of {args.requests} keys per case, {args.threads} thread(s)"
    print(conditions(what), flush=True)
    with ExitStack() as stack:
        server = stack.enter_context(private_server(settings))
        stack.callback(close_connections)
        idempotency = {"ADMIN_ENABLED": False, "PARTITION_INTERVAL": args.partition_interval}
        configure({"default": django_database(create_database(server))}, idempotency=idempotency)
        print(f"library {django_idempotency.__file__}; migrations up to {latest_migration()}")
        print(f"server {sql('SHOW server_version')[0][0]}, {settings}", flush=True)
        print(fill(args.rows, args.fillfactor), flush=True)
        if args.partition_interval is not None:
            print(partition(), flush=True)
        writers: dict[str, Callable[[int], None]] = {
            "uuid4": in_threads(strategy_keys(uuid4_key), args.threads),
            "sequential": in_threads(strategy_keys(sequential()), args.threads),
            "insert only": in_threads(insert_only, args.threads),
        }
        results = interleave(
            CASES,
            args.rounds,
            lambda name, _r: measure_case(server, writers[name], args.requests),
            how="flip",
        )
    emit(report(results), args.json)
    return 0


def create_database(server: PrivateServer) -> str:
    """A database ``bench`` on the private server (it goes with the server); its URL."""
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE bench")
    return server.database_url("bench")


def latest_migration() -> str:
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    names = sorted(name for app, name in loader.disk_migrations if app == "django_idempotency")
    return names[-1]


def report(results: dict[str, list[dict[str, float]]]) -> list[Table]:
    headings = list(results[CASES[0]][0])
    columns = [Column(h, ".0f" if h == "WAL bytes" else ".2f") for h in headings]
    table = Table("Per new key, median (min-max) over the rounds", [Column("case"), *columns])
    for name in CASES:
        table.add(name, *(spread([r[h] for r in results[name]]) for h in headings))
    ratios = Table("uuid4 against the baselines, ratio within each round", [
        Column("figure"), Column("uuid4 / sequential", ".2f"), Column("uuid4 / insert only", ".2f"),
    ])  # fmt: skip
    for heading in ("WAL bytes", "FPI", "index entries", "heap versions"):
        mine = [r[heading] for r in results["uuid4"]]
        seq = [r[heading] for r in results["sequential"]]
        alone = [r[heading] for r in results["insert only"]]
        if all(seq) and all(alone):
            ratios.add(heading, ratio(mine, seq), ratio(mine, alone))
    return [table, ratios]


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=3,
    requests=1000,
    quick={"rows": 20_000, "requests": 300, "rounds": 2},
)
