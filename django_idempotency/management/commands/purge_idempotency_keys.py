"""``manage.py purge_idempotency_keys``: delete expired keys in short batches.

Run it from cron (or use the Celery task ``django_idempotency.tasks.purge_expired_keys``)::

    python manage.py purge_idempotency_keys                    # every expired key
    python manage.py purge_idempotency_keys --older-than 7d    # keep a week of expired keys
    python manage.py purge_idempotency_keys --dry-run          # count only

Each batch is its own short transaction, so the purge never holds locks on many
rows at once and can be interrupted at any point.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from ...conf import conf
from ...durations import format_duration, parse_duration
from ...models import IdempotencyKey

DEFAULT_BATCH_SIZE = 1000
MAX_BATCH_SIZE = 100_000


def batch_size(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {value!r}") from None
    if not 1 <= size <= MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_BATCH_SIZE}, not {size}")
    return size


def duration(value: str) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


class Command(BaseCommand):
    help = (
        "Delete expired idempotency keys in batches of short transactions. "
        "Expired keys are no longer replayed, so deleting them changes no response."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count the keys that would be deleted, delete nothing.",
        )
        parser.add_argument(
            "--batch-size",
            type=batch_size,
            default=DEFAULT_BATCH_SIZE,
            help=f"Rows deleted per transaction (default {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--older-than",
            type=duration,
            default=None,
            metavar="DURATION",
            help="Only keys that expired at least this long ago, e.g. 90s, 2h, 7d, 1h30m.",
        )
        parser.add_argument(
            "--database",
            default=None,
            help="Database alias holding the keys (default: IDEMPOTENCY['DATABASE']).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using: str = options["database"] or conf.DATABASE
        if using not in connections.settings:
            known = ", ".join(sorted(connections.settings))
            raise CommandError(f"--database: unknown database alias {using!r} (known: {known})")
        older_than: timedelta | None = options["older_than"]
        size: int = options["batch_size"]
        which = "expired idempotency keys" + (
            f" (expired more than {format_duration(older_than)} ago)" if older_than else ""
        )

        if options["dry_run"]:
            try:
                count = IdempotencyKey.objects.expired(older_than=older_than, using=using).count()
            except DatabaseError as exc:
                raise CommandError(f"database {using!r}: {exc}") from exc
            self.stdout.write(f"Would delete {count} {which} from database {using!r}.")
            return

        progress = self.stdout.isatty()
        started = time.monotonic()
        total = batches = 0
        longest = 0.0
        batch_started = time.monotonic()
        try:
            for deleted in IdempotencyKey.objects.iter_delete_expired(
                batch_size=size, older_than=older_than, using=using
            ):
                now = time.monotonic()
                longest = max(longest, now - batch_started)
                total += deleted
                batches += 1
                if progress:
                    rate = total / max(now - started, 1e-9)
                    self.stdout.write(
                        f"\rdeleted {total} rows in {batches} batches ({rate:,.0f} rows/s)",
                        ending="",
                    )
                    self.stdout.flush()
                batch_started = time.monotonic()
        except DatabaseError as exc:
            if progress:
                self.stdout.write("")
            raise CommandError(
                f"database {using!r}: {exc} (after deleting {total} rows; "
                "running the command again continues where it stopped)"
            ) from exc
        if progress and batches:
            self.stdout.write("")
        elapsed = time.monotonic() - started
        self.stdout.write(
            self.style.SUCCESS(
                f"Deleted {total} {which} from database {using!r} in {batches} "
                f"batch{'es' if batches != 1 else ''} of up to {size} "
                f"({elapsed:.2f}s, longest batch {longest * 1000:.0f} ms)."
            )
        )
