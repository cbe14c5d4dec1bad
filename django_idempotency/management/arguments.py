"""The command-line arguments the library's management commands share: their types
(``--batch-size``, durations such as ``90s`` or ``1h30m``), the ``--database`` and
``--progress-every`` options, each command with its own help text, and the base class that
translates a command's ``help``."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils.translation import gettext as _

from ..store.databases import key_databases
from .durations import parse_duration
from .progress import DEFAULT_EVERY

MAX_BATCH_SIZE = 100_000


class TranslatedCommand(BaseCommand):
    """A command whose ``help`` (marked with ``gettext_noop``) is translated when its parser
    is made, into the language active then."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        self.help = _(type(self).help)
        return super().create_parser(prog_name, subcommand, **kwargs)


def batch_size(value: str) -> int:
    """``--batch-size``: a whole number from 1 to ``MAX_BATCH_SIZE``."""
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            _("must be a whole number, not %(value)s") % {"value": repr(value)}
        ) from None
    if not 1 <= size <= MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(
            _("must be between 1 and %(max)d, not %(size)d") % {"max": MAX_BATCH_SIZE, "size": size}
        )
    return size


def duration(value: str) -> timedelta:
    """A duration argument (``90s``, ``2h``, ``7d``, ``1h30m``)."""
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_progress_every(parser: CommandParser, help_text: str) -> None:
    """``--progress-every DURATION``; ``help_text`` may name the default as ``%(every)s``."""
    parser.add_argument(
        "--progress-every",
        type=duration,
        default=timedelta(seconds=DEFAULT_EVERY),
        metavar="DURATION",
        help=help_text % {"every": f"{DEFAULT_EVERY:g}"},
    )


def add_database(parser: CommandParser, help_text: str | None = None) -> None:
    """``--database ALIAS``: one database; by default every key database
    (``IDEMPOTENCY["KEY_DATABASES"]``, which is ``DATABASE`` alone unless the data is
    sharded). ``help_text`` defaults to the keys' (a command on the keys' table)."""
    if help_text is None:
        help_text = _(
            "Database alias holding the keys (default: every key database, "
            "IDEMPOTENCY['KEY_DATABASES'] or IDEMPOTENCY['DATABASE'])."
        )
    parser.add_argument("--database", default=None, help=help_text)


def databases(options: dict[str, Any]) -> list[str]:
    """The alias ``--database`` names, or every key database; ``CommandError`` unless
    each is an alias of ``DATABASES``."""
    aliases = key_databases(options["database"])
    for using in aliases:
        if using not in connections.settings:
            known = ", ".join(sorted(connections.settings))
            raise CommandError(
                _("--database: unknown database alias %(alias)s (known: %(known)s)")
                % {"alias": repr(using), "known": known}
            )
    return aliases
