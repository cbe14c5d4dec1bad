"""Parsing short human durations such as ``90s``, ``2h``, ``7d`` or ``1h30m`` (the units are
symbols, the same in every language; the error messages are translated)."""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils.translation import gettext as _

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> timedelta:
    """``"90s"`` → 90 seconds; units ``s m h d w``, combinable (``"1d12h"``).

    A bare number is seconds. Raises ``ValueError`` with a readable message for
    anything else, including negative and empty values.
    """
    value = text.strip().lower()
    if not value:
        raise ValueError(_("empty duration; use e.g. 90s, 30m, 2h, 7d or 1w"))
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return timedelta(seconds=float(value))
    position = 0
    seconds = 0.0
    seen: set[str] = set()
    for match in _PART.finditer(value):
        if match.start() != position:
            break
        number, unit = match.groups()
        if unit in seen:
            raise ValueError(
                _("unit %(unit)s given twice in duration %(text)s")
                % {"unit": repr(unit), "text": repr(text)}
            )
        seen.add(unit)
        seconds += float(number) * UNITS[unit]
        position = match.end()
    if position != len(value) or not seen:
        raise ValueError(
            _(
                "invalid duration %(text)s; use a number followed by s, m, h, d or w "
                "(e.g. 90s, 30m, 2h, 7d, 1h30m)"
            )
            % {"text": repr(text)}
        )
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta) -> str:
    """The inverse, roughly: ``timedelta(hours=26)`` → ``"1d2h"``."""
    remaining = int(delta.total_seconds())
    if remaining == 0:
        return "0s"
    parts = []
    for unit in ("w", "d", "h", "m", "s"):
        amount, remaining = divmod(remaining, UNITS[unit])
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts)
