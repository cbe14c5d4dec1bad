"""Celery tasks: drain the hybrid strategy's outbox, purge expired keys (imports ``celery``).

Nothing in the core imports this module; the ``hybrid`` strategy loads it lazily
to queue a drain after a commit, and does without it when Celery is missing.

Both tasks have stable names, so a beat schedule or another service can name them
without importing this module::

    django_idempotency.drain_outbox        move outbox rows into IdempotencyKey
    django_idempotency.purge_expired_keys  delete expired IdempotencyKey rows

Merge :func:`beat_schedule` into the project's schedule (Django settings with the
``CELERY`` namespace)::

    from django_idempotency.tasks import beat_schedule

    CELERY_BEAT_SCHEDULE = {**beat_schedule(), **your_own_entries}

The drain is also queued after every hybrid commit (at most once per
``DRAIN_DELAY`` seconds per process); the beat entry is the backstop for a
message lost while the broker was down.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any

from celery import current_app, shared_task

from .conf import conf
from .store.databases import key_databases

logger = logging.getLogger("django_idempotency")

DRAIN_TASK = "django_idempotency.drain_outbox"
PURGE_TASK = "django_idempotency.purge_expired_keys"
#: The completer's task (defined in ``completer_tasks``, which sits above this module).
COMPLETE_TASK = "django_idempotency.complete_requests"

#: Seconds one ``drain_outbox`` run may spend before it hands the rest to a new task.
DRAIN_TIME_BUDGET = 30.0


def beat_schedule(
    *,
    drain_every: float = 10.0,
    purge_every: float = 3600.0,
    purge_older_than: float = 0.0,
    complete_every: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Entries for ``CELERY_BEAT_SCHEDULE`` (``beat_schedule`` in Celery's own naming).

    * ``django-idempotency-drain-outbox``: every ``drain_every`` seconds (default 10),
      so that rows whose after-commit message was lost are drained anyway;
    * ``django-idempotency-purge-expired-keys``: every ``purge_every`` seconds (default
      an hour), deleting keys that expired more than ``purge_older_than`` seconds ago
      (with ``PARTITION_INTERVAL``: dropping the expired partitions and creating those
      ahead, which must run more often than the partitions ahead last: a day past TTL).

    * ``django-idempotency-complete-requests``, with ``complete_every``: the completer
      (``django_idempotency.completer_tasks``, which the worker must import: add it to
      Celery's ``include``), every ``complete_every`` seconds.

    The tasks ignore their results; no result backend is needed.
    """
    schedule = {
        "django-idempotency-drain-outbox": {
            "task": DRAIN_TASK,
            "schedule": float(drain_every),
            "options": {"expires": float(drain_every)},
        },
        "django-idempotency-purge-expired-keys": {
            "task": PURGE_TASK,
            "schedule": float(purge_every),
            "kwargs": {"older_than": float(purge_older_than)},
            "options": {"expires": float(purge_every)},
        },
    }
    if complete_every is not None:
        schedule["django-idempotency-complete-requests"] = {
            "task": COMPLETE_TASK,
            "schedule": float(complete_every),
            "options": {"expires": float(complete_every)},
        }
    return schedule


@shared_task(name=DRAIN_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
def drain_outbox(
    batch_size: int | None = None,
    time_budget: float | None = None,
    using: str | None = None,
    hold_partial: float = 0.0,
    follow_up: bool = False,
) -> dict[str, int]:
    """Drain the outbox in transactions of ``batch_size`` rows (``OUTBOX_BATCH_SIZE``), on
    the database ``using``, or on every key database (``KEY_DATABASES``) in turn, each
    as one run of this task (the counts are their sums).

    Stops when a batch comes back short (the outbox is empty, or the rest is held by
    another drainer) or after ``time_budget`` seconds; in the second case it queues
    itself again, so that a long backlog never holds one worker for long. Safe to run
    on several workers at once and to re-run after a crash.

    ``hold_partial`` (seconds; the hybrid strategy's after-commit drains): a short
    last batch whose oldest row is younger than this is left for later, so that under
    load each transaction carries a full batch. With ``follow_up``, a run that left
    rows queues one more run in ``hold_partial`` seconds, which takes them (they are
    old enough by then) and queues nothing further. The beat entry drains everything.
    """
    conf.ensure_valid()
    totals = {"drained": 0, "discarded": 0, "transactions": 0, "held": 0}
    for alias in key_databases(using):
        counts = _drain(alias, batch_size, time_budget, hold_partial, follow_up)
        for name, count in counts.items():
            totals[name] += count
    return totals


def _drain(
    alias: str,
    batch_size: int | None,
    time_budget: float | None,
    hold_partial: float,
    follow_up: bool,
) -> dict[str, int]:
    """:func:`drain_outbox` on one database."""
    from .models import IdempotencyOutbox

    size = int(batch_size or conf.OUTBOX_BATCH_SIZE)
    budget = DRAIN_TIME_BUDGET if time_budget is None else float(time_budget)
    hold = timedelta(seconds=float(hold_partial)) if hold_partial else None
    started = time.monotonic()
    drained = discarded = transactions = held = 0
    more = False
    while True:
        result = IdempotencyOutbox.objects.drain(size, using=alias, hold_partial=hold)
        held = result.held
        if result.rows == 0:
            break
        transactions += 1
        drained += result.drained
        discarded += result.discarded
        if result.rows < size:
            break
        if time.monotonic() - started >= budget:
            more = True
            break
    if transactions:
        logger.info(
            "drained %d outbox rows (%d expired) in %d transactions on %r",
            drained,
            discarded,
            transactions,
            alias,
            extra={
                "idempotency_drained": drained,
                "idempotency_discarded": discarded,
                "idempotency_transactions": transactions,
            },
        )
    kwargs: dict[str, Any] = {"batch_size": size, "using": alias, "hold_partial": hold_partial}
    if more:
        drain_outbox.apply_async(kwargs={**kwargs, "time_budget": budget, "follow_up": follow_up})
    elif held and follow_up:
        drain_outbox.apply_async(kwargs=kwargs, countdown=float(hold_partial))
    return {
        "drained": drained,
        "discarded": discarded,
        "transactions": transactions,
        "held": held,
    }


@shared_task(name=PURGE_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
def purge_expired_keys(
    batch_size: int = 1000, older_than: float = 0.0, using: str | None = None
) -> int:
    """Delete expired IdempotencyKey rows in batches, on the database ``using`` or on every
    key database (``KEY_DATABASES``) in turn; returns how many. With
    ``PARTITION_INTERVAL``, first drop the expired partitions whole and create the
    partitions ahead (their rows are not counted)."""
    from .models import IdempotencyKey, IdempotencySuspect
    from .store import partitions

    conf.ensure_valid()
    older = timedelta(seconds=float(older_than)) if older_than else None
    total = 0
    for alias in key_databases(using):
        if conf.PARTITION_INTERVAL is not None:
            partitions.maintain(alias, older_than=older)
        deleted = IdempotencyKey.objects.delete_expired(
            batch_size=int(batch_size), older_than=older, using=alias
        )
        if deleted:
            logger.info("purged %d expired idempotency keys on %r", deleted, alias)
        total += deleted
        IdempotencySuspect.objects.delete_expired(using=alias)  # rows no process marked
        IdempotencyKey.objects.warn_unfinished(older_than=older, using=alias)
    return total


# -- queueing a drain after a commit ----------------------------------------------------------


def celery_configured() -> bool:
    """Whether the current Celery app names a broker (a project's app is configured;
    Celery's fallback app, with no broker set anywhere, is not)."""
    app = current_app._get_current_object()
    return bool(
        app.conf.broker_url or app.conf.broker_write_url or os.environ.get("CELERY_BROKER_URL")
    )


#: After a failed send, no drain is queued from this process for this many seconds.
BROKER_BACKOFF = 30.0

_send_lock = threading.Lock()
_sending = False
_broker_down_until = 0.0


def send_drain(countdown: float, hold_partial: float = 0.0) -> None:
    """Queue ``drain_outbox`` in ``countdown`` seconds, from a daemon thread
    (``hold_partial``: see :func:`drain_outbox`).

    The request that triggered it never waits for the broker: a broker that is down
    or slow costs a warning in the log, and the beat entry drains the rows later. One
    send at a time per process (rows committed meanwhile are drained by its run, a later
    one or the beat entry), and none for ``BROKER_BACKOFF`` seconds after a failure, so
    that an outage does not pile up threads waiting on the broker.
    """
    global _sending
    with _send_lock:
        if _sending or time.monotonic() < _broker_down_until:
            return
        _sending = True

    def send() -> None:
        global _sending, _broker_down_until
        try:
            drain_outbox.apply_async(
                kwargs={"hold_partial": float(hold_partial), "follow_up": bool(hold_partial)},
                countdown=countdown,
                retry=False,
            )
        except Exception:
            with _send_lock:
                _broker_down_until = time.monotonic() + BROKER_BACKOFF
            logger.warning(
                "could not queue %s; the beat schedule will drain the outbox",
                DRAIN_TASK,
                exc_info=True,
            )
        finally:
            with _send_lock:
                _sending = False

    threading.Thread(target=send, name="django-idempotency-queue-drain", daemon=True).start()
