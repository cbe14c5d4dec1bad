"""A process whose clock is off: Debian's libfaketime preloaded into a subprocess.

The app server's clock is the input under test and the database's stays real: the
subprocess (a ``manage.py`` command, or a small script) runs with ``LD_PRELOAD`` of
``libfaketime.so.1`` and ``FAKETIME`` set to an offset such as ``"-90s"``, so that every
call of its own to the system clock (``timezone.now()``, ``time.time()``) is that far off,
while the servers it talks to keep their clocks. ``make faketime`` installs the package
(``make test`` depends on it); the ``faketime`` marker skips a test without it, or fails
it with CI set.
"""

from __future__ import annotations

import glob

#: Where Debian's package puts the library, per architecture.
PATTERN = "/usr/lib/*/faketime/libfaketime.so.1"


def faketime_library() -> str | None:
    """The path of ``libfaketime.so.1``, None when the package is missing."""
    found = sorted(glob.glob(PATTERN))
    return found[0] if found else None


def skewed(offset: str) -> dict[str, str]:
    """The environment of a process whose wall clock runs ``offset`` (``"-90s"``, ``"+2m"``)
    off the real one. Its monotonic clock is shifted too, which changes no interval; with
    ``FAKETIME_DONT_FAKE_MONOTONIC`` Python's ``time.sleep`` (an absolute
    ``clock_nanosleep`` on the monotonic clock, which libfaketime shifts) fails with
    ``EINVAL``."""
    library = faketime_library()
    if library is None:
        raise RuntimeError("libfaketime is missing: make faketime (Debian's faketime package)")
    return {"LD_PRELOAD": library, "FAKETIME": offset}
