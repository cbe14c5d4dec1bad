"""Progress lines of the long-running management commands, as Django's own commands do.

Nothing at ``-v 0``; at ``-v 1`` and above, while a run lasts, at most one line every
``every`` seconds with the rows done, the rate and the time left, in the active language. The
rows left are counted once, when the first line is due, so that a short run costs no ``COUNT``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from django.core.management.base import BaseCommand
from django.db import DatabaseError
from django.utils.formats import number_format
from django.utils.translation import gettext as _

from .durations import format_duration

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

#: Seconds between two progress lines, by default.
DEFAULT_EVERY = 5.0


class Progress:
    """Reports ``done`` rows now and then; ``remaining()`` counts the rows still to do.
    ``verb`` says what happens to the rows, translated (``pgettext_lazy("progress", ...)``)."""

    def __init__(
        self,
        command: BaseCommand,
        *,
        verb: StrOrPromise,
        verbosity: int,
        every: float = DEFAULT_EVERY,
        remaining: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.command = command
        self.verb = verb
        self.verbosity = verbosity
        self.every = every
        self.remaining = remaining
        self.clock = clock
        self.started = self.last = clock()
        self.total: int | None = None
        self.lines = 0

    def update(self, done: int) -> None:
        if self.verbosity < 1:
            return
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        if self.total is None and self.remaining is not None:
            try:
                self.total = done + self.remaining()
            except DatabaseError:  # an estimate only: the run goes on without it
                self.remaining = None
        self.command.stdout.write(self.line(done, now))
        self.command.stdout.flush()
        self.lines += 1

    def line(self, done: int, now: float) -> str:
        """The progress line, in the active language, its numbers grouped as it groups them."""
        rate = done / max(now - self.started, 1e-9)
        values = {"verb": self.verb, "done": _number(done), "rate": _rate(rate)}
        if self.total is None:
            return _("%(verb)s %(done)s rows, %(rate)s rows/s") % values
        values["total"] = _number(max(self.total, done))
        if rate <= 0:
            return _("%(verb)s %(done)s of about %(total)s rows, %(rate)s rows/s") % values
        left = max(self.total - done, 0) / rate
        values["left"] = format_duration(timedelta(seconds=round(left)))
        return (
            _("%(verb)s %(done)s of about %(total)s rows, %(rate)s rows/s, about %(left)s left")
            % values
        )


def _rate(rate: float) -> str:
    """Rows a second, with one decimal below 10 (a small batch over a long run is 0.4
    rows/s, not 0)."""
    if rate < 10:
        return number_format(rate, 1)
    return _number(round(rate))


def _number(value: int) -> str:
    return number_format(value, force_grouping=True)
