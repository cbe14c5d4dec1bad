"""New keys per second through each strategy against the same work written on the raw drivers.

Each loop claims and completes ``n`` fresh keys on one thread. The raw loops:

* db: ``python -m benchmarks claim``'s raw psycopg loop (the manager's claim statement in
  autocommit, then its completion UPDATE in a transaction);
* advisory_lock: that measure's minimal raw loop (try-lock, read, one upsert);
* redis: ``SET key NX PX``, then ``SET key PX`` of the completed record (redis-py);
* hybrid: the two-tier work by hand: ``SET NX PX`` in Redis; ``BEGIN``, one INSERT of the
  completed response into the outbox table, ``COMMIT`` (psycopg); ``SET PX`` in Redis.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.measures.claim.advisory import raw_advisory_minimal
from benchmarks.measures.claim.loops import raw_db_postgres

from .counts import BODY, FINGERPRINT, HEADERS, SCOPE, TTL, new_keys

Loop = Callable[[int], None]

IN_PROGRESS = b'{"s":"in_progress","f":"' + FINGERPRINT.encode() + b'","t":"' + b"t" * 32 + b'"}'
OUTBOX_INSERT = """
    INSERT INTO django_idempotency_idempotencyoutbox (scope, key, fingerprint,
        request_method, request_path, response_status, response_headers, response_body,
        created_at, expires_at)
    VALUES (%s, %s, %s, 'POST', '/api/charges/', 201, %s, %s, statement_timestamp(),
        statement_timestamp() + make_interval(secs => %s))
"""


def prefixed(loop: Callable[[int, str], None]) -> Loop:
    """A ``claim`` measure's loop (``n``, key prefix) with a fresh prefix each run."""
    return lambda n: loop(n, uuid.uuid4().hex)


def raw_redis(url: str) -> Loop:
    import redis

    client = redis.Redis.from_url(url)
    record = IN_PROGRESS + BODY

    def run(n: int) -> None:
        for _ in range(n):
            key = f"raw:{uuid.uuid4()}"
            if not client.set(key, IN_PROGRESS, nx=True, px=60_000):
                raise RuntimeError("fresh key not claimed")
            client.set(key, record, px=int(TTL * 1000))

    return run


def raw_hybrid(url: str, database_url: str) -> Loop:
    import psycopg
    import redis
    from psycopg.types.json import Jsonb

    client = redis.Redis.from_url(url)
    conn = psycopg.connect(database_url, autocommit=True)
    headers, record = Jsonb(dict(HEADERS)), IN_PROGRESS + BODY

    def run(n: int) -> None:
        for _ in range(n):
            key = str(uuid.uuid4())
            if not client.set(f"raw:{key}", IN_PROGRESS, nx=True, px=60_000):
                raise RuntimeError("fresh key not claimed")
            with conn.transaction():
                conn.execute(OUTBOX_INSERT, (SCOPE, key, FINGERPRINT, headers, BODY, TTL))
            client.set(f"raw:{key}", record, px=int(TTL * 1000))

    return run


def loops(strategies: dict[str, Any], redis_url: str, database_url: str) -> dict[str, Loop]:
    """For each strategy measured: ``"<name>"`` through the library, ``"<name> raw"`` by
    hand."""
    raw: dict[str, Callable[[], Loop]] = {
        "db": lambda: prefixed(raw_db_postgres(database_url, "default")),
        "advisory_lock": lambda: prefixed(raw_advisory_minimal(database_url)),
        "redis": lambda: raw_redis(redis_url),
        "hybrid": lambda: raw_hybrid(redis_url, database_url),
    }
    found: dict[str, Loop] = {}
    for name, strategy in strategies.items():
        found[name] = new_keys(strategy)
        found[f"{name} raw"] = raw[name]()
    return found


def timed(loop: Loop, n: int) -> tuple[float, float]:
    """Keys per second and client CPU µs per key of ``loop(n)``."""
    cpu, wall = time.process_time(), time.perf_counter()
    loop(n)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / wall, cpu / n * 1e6
