"""``manage.py purge_idempotency_keys``: delete expired keys in short batches.

Run it from cron (or use the Celery task ``django_idempotency.tasks.purge_expired_keys``)::

    python manage.py purge_idempotency_keys                    # every expired key
    python manage.py purge_idempotency_keys --older-than 7d    # keep a week of expired keys
    python manage.py purge_idempotency_keys --dry-run          # count only

Each batch is its own short transaction, so the purge never holds locks on many
rows at once and can be interrupted at any point. Like Django's commands: silent at
``-v 0``, a progress line at most every ``--progress-every`` (5s) on a long run at
``-v 1`` and above, and a ``CommandError`` (exit status 1) when the database fails.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError
from django.utils.formats import number_format
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext, pgettext_lazy

from ...conf import conf
from ...models import IdempotencyKey, IdempotencySuspect
from ...store import partitions
from ...store.purge import UNFINISHED
from ..arguments import (
    TranslatedCommand,
    add_database,
    add_progress_every,
    batch_size,
    databases,
    duration,
)
from ..durations import format_duration
from ..progress import Progress

DEFAULT_BATCH_SIZE = 1000


class Command(TranslatedCommand):
    help = gettext_noop(  # translated by create_parser(), into the language active then
        "Delete expired idempotency keys in batches of short transactions. "
        "Expired keys are no longer replayed, so deleting them changes no response."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help=_("Count the keys that would be deleted, delete nothing."),
        )
        parser.add_argument(
            "--batch-size",
            type=batch_size,
            default=DEFAULT_BATCH_SIZE,
            help=_("Rows deleted per transaction (default %(default)s)."),
        )
        parser.add_argument(
            "--older-than",
            type=duration,
            default=None,
            metavar="DURATION",
            help=_("Only keys that expired at least this long ago, e.g. 90s, 2h, 7d, 1h30m."),
        )
        add_progress_every(
            parser,
            _(
                "At -v 1 and above, a progress line (rows deleted, rate, time left) at "
                "most this often (default %(every)ss; 0: after every batch)."
            ),
        )
        add_database(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        for using in databases(options):
            self.purge_database(using, options)

    def purge_database(self, using: str, options: dict[str, Any]) -> None:
        """The command on one database: its dry-run count, or its purge."""
        older_than: timedelta | None = options["older_than"]
        verbosity: int = options["verbosity"]

        if options["dry_run"]:
            try:
                count = to_delete(using, older_than)
            except DatabaseError as exc:
                raise CommandError(
                    _("database %(database)s: %(error)s") % {"database": repr(using), "error": exc}
                ) from exc
            if verbosity >= 1:
                message = ngettext(
                    "Would delete %(count)d expired idempotency key%(which)s from database "
                    "%(database)s.",
                    "Would delete %(count)d expired idempotency keys%(which)s from database "
                    "%(database)s.",
                    count,
                )
                values = {"count": count, "which": which(older_than), "database": repr(using)}
                self.stdout.write(message % values)
            return
        self.purge(using, older_than, options["batch_size"], verbosity, options["progress_every"])

    def purge(
        self,
        using: str,
        older_than: timedelta | None,
        size: int,
        verbosity: int,
        every: timedelta,
    ) -> None:
        progress = Progress(
            self,
            verb=pgettext_lazy("progress", "deleted"),
            verbosity=verbosity,
            every=every.total_seconds(),
            remaining=lambda: to_delete(using, older_than),
        )
        started = batch_started = time.monotonic()
        total = batches = 0
        longest = 0.0
        self.drop_partitions(using, older_than, verbosity)
        try:
            for deleted in IdempotencyKey.objects.iter_delete_expired(
                batch_size=size, older_than=older_than, using=using
            ):
                longest = max(longest, time.monotonic() - batch_started)
                total += deleted
                batches += 1
                progress.update(total)
                batch_started = time.monotonic()
            IdempotencySuspect.objects.delete_expired(using=using)  # rows no process marked
            unfinished = IdempotencyKey.objects.warn_unfinished(older_than=older_than, using=using)
        except DatabaseError as exc:
            raise CommandError(
                _(
                    "database %(database)s: %(error)s (after deleting %(rows)d rows; running "
                    "the command again continues where it stopped)"
                )
                % {"database": repr(using), "error": exc, "rows": total}
            ) from exc
        if verbosity < 1:
            return
        deleted_keys = ngettext(
            "Deleted %(count)d expired idempotency key",
            "Deleted %(count)d expired idempotency keys",
            total,
        ) % {"count": total}
        in_batches = ngettext(
            "in %(count)d batch of up to %(size)d",
            "in %(count)d batches of up to %(size)d",
            batches,
        ) % {"count": batches, "size": size}
        elapsed = time.monotonic() - started
        self.stdout.write(
            self.style.SUCCESS(
                _(
                    "%(deleted)s%(which)s from database %(database)s %(in_batches)s "
                    "(%(elapsed)ss, longest batch %(longest)s ms)."
                )
                % {
                    "deleted": deleted_keys,
                    "which": which(older_than),
                    "database": repr(using),
                    "in_batches": in_batches,
                    "elapsed": number_format(elapsed, 2),
                    "longest": number_format(longest * 1000, 0),
                }
            )
        )
        self.report_unfinished(unfinished)

    def report_unfinished(self, count: int) -> None:
        """The keys the purge kept, in progress with steps, their TTL over (at -v 1)."""
        if not count:
            return
        self.stdout.write(
            self.style.WARNING(
                ngettext(
                    "Kept %(count)d key in progress with steps whose TTL is over: a retry "
                    "or the completer resumes it; see docs/steps.md, 'Keys the purge keeps'.",
                    "Kept %(count)d keys in progress with steps whose TTL is over: a retry "
                    "or the completer resumes them; see docs/steps.md, 'Keys the purge keeps'.",
                    count,
                )
                % {"count": count}
            )
        )

    def drop_partitions(self, using: str, older_than: timedelta | None, verbosity: int) -> None:
        """With PARTITION_INTERVAL, the expired partitions dropped whole and the partitions
        ahead created, before the rows of the current ones are deleted."""
        if conf.PARTITION_INTERVAL is None:
            return
        try:
            done = partitions.maintain(using, older_than=older_than)
        except DatabaseError as exc:
            raise CommandError(
                _("database %(database)s: %(error)s") % {"database": repr(using), "error": exc}
            ) from exc
        if verbosity >= 1 and (done.dropped or done.created or done.deferred):
            self.stdout.write(
                _(
                    "Partitions of database %(database)s: %(dropped)d expired ones dropped, "
                    "%(created)d created ahead, %(deferred)d left for the next run."
                )
                % {
                    "database": repr(using),
                    "dropped": len(done.dropped),
                    "created": len(done.created),
                    "deferred": len(done.deferred),
                }
            )


def to_delete(using: str, older_than: timedelta | None) -> int:
    """How many keys the purge would delete: the expired ones, less those in progress with
    steps, which it keeps (those in progress under a live lease are counted)."""
    expired = IdempotencyKey.objects.expired(older_than=older_than, using=using)
    return expired.exclude(UNFINISHED).count()


def which(older_than: timedelta | None) -> str:
    """The words that say which expired keys, "" for all of them."""
    if not older_than:
        return ""
    return _(" (expired more than %(age)s ago)") % {"age": format_duration(older_than)}
