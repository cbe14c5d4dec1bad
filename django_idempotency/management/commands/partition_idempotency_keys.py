"""``manage.py partition_idempotency_keys``: the key table partitioned by expiry, and back.

With ``IDEMPOTENCY["PARTITION_INTERVAL"]`` set (PostgreSQL)::

    python manage.py partition_idempotency_keys           # convert; then create ahead
    python manage.py partition_idempotency_keys --undo    # a plain table again

The conversion is one transaction that locks the table while the unexpired keys are
copied (run it when the traffic is low); running it again creates the partitions ahead and
drops the expired ones, as ``purge_idempotency_keys`` does. See docs/operations.md
("Time partitions").
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, connections
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...conf import conf
from ...store import partitions
from ..arguments import TranslatedCommand, add_database, databases, duration


class Command(TranslatedCommand):
    help = gettext_noop(  # translated by create_parser(), into the language active then
        "Partition the idempotency key table by expiry (IDEMPOTENCY['PARTITION_INTERVAL'], "
        "PostgreSQL), or make it a plain table again with --undo."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--undo",
            action="store_true",
            help=_("Make the partitioned table a plain table again, every row kept."),
        )
        parser.add_argument(
            "--ahead",
            type=duration,
            default=None,
            metavar="DURATION",
            help=_(
                "Partitions created past the longest TTL (default: IDEMPOTENCY['PARTITION_AHEAD'])."
            ),
        )
        add_database(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        for using in databases(options):
            try:
                message = self._undo(using) if options["undo"] else self._convert(using, options)
            except DatabaseError as exc:
                raise CommandError(
                    _("database %(database)s: %(error)s") % {"database": repr(using), "error": exc}
                ) from exc
            if options["verbosity"] >= 1:
                self.stdout.write(self.style.SUCCESS(message))

    def _convert(self, using: str, options: dict[str, Any]) -> str:
        if conf.PARTITION_INTERVAL is None:
            raise CommandError(
                _("Set IDEMPOTENCY['PARTITION_INTERVAL'] (seconds) to partition the table.")
            )
        ahead = options["ahead"].total_seconds() if options["ahead"] else None
        converted = partitions.convert(using, ahead=ahead)
        done = partitions.maintain(using, ahead=ahead)
        values = {
            "database": repr(using),
            "count": len(partitions.partitions(connections[using])),
            "created": len(done.created),
            "dropped": len(done.dropped),
        }
        if converted:
            return (
                _(
                    "Partitioned the idempotency key table of database %(database)s "
                    "(%(count)d partitions)."
                )
                % values
            )
        return (
            _(
                "The idempotency key table of database %(database)s is partitioned: "
                "%(created)d partitions created ahead, %(dropped)d expired ones dropped."
            )
            % values
        )

    def _undo(self, using: str) -> str:
        if partitions.undo(using):
            return _(
                "Made the idempotency key table of database %(database)s a plain table again."
            ) % {"database": repr(using)}
        return _("The idempotency key table of database %(database)s is not partitioned.") % {
            "database": repr(using)
        }
