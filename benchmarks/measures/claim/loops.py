"""The loops the claim measure times: the library's (strategy, manager) and raw driver loops
sending the same SQL. Each ``Loop(n, prefix)`` claims and completes ``n`` fresh keys."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

SCOPE = "user:1"
FINGERPRINT = "f" * 64
TTL = 86400.0
LOCK_TIMEOUT = 60.0
METHOD = "POST"
PATH = "/api/charges/"
HEADERS = {"Content-Type": "application/json"}
BODY = b'{"id":1,"amount":1000,"currency":"EUR","psp_reference":"psp_0123456789abcdef01234567"}'

Loop = Callable[[int, str], None]


def table() -> str:
    from django_idempotency.models import IdempotencyKey

    return IdempotencyKey._meta.db_table


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


def statements(alias: str) -> Any:
    """The manager's statements for ``alias`` (the raw loops send the same SQL text)."""
    from django.db import connections

    from django_idempotency.store.sql.statements import statements as compiled

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


def claim_values(response_headers: Any) -> dict[str, Any]:
    """The claim statement's values but the key and the token."""
    return {
        "scope": SCOPE,
        "fingerprint": FINGERPRINT,
        "status": "in_progress",
        "request_method": METHOD,
        "request_path": PATH,
        "response_headers": response_headers,
        "ttl": TTL,
    }


def complete_values(response_headers: Any) -> dict[str, Any]:
    """The completion statement's values but the row and the token."""
    from django_idempotency.store.records import kept_ttl

    return {
        "response_status": 201,
        "response_headers": response_headers,
        "response_body": BODY,
        "ttl": TTL,
        "kept_ttl": kept_ttl(TTL),
    }


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
    claiming, completing = claim_values(Jsonb({})), complete_values(Jsonb(dict(HEADERS)))

    def run(n: int, prefix: str) -> None:
        cur = conn.cursor()
        for i in range(n):
            token = uuid.uuid4()
            claiming["key"] = f"{prefix}-{i}"
            claiming["claim_token"] = token
            cur.execute(claim_sql, claim_params(claiming))
            row = cur.fetchone()
            if row is None:
                raise RuntimeError("fresh key not claimed")
            with conn.transaction():
                completing["pk"] = row[0]
                completing["token"] = token
                cur.execute(complete_sql, complete_params(completing))
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
    claiming, completing = claim_values("{}"), complete_values(json.dumps(HEADERS))

    def run(n: int, prefix: str) -> None:
        cur = conn.cursor()
        for i in range(n):
            token = uuid.uuid4().hex
            claiming["key"] = f"{prefix}-{i}"
            claiming["claim_token"] = token
            cur.execute(claim_sql, claim_params(claiming))
            row = cur.fetchone()
            if row is None:
                raise RuntimeError("fresh key not claimed")
            cur.execute("BEGIN")
            completing["pk"] = row[0]
            completing["token"] = token
            cur.execute(complete_sql, complete_params(completing))
            if cur.rowcount != 1:
                raise RuntimeError("completion lost")
            cur.execute("COMMIT")

    return run
