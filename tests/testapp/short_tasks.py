"""A task whose result lives a minute, shorter than a Redis broker's default visibility
timeout (an hour): a worker that imports it must not start (tests/test_idempotent_tasks.py).
Imported by that worker alone (``--include``), never by the test process."""

from __future__ import annotations

from django_idempotency.idempotent_tasks import idempotent_task


@idempotent_task(name="tests.short_ttl", ttl=60)
def short_ttl() -> int:
    return 1
