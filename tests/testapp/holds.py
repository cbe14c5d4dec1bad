"""Views held until the test lets them go: a body with ``"hold": name`` makes the test
views wait for ``release(name)`` before they answer, so that a duplicate is sent while the
first request surely runs, however slow the machine (instead of a view that sleeps)."""

from __future__ import annotations

import threading

_events: dict[str, threading.Event] = {}
_arrived: dict[str, int] = {}
_lock = threading.Lock()

#: How long a held view waits at most: a test that never releases it fails, not hangs.
LIMIT = 120.0


def _event(name: str) -> threading.Event:
    with _lock:
        return _events.setdefault(name, threading.Event())


def wait(name: str) -> None:
    """Block until ``release(name)``."""
    with _lock:
        _arrived[name] = _arrived.get(name, 0) + 1
    if not _event(name).wait(LIMIT):
        raise RuntimeError(f"the test never released {name!r}")


def release(name: str) -> None:
    _event(name).set()


def released(name: str) -> bool:
    return _event(name).is_set()


def arrived(name: str) -> int:
    """How many views have come to ``name`` (waiting there, or released since)."""
    with _lock:
        return _arrived.get(name, 0)
