"""``manage.py drain_idempotency_outbox``: move the hybrid strategy's outbox into
IdempotencyKey without Celery (imports no ``celery``).

From cron or a Kubernetes ``Job``, or as a sidecar process::

    python manage.py drain_idempotency_outbox                       # until the outbox is empty
    python manage.py drain_idempotency_outbox --duration 5m         # at most five minutes
    python manage.py drain_idempotency_outbox --loop --interval 10  # until SIGTERM or SIGINT

Each batch is one transaction of ``IdempotencyOutbox.objects.drain`` (``SKIP LOCKED``),
so several drainers (this command, Celery workers) at once, or a run after a crash,
neither lose nor duplicate a row. On SIGTERM or SIGINT the batch under way commits and
the command exits 0. Exit status: 0 done (the outbox was empty, or ``--duration`` ran
out, or a signal stopped the loop), 1 the database failed (with ``--loop``: after
``--max-failures`` passes in a row failed), 2 bad arguments.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, InterfaceError, connections
from django.utils.formats import number_format
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext, pgettext_lazy

from ...conf import conf
from ...models import IdempotencyOutbox
from ..arguments import (
    TranslatedCommand,
    add_database,
    add_progress_every,
    batch_size,
    databases,
    duration,
)
from ..progress import Progress

#: Seconds between two passes of ``--loop``, by default.
DEFAULT_INTERVAL = 10.0
#: Passes of ``--loop`` in a row that may fail before the command exits 1, by default.
DEFAULT_MAX_FAILURES = 5
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class Totals:
    drained: int = 0
    discarded: int = 0
    transactions: int = 0

    @property
    def rows(self) -> int:
        return self.drained + self.discarded


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` instead of killing the process mid-batch (in the
    main thread only: elsewhere Python allows no handler, and nothing is installed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Command(TranslatedCommand):
    help = gettext_noop(  # translated by create_parser(), into the language active then
        "Move the hybrid strategy's outbox rows into IdempotencyKey, in batches of one "
        "transaction each, without Celery: until the outbox is empty, for --duration, or "
        "with --loop until SIGTERM or SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=batch_size,
            default=None,
            help=_("Rows per transaction (default: IDEMPOTENCY['OUTBOX_BATCH_SIZE'])."),
        )
        parser.add_argument(
            "--duration",
            type=duration,
            default=None,
            metavar="DURATION",
            help=_("Stop after this long even if rows remain, e.g. 30s, 5m (default: no limit)."),
        )
        parser.add_argument(
            "--loop",
            action="store_true",
            help=_(
                "Keep draining: after the outbox is empty, wait --interval and drain again, "
                "until SIGTERM or SIGINT (or --duration)."
            ),
        )
        parser.add_argument(
            "--interval",
            type=duration,
            default=timedelta(seconds=DEFAULT_INTERVAL),
            metavar="DURATION",
            help=_("With --loop, the wait between passes (default %(interval)ss).")
            % {"interval": f"{DEFAULT_INTERVAL:g}"},
        )
        parser.add_argument(
            "--max-failures",
            type=int,
            default=DEFAULT_MAX_FAILURES,
            metavar="N",
            help=_(
                "With --loop, exit 1 after N passes in a row failed on the database "
                "(default %(default)s); a failed pass is retried after --interval."
            ),
        )
        add_progress_every(
            parser,
            _(
                "At -v 1 and above, a progress line at most this often "
                "(default %(every)ss; 0: after every batch)."
            ),
        )
        add_database(
            parser,
            _(
                "Database alias of the outbox (default: every key database, "
                "IDEMPOTENCY['KEY_DATABASES'] or IDEMPOTENCY['DATABASE'])."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        aliases = databases(options)
        if options["max_failures"] < 1:
            raise CommandError(
                _("--max-failures: must be 1 or more, not %(value)d")
                % {"value": options["max_failures"]}
            )
        self.aliases = aliases
        self.using = aliases[0]
        self.per_database = {alias: Totals() for alias in aliases}
        self.size = int(options["batch_size"] or conf.OUTBOX_BATCH_SIZE)
        self.verbosity = int(options["verbosity"])
        limit: timedelta | None = options["duration"]
        self.deadline = None if limit is None else time.monotonic() + limit.total_seconds()
        self.stop = threading.Event()
        self.totals = Totals()
        self.progress = Progress(
            self,
            verb=pgettext_lazy("progress", "drained"),
            verbosity=self.verbosity,
            every=options["progress_every"].total_seconds(),
            remaining=lambda: sum(IdempotencyOutbox.objects.pending(using=a) for a in aliases),
        )
        started = time.monotonic()
        with stop_on_signals(self.stop):
            if options["loop"]:
                self.loop(options["interval"].total_seconds(), options["max_failures"])
            else:
                self.drain_pass()
        self.report(time.monotonic() - started)

    def out_of_time(self) -> bool:
        return self.stop.is_set() or (
            self.deadline is not None and time.monotonic() >= self.deadline
        )

    def drain_pass(self) -> None:
        """:meth:`drain_database` on each database in turn."""
        for alias in self.aliases:
            if self.out_of_time():
                return
            self.using = alias
            self.drain_database()

    def drain_database(self) -> None:
        """Batches until one comes back short (the outbox is empty, or the rest is held by
        another drainer), time runs out or a signal arrives."""
        mine = self.per_database[self.using]
        while not self.out_of_time():
            try:
                result = IdempotencyOutbox.objects.drain(self.size, using=self.using)
            except (DatabaseError, InterfaceError) as exc:
                raise CommandError(
                    _(
                        "database %(database)s: %(error)s (after draining %(rows)d rows; "
                        "running the command again continues where it stopped)"
                    )
                    % {"database": repr(self.using), "error": exc, "rows": self.totals.rows}
                ) from exc
            if result.rows:
                for totals in (self.totals, mine):
                    totals.transactions += 1
                    totals.drained += result.drained
                    totals.discarded += result.discarded
                self.progress.update(self.totals.rows)
            if result.rows < self.size:
                return

    def loop(self, interval: float, max_failures: int) -> None:
        failures = 0
        while not self.out_of_time():
            try:
                self.drain_pass()
            except CommandError as exc:
                failures += 1
                self.stderr.write(
                    _("%(error)s [%(failures)d of %(max)d failed passes in a row]")
                    % {"error": exc, "failures": failures, "max": max_failures}
                )
                connections[self.using].close()  # a new connection for the next pass
                if failures >= max_failures:
                    raise
            else:
                failures = 0
            wait = interval
            if self.deadline is not None:
                wait = min(wait, max(self.deadline - time.monotonic(), 0.0))
            self.stop.wait(wait)
        if self.stop.is_set() and self.verbosity >= 1:
            self.stdout.write(_("Stopped by a signal; the batch under way was committed."))

    def report(self, elapsed: float) -> None:
        """One line per database."""
        if self.verbosity < 1:
            return
        for alias, totals in self.per_database.items():
            self.report_database(alias, totals, elapsed)

    def report_database(self, alias: str, totals: Totals, elapsed: float) -> None:
        moved = ngettext(
            "Drained %(count)d idempotency outbox row",
            "Drained %(count)d idempotency outbox rows",
            totals.rows,
        ) % {"count": totals.rows}
        in_transactions = ngettext(
            "in %(count)d transaction", "in %(count)d transactions", totals.transactions
        ) % {"count": totals.transactions}
        values = {
            "drained": moved,
            "database": repr(alias),
            "in_transactions": in_transactions,
            "elapsed": number_format(elapsed, 2),
        }
        if not totals.discarded:
            line = _("%(drained)s from database %(database)s %(in_transactions)s (%(elapsed)ss).")
            self.stdout.write(self.style.SUCCESS(line % values))
            return
        values["expired"] = ngettext(
            "%(count)d of them expired and only deleted",
            "%(count)d of them expired and only deleted",
            totals.discarded,
        ) % {"count": totals.discarded}
        line = _(
            "%(drained)s (%(expired)s) from database %(database)s %(in_transactions)s "
            "(%(elapsed)ss)."
        )
        self.stdout.write(self.style.SUCCESS(line % values))
