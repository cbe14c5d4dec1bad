"""Progress lines of the long-running management commands, as Django's own commands do.

Nothing at ``-v 0``; at ``-v 1`` and above, while a run lasts, at most one line every
``every`` seconds with the rows done, the rate and the time left. The rows left are
counted once, when the first line is due, so that a short run costs no ``COUNT``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from django.core.management.base import BaseCommand
from django.db import DatabaseError

from .durations import format_duration

#: Seconds between two progress lines, by default.
DEFAULT_EVERY = 5.0


class Progress:
    """Reports ``done`` rows now and then; ``remaining()`` counts the rows still to do."""

    def __init__(
        self,
        command: BaseCommand,
        *,
        verb: str,
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
        elapsed = max(now - self.started, 1e-9)
        rate = done / elapsed
        line = f"{self.verb} {done:,}"
        if self.total is not None:
            line += f" of about {max(self.total, done):,}"
        line += f" rows, {rate:,.0f} rows/s"
        if self.total is not None and rate > 0:
            left = max(self.total - done, 0) / rate
            line += f", about {format_duration(timedelta(seconds=round(left)))} left"
        self.command.stdout.write(line)
        self.command.stdout.flush()
        self.lines += 1
