"""Set-up shared by the benchmarks that drive the control project (benchmarks/control)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent
ROOT = BENCHMARKS.parent
ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
TOKEN = "bench-token"
BODY = '{"amount": 1000, "currency": "EUR", "description": "order"}'
STRATEGIES = ("db", "advisory_lock", "redis", "hybrid")


def control_env(database_url: str, prefix: str, **extra: str) -> dict[str, str]:
    """The environment of a process that runs the control project."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="control.settings",
        BENCH_DATABASE_URL=database_url,
        BENCH_REDIS_URL=REDIS_URL,
        BENCH_REDIS_PREFIX=prefix,
        PYTHONPATH=os.pathsep.join([str(BENCHMARKS), str(ROOT)]),
        **extra,
    )
    return env


@contextmanager
def control_database() -> Iterator[str]:
    """A scratch PostgreSQL database; dropped (and this run's Redis keys removed) afterwards."""
    sys.path[:0] = [str(BENCHMARKS), str(ROOT)]
    from tests.support.databases import pg_admin, with_database

    name = f"idem_bench_{uuid.uuid4().hex[:12]}"
    pg_admin(f'CREATE DATABASE "{name}"', ADMIN_URL)
    try:
        yield with_database(ADMIN_URL, name)
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', ADMIN_URL)


def clean_redis(prefix: str) -> None:
    """Remove the keys under ``prefix`` and the drain tasks queued (no worker runs)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)
    client.delete("celery")
    for key in client.scan_iter(match="_kombu.binding*", count=1000):
        client.delete(key)


def setup_django() -> None:
    """Migrate the database named by the environment and give the benchmark user a token."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    user, _ = User.objects.get_or_create(username="bench")
    Token.objects.get_or_create(user=user, key=TOKEN)


def quiet_loss_marker() -> None:
    """Write the hybrid strategy's Redis loss marker as a server that has lost nothing
    for two days would hold it (the steady state; with no marker, as on the first day of
    a deployment, every new key is looked up in the database for one TTL)."""
    import time

    from django_idempotency.strategies.hybrid import EPOCH_SUFFIX
    from django_idempotency.strategies.redis.store import get_store

    store = get_store()
    info = store.client.info("server") | store.client.info("stats")
    since = int(time.time()) - 2 * 86400
    store.client.set(
        store.prefix + EPOCH_SUFFIX, f"{info['run_id']} {info['evicted_keys']} {since}"
    )
