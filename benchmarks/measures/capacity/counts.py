"""What one new key and one replay cost each store, counted on private servers.

PostgreSQL (a private cluster with ``pg_stat_statements``): the statements the strategy sent
(``pg_stat_statements`` calls of this database, ``BEGIN``/``COMMIT``/``ROLLBACK``/savepoints
apart), the transactions that wrote (the ``Transaction/COMMIT`` records of ``pg_waldump``),
heap row versions (``pg_stat_user_tables``), WAL bytes (``pg_current_wal_lsn()``) and
full-page images (``pg_stat_wal``) after a ``CHECKPOINT``. Redis (a private server): every
command the server ran (``INFO commandstats`` after ``CONFIG RESETSTAT``, the commands a
script runs included), the bytes in and out (``total_net_input_bytes`` /
``total_net_output_bytes``) and ``MEMORY USAGE`` of the keys a new key leaves behind. (Not
the server's CPU time: ``INFO cpu`` also counts the server's own work while the client waits
for PostgreSQL, in proportion to the wall time, not to the keys.)
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.harness.postgres import PrivateServer
from benchmarks.measures import table as key_table

#: Statements that only delimit a transaction.
CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "START")
#: ``python -m benchmarks table``'s JSON response, headers and fingerprint: the same record.
SCOPE, FINGERPRINT, HEADERS, BODY = (key_table.SCOPE, key_table.FINGERPRINT, key_table.HEADERS,
                                     key_table.BODY)  # fmt: skip
TTL = key_table.TTL


def attempt(key: str) -> Any:
    from django_idempotency.strategies.base import Attempt

    return Attempt(scope=SCOPE, key=key, fingerprint=FINGERPRINT, ttl=TTL, lock_timeout=60.0,
                   method="POST", path="/api/charges/", database="default")  # fmt: skip


def new_keys(strategy: Any) -> Callable[[int], None]:
    """``n`` fresh uuid4 keys claimed and completed through ``Lifecycle`` (as a view)."""
    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse

    response = StoredResponse(status=201, headers=dict(HEADERS), body=BODY)

    def run(n: int) -> None:
        for _ in range(n):
            with Lifecycle(strategy, attempt(str(uuid.uuid4()))) as lifecycle:
                if not lifecycle.claimed:
                    raise RuntimeError(f"fresh key not claimed: {lifecycle.outcome!r}")
                lifecycle.complete(response)

    return run


def replays(strategy: Any) -> Callable[[int], None]:
    """One key completed now (uncounted); ``n`` requests that replay it."""
    from django_idempotency.protocol.lifecycle import Lifecycle
    from django_idempotency.protocol.replay import StoredResponse
    from django_idempotency.strategies.base import Replay

    key = str(uuid.uuid4())
    with Lifecycle(strategy, attempt(key)) as lifecycle:
        lifecycle.complete(StoredResponse(status=201, headers=dict(HEADERS), body=BODY))

    def run(n: int) -> None:
        for _ in range(n):
            with Lifecycle(strategy, attempt(key)) as lifecycle:
                if not isinstance(lifecycle.outcome, Replay):
                    raise RuntimeError(f"not a replay: {lifecycle.outcome!r}")

    return run


def drained() -> Callable[[int], None]:
    """The outbox drained (``IdempotencyOutbox.objects.drain()``, batches of 1,000) until
    empty; it must move ``n`` rows."""
    from django_idempotency.models import IdempotencyOutbox

    def run(n: int) -> None:
        moved = 0
        while (rows := IdempotencyOutbox.objects.drain(1000).rows) > 0:
            moved += rows
        if moved != n:
            raise RuntimeError(f"drained {moved} rows, not {n}")

    return run


class Counters:
    """Readings of the private PostgreSQL and Redis servers around one case."""

    def __init__(self, server: PrivateServer, database_url: str, redis_url: str) -> None:
        import psycopg
        import redis

        self.server = server
        self.pg = psycopg.connect(database_url, autocommit=True)
        self.redis = redis.Redis.from_url(redis_url)
        self.overhead = {"net in": 0.0, "net out": 0.0}
        self.redis_reset()
        self.overhead = {k: v for k, v in self.redis_read()[1].items() if k.startswith("net")}

    def close(self) -> None:
        self.pg.close()
        self.redis.close()

    def pg_reset(self) -> None:
        self.pg.execute("SELECT pg_stat_statements_reset()")

    def pg_statements(self) -> tuple[int, int]:
        """(statements, COMMITs) sent to this database since the reset."""
        rows = self.pg.execute(
            "SELECT query, calls FROM pg_stat_statements WHERE dbid = (SELECT oid FROM "
            "pg_database WHERE datname = current_database()) AND toplevel "
            "AND query NOT LIKE '%pg_stat_statements%'"
        ).fetchall()
        statements = commits = 0
        for query, calls in rows:
            word = query.lstrip().split(None, 1)[0].upper() if query.strip() else ""
            if word == "COMMIT":
                commits += calls
            elif word not in CONTROL:
                statements += calls
        return statements, commits

    def inserted(self) -> int:
        """Where the next WAL record goes (``pg_current_wal_insert_lsn()``: always between
        two records, where ``pg_current_wal_lsn()``, what is written so far, may cut one)."""
        row = self.pg.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])

    def records(self, start: int, end: int) -> dict[str, int]:
        """Each WAL record type's count from ``start`` to ``end`` (``pg_waldump``), once
        the WAL up to ``end`` is on disk (a segment switch writes it all)."""
        if end <= start:
            return {}
        self.pg.execute("SELECT pg_switch_wal()")
        return key_table.waldump(self.server, start, end)

    def redis_reset(self) -> None:
        self.redis.config_resetstat()

    def redis_read(self) -> tuple[dict[str, int], dict[str, float]]:
        """The commands run since the reset (by name), and the bytes in and out."""
        info = self.redis.info("everything")
        calls = {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in info.items()
            if name.startswith("cmdstat_") and not name.startswith("cmdstat_config")
        }
        net = {
            "net in": info["total_net_input_bytes"] - self.overhead["net in"],
            "net out": info["total_net_output_bytes"] - self.overhead["net out"],
        }
        return calls, net

    def redis_keys(self) -> set[bytes]:
        return set(self.redis.scan_iter(count=1000))

    def memory(self, keys: set[bytes]) -> int:
        return sum(int(self.redis.memory_usage(key, samples=0) or 0) for key in keys)


def count(counters: Counters, run: Callable[[int], None], n: int) -> dict[str, Any]:
    """``run(n)`` after a CHECKPOINT, counted; its figures per key."""
    key_table.sql("CHECKPOINT")
    keys_before = counters.redis_keys()
    before = key_table.counters()
    start = counters.inserted()
    counters.pg_reset()
    counters.redis_reset()
    run(n)
    calls, net = counters.redis_read()
    statements, commits = counters.pg_statements()
    after = key_table.counters()
    end = counters.inserted()
    delta = {name: after[name] - before[name] for name in after}
    records = counters.records(start, end)
    new = counters.redis_keys() - keys_before
    outbox = outbox_rows()
    return {
        "statements": statements / n,
        "COMMIT sent": commits / n,
        "write transactions": records.get("Transaction/COMMIT", 0) / n,
        "key table row versions": (delta["ins"] + delta["upd"]) / n,
        "WAL bytes": delta["lsn"] / n,
        "FPI": delta["fpi"] / n,
        "Redis commands": sum(calls.values()) / n,
        "Redis commands by name": ", ".join(
            f"{calls[name] / n:g} {name.upper()}"
            for name in sorted(calls, key=lambda name: -calls[name])
        ),
        "Redis bytes in": net["net in"] / n,
        "Redis bytes out": net["net out"] / n,
        "Redis keys left": len(new) / n,
        "Redis memory bytes": counters.memory(new) / n,
        "outbox rows": outbox,
    }


def outbox_rows() -> int:
    from django_idempotency.models import IdempotencyOutbox

    return IdempotencyOutbox.objects.count()


def age_loss_marker(redis_client: Any, prefix: str, ttl: float) -> bool:
    """The hybrid strategy's loss check brought to its steady state, as if Redis had lost
    nothing for ``ttl`` seconds (see docs/hybrid.md), so that a new key is not looked up in
    PostgreSQL: what time would do to the keys a start leaves, done now. A loss marker with
    its date (``<run_id> <evicted_keys> <since>``) is dated more than ``ttl`` seconds back; a
    ``suspect`` key (which lives for the records' Redis TTL after a loss) is deleted. False
    when neither is found (the code keeps none, or in another form)."""
    aged = False
    for key in redis_client.scan_iter(match=f"{prefix}*", count=1000):
        name = key.decode()
        if name.endswith("suspect"):
            redis_client.delete(key)
            aged = True
        elif "epoch" in name:
            value = (redis_client.get(key) or b"").decode()
            found = re.match(r"^(\S+ \d+) (\d+)$", value)
            if found:
                since = int(found.group(2)) - int(ttl) - 60
                redis_client.set(key, f"{found.group(1)} {since}", keepttl=True)
                aged = True
    return aged
