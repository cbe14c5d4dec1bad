"""The raw loops the ``advisory_lock`` case is measured against: a replay of the very
statements the strategy sends, and the minimal statements the protocol needs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from .loops import BODY, FINGERPRINT, HEADERS, LOCK_TIMEOUT, METHOD, PATH, SCOPE, TTL, Loop, table


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
    """One transaction replaying the recorded statements with a fresh key, token and times;
    and how many statements that is."""
    import psycopg

    from django_idempotency.store.sql.partitioned import lock_name

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


def minimal_statements() -> tuple[str, str, str]:
    """Take the (free) lock; read the key; one INSERT … ON CONFLICT DO UPDATE."""
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
    return "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", read_sql, write_sql


def raw_advisory_minimal(conninfo: str) -> Loop:
    """What the protocol needs, in one transaction: try-lock, read, one upsert."""
    import psycopg
    from psycopg.types.json import Jsonb

    from django_idempotency.store.sql.partitioned import lock_name

    try_lock_sql, read_sql, write_sql = minimal_statements()
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
                row = (SCOPE, key, FINGERPRINT, "completed", uuid.uuid4(), None, METHOD, PATH,
                       201, Jsonb(dict(HEADERS)), BODY, now, now, now + ttl)  # fmt: skip
                cur.execute(write_sql, row)

    return run
