"""``manage.py complete_idempotency_keys``: the completer, without Celery (docs/steps.md,
"The completer").

From cron, every minute or so::

    python manage.py complete_idempotency_keys              # every key due now
    python manage.py complete_idempotency_keys --limit 10   # at most ten per database

Finishes the requests of views declared with ``completer=True`` whose client did not come
back (:mod:`django_idempotency.completer`), then prints how many keys had each outcome.
Several runs at once (this command, Celery workers) never run one key twice for one lapse:
each run of a key first takes its claim. Exit status: 0 done, 1 the database failed.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...completer import COMPLETED_RUN, DEAD_LETTERED, FAILED, TAKEN, complete_requests
from ..arguments import TranslatedCommand, add_database, batch_size, databases

DEFAULT_LIMIT = 100


class Command(TranslatedCommand):
    help = gettext_noop(  # translated by create_parser(), into the language active then
        "Finish the requests of views declared with completer=True whose client did not "
        "come back: each is sent to its view again, as its user, and resumes from its "
        "recovery point."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--limit",
            type=batch_size,
            default=DEFAULT_LIMIT,
            help=_("Keys finished at most, per database (default %(default)s)."),
        )
        add_database(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        for using in databases(options):
            try:
                report = complete_requests(using=using, limit=options["limit"])
            except DatabaseError as exc:
                raise CommandError(
                    _("database %(database)s: %(error)s") % {"database": repr(using), "error": exc}
                ) from exc
            if options["verbosity"] >= 1:
                self.stdout.write(
                    _(
                        "Database %(database)s: %(completed)d completed, %(failed)d failed, "
                        "%(dead)d dead-lettered, %(taken)d taken by a retry first."
                    )
                    % {
                        "database": repr(using),
                        "completed": report[COMPLETED_RUN],
                        "failed": report[FAILED],
                        "dead": report[DEAD_LETTERED],
                        "taken": report[TAKEN],
                    }
                )
