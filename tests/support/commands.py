"""This run's ``manage.py`` commands in a subprocess, as cron, a Kubernetes job or a sidecar
runs them: the test settings, the run's test database (``TEST_DATABASE_NAME``, or another
name to make the database fail), the exit status and the output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def command_env(database_name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TEST_CEL"))}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        TEST_DATABASE_NAME=database_name,
        PYTHONPATH=str(ROOT),
    )
    return env


def start_command(database_name: str, *args: str) -> subprocess.Popen[str]:
    """``python -m django <args>`` in a session of its own (a signal reaches it alone)."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        env=command_env(database_name),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_command(
    database_name: str,
    *args: str,
    timeout: float = 120,
    code: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m django <args>``, or with ``code``, ``python -c <code> <args>``; ``env``
    adds to its environment (``faketime.skewed()``: a clock that is off)."""
    program = ["-c", code] if code is not None else ["-m", "django"]
    return subprocess.run(
        [sys.executable, *program, *args],
        env={**command_env(database_name), **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
