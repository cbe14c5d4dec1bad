"""The example payments API (``example_project``) for the measures that drive it: a scratch
database migrated and seeded, the API under gunicorn, a Celery worker draining its outbox.

Its requests authenticate as the demo user ``alice`` (``TOKEN``).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from .paths import ROOT, child_env
from .postgres import scratch_database
from .processes import stop_group
from .web import Server, gunicorn_command, serve

TOKEN = "alice-token"


def example_env(database_url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process of the example project (none of this process's own
    settings variables), its ``/baseline/`` routes on."""
    settings = {
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": database_url,
        "EXAMPLE_BASELINE_ROUTES": "1",
        **(extra or {}),
    }
    return child_env(settings, drop=("DJANGO_", "IDEMPOTENCY_", "REDIS_", "CELERY_", "PSP_"))


def manage(database_url: str, *args: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args],
        env=example_env(database_url),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=True,
    )


@contextmanager
def example_database(kind: str = "postgres") -> Iterator[str]:
    """A scratch database (``"postgres"`` or ``"sqlite"``) migrated and seeded with the demo
    users; its URL; removed afterwards."""
    with scratch_database() if kind == "postgres" else _sqlite_url() as url:
        manage(url, "migrate", "--noinput", "-v", "0")
        manage(url, "seed_demo")
        yield url


@contextmanager
def _sqlite_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="idem-bench-") as tmp:
        yield f"sqlite:///{tmp}/db.sqlite3"


@contextmanager
def example_server(
    database_url: str,
    strategy: str,
    *,
    workers: int,
    threads: int,
    psp_delay_ms: int = 0,
    env: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """The example API under gunicorn with ``strategy`` (and ``env`` on top)."""
    command = gunicorn_command(
        "example_project.wsgi", workers, threads,
        "--timeout", "60", "--graceful-timeout", "5", "--no-control-socket",
    )  # fmt: skip
    settings = {"IDEMPOTENCY_STRATEGY": strategy, "PSP_DELAY_MS": str(psp_delay_ms), **(env or {})}
    with serve(
        command, example_env(database_url, settings), ready_path="/api/charges/", token=TOKEN
    ) as server:
        yield server


@contextmanager
def celery_worker(database_url: str, env: Mapping[str, str]) -> Iterator[Path]:
    """One ``celery -A example_project.celery worker`` (solo pool, INFO log); its log file."""
    log_path = Path(tempfile.mkstemp(prefix="idem-bench-celery-", suffix=".log")[1])
    command = [
        sys.executable, "-m", "celery", "-A", "example_project.celery", "worker",
        "--pool", "solo", "--loglevel", "INFO", "--hostname", f"bench-{log_path.stem}@%h",
        "--without-mingle", "--without-gossip", "--without-heartbeat",
    ]  # fmt: skip
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            env=example_env(database_url, env),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_started(process, log_path)
            yield log_path
        finally:
            stop_group(process)
            log_path.unlink(missing_ok=True)


def _wait_started(process: subprocess.Popen[bytes], log_path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while " ready." not in log_path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("celery worker did not start:\n" + log_path.read_text())
        time.sleep(0.1)
