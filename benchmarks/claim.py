"""Claim + complete throughput of the strategies against raw driver loops.

Each iteration takes one fresh key, claims it and completes it with a small
stored response. Every case is measured against a raw loop in the same run:

* ``db`` on PostgreSQL and on SQLite: ``Lifecycle(DatabaseStrategy(), ...)`` then
  ``complete()``, against a raw psycopg 3 / sqlite3 loop sending the same SQL
  text with the parameters the manager passes: the autocommit ``INSERT …
  SELECT … WHERE NOT EXISTS … ON CONFLICT DO NOTHING RETURNING`` (its NOT
  EXISTS is the check of the ``hybrid`` outbox), then the completion ``UPDATE``
  in its own transaction, the two statements the strategy sends. The manager API
  (``IdempotencyKey.objects.claim``/``complete``) is measured as well.
* ``advisory_lock`` on PostgreSQL: ``Lifecycle(AdvisoryLockStrategy(), ...)`` then
  ``complete()``, against (a) a raw loop replaying the very statements the
  strategy sends (recorded from it at start-up, with fresh keys, tokens and
  times) and (b) a hand-written raw loop with only the statements the protocol
  needs (try-lock, read, one upsert).

The raw psycopg loops use ``psycopg.ClientCursor``, the cursor Django uses, so
that the same SQL text goes over the wire; a default-cursor loop (server-side
binding, statements prepared after five runs) is shown for reference.

Runs are interleaved (baseline and candidate alternate, the order flips every
round) and the medians are reported, so that drift on a shared machine hits
both sides. The table is emptied before each run. A scratch PostgreSQL database
``idem_bench_<pid>`` is created and dropped at the end; SQLite uses a file in a
temporary directory (WAL, ``synchronous=NORMAL``, as the example project).

    .venv/bin/python benchmarks/claim.py [--rounds 9] [--pg-iterations 400]
        [--sqlite-iterations 1500] [--only db-postgres,db-sqlite,advisory-postgres]
        [--profile 'db-sqlite:manager claim/complete'] [--json results.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.databases import pg_admin  # noqa: E402

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
SCOPE = "user:1"
FINGERPRINT = "f" * 64
TTL = 86400.0
LOCK_TIMEOUT = 60.0
METHOD = "POST"
PATH = "/api/charges/"
HEADERS = {"Content-Type": "application/json"}
BODY = b'{"id":1,"amount":1000,"currency":"EUR","psp_reference":"psp_0123456789abcdef01234567"}'

Loop = Callable[[int, str], None]


# -- set-up ---------------------------------------------------------------------------------


def configure_django(pg_name: str | None, sqlite_path: str) -> None:
    import django
    from django.conf import settings

    databases: dict[str, dict[str, Any]] = {
        "sqlite": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": sqlite_path,
            "OPTIONS": {
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
    if pg_name is not None:
        admin = urlsplit(ADMIN_URL)
        databases["default"] = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": pg_name,
            "USER": admin.username or "postgres",
            "PASSWORD": admin.password or "",
            "HOST": admin.hostname or "127.0.0.1",
            "PORT": str(admin.port or 5432),
            "CONN_MAX_AGE": None,
        }
    else:
        databases["default"] = databases["sqlite"]
    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        TIME_ZONE="UTC",
        SECRET_KEY="benchmark",
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django_idempotency",
        ],
        DATABASES=databases,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        IDEMPOTENCY={"ADMIN_ENABLED": False},
    )
    django.setup()
    from django.core.management import call_command

    for alias in databases:
        call_command("migrate", database=alias, verbosity=0)


def pg_conninfo(name: str) -> str:
    return urlsplit(ADMIN_URL)._replace(path="/" + name).geturl()


def table() -> str:
    from django_idempotency.models import IdempotencyKey

    return IdempotencyKey._meta.db_table


def empty_table(alias: str) -> None:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "postgresql":
            cursor.execute(f'TRUNCATE "{table()}"')
        else:
            cursor.execute(f'DELETE FROM "{table()}"')


def completed_rows(alias: str) -> int:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM \"{table()}\" WHERE status = 'completed'")
        return int(cursor.fetchone()[0])


# -- the library's loops --------------------------------------------------------------------


def strategy_loop(strategy_name: str, alias: str) -> Loop:
    """``Lifecycle(strategy, attempt)`` → a claim → ``complete(response)``."""
    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.strategies import load_strategy
    from django_idempotency.strategies.base import Attempt

    strategy = load_strategy(strategy_name)
    response = StoredResponse(status=201, headers=dict(HEADERS), body=BODY)

    def run(n: int, prefix: str) -> None:
        for i in range(n):
            attempt = Attempt(
                scope=SCOPE,
                key=f"{prefix}-{i}",
                fingerprint=FINGERPRINT,
                ttl=TTL,
                lock_timeout=LOCK_TIMEOUT,
                method=METHOD,
                path=PATH,
                database=alias,
            )
            with Lifecycle(strategy, attempt) as lifecycle:
                if not lifecycle.claimed:
                    raise RuntimeError(f"fresh key not claimed: {lifecycle.outcome!r}")
                lifecycle.complete(response)

    return run


def manager_loop(alias: str) -> Loop:
    """``IdempotencyKey.objects.claim`` then ``complete`` in ``transaction.atomic``."""
    from django.db import transaction

    from django_idempotency.models import IdempotencyKey
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.store.records import ClaimState

    manager = IdempotencyKey.objects
    response = StoredResponse(status=201, headers=dict(HEADERS), body=BODY)

    def run(n: int, prefix: str) -> None:
        for i in range(n):
            result = manager.claim(
                SCOPE,
                f"{prefix}-{i}",
                FINGERPRINT,
                ttl=TTL,
                lock_timeout=LOCK_TIMEOUT,
                method=METHOD,
                path=PATH,
                using=alias,
            )
            if result.state is not ClaimState.CLAIMED:
                raise RuntimeError(f"fresh key not claimed: {result!r}")
            assert result.pk is not None and result.token is not None
            with transaction.atomic(using=alias):
                if not manager.complete(result.pk, result.token, response, ttl=TTL, using=alias):
                    raise RuntimeError("completion lost")

    return run


# -- raw loops ------------------------------------------------------------------------------


def statements(alias: str) -> Any:
    """The manager's statements for ``alias`` (the raw loops send the same SQL text)."""
    from django.db import connections

    from django_idempotency.store.sql import statements as compiled

    return compiled(connections[alias])


def raw_params(statement: Any) -> Callable[[dict[str, Any]], list[Any]]:
    """``statement``'s parameter list from ``values`` by name, in the order
    ``Statement.params`` builds it, without Django: an app-clock time (SQLite) is the text
    Django stores (naive UTC), now plus the seconds in ``values[name]``."""
    slots = statement.param_slots
    if not statement.app_clock:
        names = [name for name, _is_time in slots]
        return lambda values: [values[name] for name in names]

    def build(values: dict[str, Any]) -> list[Any]:
        now = datetime.now(UTC).replace(tzinfo=None)
        return [
            (str(now + timedelta(seconds=values[name])) if name else str(now))
            if is_time
            else values[name]
            for name, is_time in slots
        ]

    return build


def raw_db_postgres(conninfo: str, alias: str, *, client_cursor: bool = True) -> Loop:
    """Autocommit claim, then the completion UPDATE in its own transaction."""
    import psycopg
    from psycopg.types.json import Jsonb

    sql = statements(alias)
    claim_sql, claim_params = sql.claim.sql, raw_params(sql.claim)
    complete_sql, complete_params = sql.complete.sql, raw_params(sql.complete)
    conn = psycopg.connect(
        conninfo,
        autocommit=True,
        cursor_factory=psycopg.ClientCursor if client_cursor else psycopg.Cursor,
    )
    claim_values: dict[str, Any] = {
        "scope": SCOPE,
        "fingerprint": FINGERPRINT,
        "status": "in_progress",
        "request_method": METHOD,
        "request_path": PATH,
        "response_headers": Jsonb({}),
        "ttl": TTL,
    }
    complete_values: dict[str, Any] = {
        "response_status": 201,
        "response_headers": Jsonb(dict(HEADERS)),
        "response_body": BODY,
        "ttl": TTL,
    }

    def run(n: int, prefix: str) -> None:
        cur = conn.cursor()
        for i in range(n):
            token = uuid.uuid4()
            claim_values["key"] = f"{prefix}-{i}"
            claim_values["claim_token"] = token
            cur.execute(claim_sql, claim_params(claim_values))
            row = cur.fetchone()
            if row is None:
                raise RuntimeError("fresh key not claimed")
            with conn.transaction():
                complete_values["pk"] = row[0]
                complete_values["token"] = token
                cur.execute(complete_sql, complete_params(complete_values))
                if cur.rowcount != 1:
                    raise RuntimeError("completion lost")

    return run


def raw_db_sqlite(path: str, alias: str) -> Loop:
    """The same on sqlite3, with the connection set up as Django sets up its own."""
    sql = statements(alias)
    claim_sql, claim_params = sql.claim.sql.replace("%s", "?"), raw_params(sql.claim)
    complete_sql = sql.complete.sql.replace("%s", "?")
    complete_params = raw_params(sql.complete)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    for pragma in (
        "PRAGMA foreign_keys = ON",
        "PRAGMA legacy_alter_table = OFF",
        "PRAGMA journal_mode=WAL",
        "PRAGMA synchronous=NORMAL",
    ):
        conn.execute(pragma)
    claim_values: dict[str, Any] = {
        "scope": SCOPE,
        "fingerprint": FINGERPRINT,
        "status": "in_progress",
        "request_method": METHOD,
        "request_path": PATH,
        "response_headers": "{}",
        "ttl": TTL,
    }
    complete_values: dict[str, Any] = {
        "response_status": 201,
        "response_headers": json.dumps(HEADERS),
        "response_body": BODY,
        "ttl": TTL,
    }

    def run(n: int, prefix: str) -> None:
        cur = conn.cursor()
        for i in range(n):
            token = uuid.uuid4().hex
            claim_values["key"] = f"{prefix}-{i}"
            claim_values["claim_token"] = token
            cur.execute(claim_sql, claim_params(claim_values))
            row = cur.fetchone()
            if row is None:
                raise RuntimeError("fresh key not claimed")
            cur.execute("BEGIN")
            complete_values["pk"] = row[0]
            complete_values["token"] = token
            cur.execute(complete_sql, complete_params(complete_values))
            if cur.rowcount != 1:
                raise RuntimeError("completion lost")
            cur.execute("COMMIT")

    return run


def record_advisory(alias: str) -> tuple[list[tuple[str, Any]], str]:
    """The statements one advisory_lock claim + complete sends, with their parameters."""
    from django.db import connections

    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.strategies import load_strategy
    from django_idempotency.strategies.base import Attempt

    recorded: list[tuple[str, Any]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        recorded.append((sql, params))
        return execute(sql, params, many, context)

    key = f"record-{uuid.uuid4().hex}"
    attempt = Attempt(SCOPE, key, FINGERPRINT, TTL, LOCK_TIMEOUT, METHOD, PATH, database=alias)
    strategy = load_strategy("advisory_lock")
    with connections[alias].execute_wrapper(wrapper), Lifecycle(strategy, attempt) as lifecycle:
        lifecycle.complete(StoredResponse(201, dict(HEADERS), BODY))
    return recorded, key


def raw_advisory_replay(conninfo: str, alias: str) -> tuple[Loop, int]:
    """One transaction replaying the recorded statements with a fresh key, token and times."""
    import psycopg

    from django_idempotency.strategies.advisory import lock_name

    recorded, rec_key = record_advisory(alias)
    rec_lock = lock_name(SCOPE, rec_key)
    rec_times = [p for _sql, ps in recorded for p in (ps or ()) if isinstance(p, datetime)]
    rec_base = min(rec_times) if rec_times else datetime.now(UTC)

    def substitute(params: Any, key: str, lock: str, now: datetime) -> Any:
        if params is None:
            return None
        out = []
        for p in params:
            if p == rec_key:
                p = key
            elif p == rec_lock:
                p = lock
            elif isinstance(p, datetime):
                p = now + (p - rec_base)
            elif isinstance(p, uuid.UUID):
                p = uuid.uuid4()
            out.append(p)
        return out

    conn = psycopg.connect(conninfo, autocommit=True, cursor_factory=psycopg.ClientCursor)

    def run(n: int, prefix: str) -> None:
        cur = conn.cursor()
        for i in range(n):
            key = f"{prefix}-{i}"
            lock = lock_name(SCOPE, key)
            now = datetime.now(UTC)
            with conn.transaction():
                for sql, params in recorded:
                    cur.execute(sql, substitute(params, key, lock, now))

    return run, len(recorded)


def raw_advisory_minimal(conninfo: str) -> Loop:
    """What the protocol needs: take the (free) lock, read, one INSERT … ON CONFLICT DO UPDATE."""
    import psycopg
    from psycopg.types.json import Jsonb

    from django_idempotency.strategies.advisory import lock_name

    try_lock_sql = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))"

    t = f'"{table()}"'
    read_sql = (
        f"SELECT fingerprint, status, expires_at, response_status, response_headers, "
        f"response_body FROM {t} WHERE key = %s AND scope = %s LIMIT 1"
    )
    columns = (
        "scope, key, fingerprint, status, claim_token, locked_at, request_method, request_path, "
        "response_status, response_headers, response_body, created_at, completed_at, expires_at"
    )
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns.split(", ")[2:])
    write_sql = (
        f"INSERT INTO {t} ({columns}) VALUES ({', '.join(['%s'] * 14)}) "
        f"ON CONFLICT (scope, key) DO UPDATE SET {updates}"
    )
    conn = psycopg.connect(conninfo, autocommit=True, cursor_factory=psycopg.ClientCursor)
    ttl = timedelta(seconds=TTL)

    def run(n: int, prefix: str) -> None:
        cur = conn.cursor()
        for i in range(n):
            key = f"{prefix}-{i}"
            with conn.transaction():
                cur.execute(try_lock_sql, [lock_name(SCOPE, key)])
                if not cur.fetchone()[0]:  # type: ignore[index]
                    raise RuntimeError("fresh key locked")
                cur.execute(read_sql, (key, SCOPE))
                if cur.fetchone() is not None:
                    raise RuntimeError("fresh key found")
                now = datetime.now(UTC)
                cur.execute(
                    write_sql,
                    (
                        SCOPE,
                        key,
                        FINGERPRINT,
                        "completed",
                        uuid.uuid4(),
                        None,
                        METHOD,
                        PATH,
                        201,
                        Jsonb(dict(HEADERS)),
                        BODY,
                        now,
                        now,
                        now + ttl,
                    ),
                )

    return run


# -- measuring ------------------------------------------------------------------------------


@dataclass
class Variant:
    name: str
    loop: Loop
    baseline: bool = False
    note: str = ""
    rates: list[float] = field(default_factory=list)
    #: This process's CPU time per iteration (µs), run by run: the client-side cost, which
    #: other load on the machine changes far less than the wall-clock rate.
    cpu_us: list[float] = field(default_factory=list)


@dataclass
class Case:
    name: str
    alias: str
    iterations: int
    variants: list[Variant]

    @property
    def baseline(self) -> Variant:
        return next(v for v in self.variants if v.baseline)


def measure(case: Case, variant: Variant, prefix: str) -> float:
    empty_table(case.alias)
    cpu = time.process_time()
    start = time.perf_counter()
    variant.loop(case.iterations, prefix)
    elapsed = time.perf_counter() - start
    variant.cpu_us.append((time.process_time() - cpu) / case.iterations * 1e6)
    done = completed_rows(case.alias)
    if done != case.iterations:
        raise RuntimeError(
            f"{case.name}/{variant.name}: {done} completed rows, not {case.iterations}"
        )
    return case.iterations / elapsed


def run_case(case: Case, rounds: int, warmup: int) -> None:
    for variant in case.variants:  # warm up connections, caches and prepared statements
        empty_table(case.alias)
        variant.loop(warmup, f"warm-{variant.name}")
    for r in range(rounds):
        order = case.variants if r % 2 == 0 else list(reversed(case.variants))
        for variant in order:
            variant.rates.append(measure(case, variant, f"r{r}-{variant.name}"))
        line = "  ".join(f"{v.name} {v.rates[-1]:8.0f}/s" for v in case.variants)
        print(f"  round {r + 1}/{rounds}: {line}", flush=True)


def report(case: Case) -> list[dict[str, Any]]:
    base = case.baseline
    base_median = statistics.median(base.rates)
    print(f"\n{case.name}: {case.iterations} claim+complete per run, {len(base.rates)} runs each")
    print(
        f"  {'variant':<34} {'median/s':>9} {'min/s':>8} {'max/s':>8} {'µs/op':>7} "
        f"{'ratio':>6} {'cpu µs/op':>9}"
    )
    rows = []
    for v in case.variants:
        median = statistics.median(v.rates)
        paired = statistics.median(a / b for a, b in zip(v.rates, base.rates, strict=True))
        print(
            f"  {v.name:<34} {median:9.0f} {min(v.rates):8.0f} {max(v.rates):8.0f} "
            f"{1e6 / median:7.0f} {paired:6.2f} {statistics.median(v.cpu_us):9.0f}"
            + (f"  {v.note}" if v.note else "")
        )
        rows.append(
            {
                "case": case.name,
                "variant": v.name,
                "baseline": base.name,
                "median_per_s": round(median, 1),
                "min_per_s": round(min(v.rates), 1),
                "max_per_s": round(max(v.rates), 1),
                "ratio_median_of_pairs": round(paired, 3),
                "ratio_of_medians": round(median / base_median, 3),
                "cpu_us_per_op_median": round(statistics.median(v.cpu_us), 1),
                "runs": v.rates,
            }
        )
    return rows


def profile(case: Case, variant_name: str) -> None:
    variant = next(v for v in case.variants if v.name == variant_name)
    empty_table(case.alias)
    profiler = cProfile.Profile()
    profiler.enable()
    variant.loop(case.iterations, "profile")
    profiler.disable()
    for sort in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(30)
        print(f"\n--- cProfile of {case.name}/{variant_name}, by {sort} ---")
        print(out.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--pg-iterations", type=int, default=400)
    parser.add_argument("--sqlite-iterations", type=int, default=1500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--only", default="db-postgres,db-sqlite,advisory-postgres")
    parser.add_argument(
        "--profile", default="", help="CASE[:VARIANT]: cProfile one loop instead of measuring"
    )
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()
    wanted = set(args.only.split(","))

    pg_name = f"idem_bench_{os.getpid()}"
    try:
        pg_admin(f'CREATE DATABASE "{pg_name}"', ADMIN_URL)
    except Exception as exc:  # reported; the SQLite case still runs
        print(f"PostgreSQL at {ADMIN_URL} unavailable ({exc}); SQLite only")
        pg_name = None  # type: ignore[assignment]
        wanted -= {"db-postgres", "advisory-postgres"}
    tmp = tempfile.TemporaryDirectory(prefix="idem-bench-")
    sqlite_path = os.path.join(tmp.name, "bench.sqlite3")
    try:
        configure_django(pg_name, sqlite_path)
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
            f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        cases = []
        if "db-postgres" in wanted:
            info = pg_conninfo(pg_name)
            cases.append(
                Case(
                    "db-postgres",
                    "default",
                    args.pg_iterations,
                    [
                        Variant(
                            "raw psycopg (ClientCursor)", raw_db_postgres(info, "default"), True
                        ),
                        Variant("strategy db", strategy_loop("db", "default")),
                        Variant("manager claim/complete", manager_loop("default")),
                        Variant(
                            "raw psycopg (prepared)",
                            raw_db_postgres(info, "default", client_cursor=False),
                            note="reference: server-side binding",
                        ),
                    ],
                )
            )
        if "db-sqlite" in wanted:
            cases.append(
                Case(
                    "db-sqlite",
                    "sqlite",
                    args.sqlite_iterations,
                    [
                        Variant("raw sqlite3", raw_db_sqlite(sqlite_path, "sqlite"), True),
                        Variant("strategy db", strategy_loop("db", "sqlite")),
                        Variant("manager claim/complete", manager_loop("sqlite")),
                    ],
                )
            )
        if "advisory-postgres" in wanted:
            info = pg_conninfo(pg_name)
            replay, count = raw_advisory_replay(info, "default")
            cases.append(
                Case(
                    "advisory-postgres",
                    "default",
                    args.pg_iterations,
                    [
                        Variant(
                            "raw psycopg, same statements",
                            replay,
                            True,
                            note=f"{count} statements in one transaction",
                        ),
                        Variant(
                            "strategy advisory_lock", strategy_loop("advisory_lock", "default")
                        ),
                        Variant(
                            "raw psycopg, minimal",
                            raw_advisory_minimal(info),
                            note="try-lock, read, one upsert: 3 statements",
                        ),
                    ],
                )
            )
        if args.profile:
            case_name, _, variant_name = args.profile.partition(":")
            case = next(c for c in cases if c.name == case_name)
            if not variant_name:
                variant_name = next(v.name for v in case.variants if not v.baseline)
            profile(case, variant_name)
            return 0
        results: list[dict[str, Any]] = []
        for case in cases:
            print(f"\n{case.name}", flush=True)
            run_case(case, args.rounds, args.warmup)
        print()
        for case in cases:
            results += report(case)
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        return 0
    finally:
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # Django may not be configured yet
            pass
        if pg_name is not None:
            pg_admin(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)', ADMIN_URL)
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
