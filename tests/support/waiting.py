"""Polling until something holds."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01
) -> None:
    """Until ``condition()`` holds, asked every ``interval`` seconds; ``timeout`` only
    tells a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)
