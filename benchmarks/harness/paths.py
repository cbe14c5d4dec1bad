"""Where the checkout is, and how a measure's child processes find it.

``python -m benchmarks`` runs from the checkout, which puts it first on ``sys.path``; the
processes a measure starts (servers, workers, the measured process itself) get it through
``PYTHONPATH``. This is the only path set-up the benchmarks do.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env(
    extra: Mapping[str, str] | None = None, *, drop: tuple[str, ...] = ()
) -> dict[str, str]:
    """This process's environment without the variables that start with ``drop``, with the
    checkout on ``PYTHONPATH`` and ``extra`` on top."""
    env = {key: value for key, value in os.environ.items() if not (drop and key.startswith(drop))}
    env["PYTHONPATH"] = ROOT
    env.update(extra or {})
    return env


def benchmark_command(measure: str, *args: str) -> list[str]:
    """The command that runs ``measure`` in a process of its own."""
    return [sys.executable, "-m", "benchmarks", measure, *args]
