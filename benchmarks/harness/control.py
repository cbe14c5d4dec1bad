"""The control project (``benchmarks/control``): its environment, its database and Redis.

``control_run()`` makes a scratch PostgreSQL database and a private ``redis-server`` (or uses
``BENCH_REDIS_URL``) and yields the environment of a process that runs the project against
them; both go when it ends. ``setup_django()`` and ``quiet_loss_marker()`` run inside such a
process.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from .paths import child_env
from .postgres import scratch_database
from .redis import redis_for

TOKEN = "bench-token"
BODY = '{"amount": 1000, "currency": "EUR", "description": "order"}'
STRATEGIES = ("db", "advisory_lock", "redis", "hybrid")


@contextmanager
def control_run() -> Iterator[dict[str, str]]:
    """The environment of a process running the control project on a scratch database and
    Redis of its own (both removed afterwards)."""
    prefix = f"idem-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    with scratch_database() as database_url, redis_for(prefix) as redis_url:
        yield child_env(
            {
                "DJANGO_SETTINGS_MODULE": "benchmarks.control.settings",
                "BENCH_DATABASE_URL": database_url,
                "BENCH_REDIS_URL": redis_url,
                "BENCH_REDIS_PREFIX": prefix,
            },
            drop=("DJANGO_", "IDEMPOTENCY_", "CELERY_"),
        )


def setup_django() -> None:
    """In the project's process: migrate its database and give the benchmark user its token."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    user, _ = User.objects.get_or_create(username="bench")
    Token.objects.get_or_create(user=user, key=TOKEN)


def quiet_loss_marker() -> None:
    """Write the hybrid strategy's Redis loss marker as a server that has lost nothing for two
    days would hold it (the steady state; with no marker, as on the first day of a
    deployment, every new key is looked up in the database for one TTL)."""
    from django_idempotency.strategies.redis.store import get_store

    store = get_store()
    info = store.client.info("server") | store.client.info("stats")
    marker, _checked, suspect = store.loss_keys()
    store.client.set(marker, f"{info['run_id']} {info['evicted_keys']}")
    store.client.delete(suspect)
