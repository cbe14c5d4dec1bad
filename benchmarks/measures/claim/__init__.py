"""Claim + complete throughput of the strategies against raw driver loops.

Each iteration takes one fresh key, claims it and completes it with a small stored
response. Every case is measured against a raw loop in the same run:

* db-postgres, db-sqlite: ``Lifecycle(DatabaseStrategy(), ...)`` then ``complete()``, against a
  raw psycopg 3 / sqlite3 loop sending the same SQL text with the parameters the manager
  passes: the autocommit ``INSERT … SELECT … WHERE NOT EXISTS … ON CONFLICT DO NOTHING
  RETURNING`` (its NOT EXISTS is the check of the hybrid outbox), then the completion
  ``UPDATE`` in its own transaction. The manager API (``IdempotencyKey.objects.claim`` /
  ``complete``) is measured as well.
* advisory-postgres: ``Lifecycle(AdvisoryLockStrategy(), ...)`` then ``complete()``, against (a) a
  raw loop replaying the very statements the strategy sends (recorded from it at start-up,
  with fresh keys, tokens and times) and (b) a hand-written raw loop with only the
  statements the protocol needs (try-lock, read, one upsert).

The raw psycopg loops use ``psycopg.ClientCursor``, the cursor Django uses, so that the same
SQL text goes over the wire; a default-cursor loop (server-side binding, statements prepared
after five runs) is shown for reference.

Rounds are interleaved (the variants' order flips every round); the table is emptied before
each run. The ratio is the variant's rate over the baseline's within each round, median
(min-max) over the rounds. PostgreSQL: a scratch database, dropped at the end; SQLite: a file
in a temporary directory (WAL, synchronous=NORMAL, as the example project).
--requests is the claims per run on PostgreSQL, --sqlite-requests on SQLite.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from contextlib import ExitStack
from typing import Any

from benchmarks.harness.cli import Measure, names
from benchmarks.harness.inprocess import close_connections, configure
from benchmarks.harness.postgres import ADMIN_URL, django_database, scratch_database
from benchmarks.harness.report import conditions, emit

from .advisory import raw_advisory_minimal, raw_advisory_replay
from .cases import Case, Variant, profile, report, run_case
from .loops import manager_loop, raw_db_postgres, raw_db_sqlite, strategy_loop

CASES = ("db-postgres", "db-sqlite", "advisory-postgres")


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sqlite-requests",
        type=int,
        default=1500,
        help="claims per run on SQLite (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=50,
        help="claims per variant before the rounds (default: %(default)s)",
    )
    parser.add_argument(
        "--cases",
        type=names,
        default=list(CASES),
        help=f"comma-separated (default: {','.join(CASES)})",
    )
    parser.add_argument(
        "--profile",
        default="",
        metavar="CASE[:VARIANT]",
        help="cProfile one loop instead of measuring",
    )


def postgres_cases(url: str, requests: int, wanted: list[str]) -> list[Case]:
    cases = []
    if "db-postgres" in wanted:
        cases.append(Case("db-postgres", "default", requests, [
            Variant("raw psycopg (ClientCursor)", raw_db_postgres(url, "default"), True),
            Variant("strategy db", strategy_loop("db", "default")),
            Variant("manager claim/complete", manager_loop("default")),
            Variant("raw psycopg (prepared)", raw_db_postgres(url, "default", client_cursor=False),
                    note="reference: server-side binding"),
        ]))  # fmt: skip
    if "advisory-postgres" in wanted:
        replay, count = raw_advisory_replay(url, "default")
        cases.append(Case("advisory-postgres", "default", requests, [
            Variant("raw psycopg, same statements", replay, True,
                    note=f"{count} statements in one transaction"),
            Variant("strategy advisory_lock", strategy_loop("advisory_lock", "default")),
            Variant("raw psycopg, minimal", raw_advisory_minimal(url),
                    note="try-lock, read, one upsert: 3 statements"),
        ]))  # fmt: skip
    return cases


def sqlite_case(path: str, requests: int) -> Case:
    return Case("db-sqlite", "sqlite", requests, [
        Variant("raw sqlite3", raw_db_sqlite(path, "sqlite"), True),
        Variant("strategy db", strategy_loop("db", "sqlite")),
        Variant("manager claim/complete", manager_loop("sqlite")),
    ])  # fmt: skip


def databases(stack: ExitStack, wanted: list[str]) -> tuple[str | None, str]:
    """A scratch PostgreSQL database when a PostgreSQL case is wanted (its URL), a SQLite
    file (its path); Django configured with both ("default", "sqlite")."""
    sqlite_path = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "bench.sqlite3")
    sqlite: dict[str, Any] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": sqlite_path,
        "OPTIONS": {
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
    pg_url = None
    if any(name.endswith("-postgres") for name in wanted):
        try:
            pg_url = stack.enter_context(scratch_database())
        except Exception as exc:  # reported; the SQLite case still runs
            print(f"PostgreSQL at {ADMIN_URL} unavailable ({exc}); SQLite only")
    stack.callback(close_connections)
    default = sqlite if pg_url is None else django_database(pg_url)
    configure({"default": default, "sqlite": sqlite})
    return pg_url, sqlite_path


def run(args: argparse.Namespace) -> int:
    print(conditions(f"{args.rounds} rounds"), flush=True)
    with ExitStack() as stack:
        pg_url, sqlite_path = databases(stack, args.cases)
        cases = postgres_cases(pg_url, args.requests, args.cases) if pg_url else []
        if "db-sqlite" in args.cases:
            cases.append(sqlite_case(sqlite_path, args.sqlite_requests))
        if args.profile:
            case_name, _, variant_name = args.profile.partition(":")
            case = next(c for c in cases if c.name == case_name)
            profile(case, variant_name or next(v.name for v in case.variants if not v.baseline))
            return 0
        for case in cases:
            run_case(case, args.rounds, args.warmup)
        emit([report(case) for case in cases], args.json)
    return 0


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=9,
    requests=400,
    quick={"rounds": 3, "requests": 100, "sqlite_requests": 300, "warmup": 20},
)
