"""A setting the system checks call an error stops every real process at start-up, with
the check's message: gunicorn, uvicorn, a Celery worker and ``manage.py`` commands, none of
which runs the system checks before it serves (the issue: ``LOCK_TIMEOUT = -5`` under
gunicorn let duplicates of a running payment take its live lease over). ``manage.py
check`` still lists the errors in Django's format."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_idempotency.checks import error_text
from django_idempotency.checks.values import positive_errors

from ..support.asgi import uvicorn_command
from ..support.example import ROOT, example_env, gunicorn_command, refused_start
from ..support.workers import Worker

#: The issue's setting, as the example project reads it from its environment.
BROKEN = {"IDEMPOTENCY_LOCK_TIMEOUT": "-5"}


def expected_message() -> str:
    """Check E002's text for the example project's ``LOCK_TIMEOUT = float("-5")``."""
    (error,) = positive_errors("IDEMPOTENCY['LOCK_TIMEOUT']", -5.0, 60)
    text = error_text(error)
    assert text.startswith("django_idempotency.E002: IDEMPOTENCY['LOCK_TIMEOUT'] must be")
    return text


@pytest.fixture
def database_url() -> Iterator[str]:
    """A SQLite file the processes could use; they stop before they open it."""
    with tempfile.TemporaryDirectory(prefix="idem-startup-") as tmp:
        yield f"sqlite:///{tmp}/db.sqlite3"


def test_gunicorn_refuses_to_start_and_never_answers(database_url: str) -> None:
    refusal = refused_start(
        "gunicorn", gunicorn_command("example_project.wsgi", 2, 4), database_url, BROKEN
    )
    assert refusal.answers == [], refusal.log
    assert refusal.returncode not in (None, 0), refusal.log
    assert expected_message() in refusal.log


def test_uvicorn_refuses_to_start_and_never_answers(database_url: str) -> None:
    refusal = refused_start("uvicorn", uvicorn_command(1), database_url, BROKEN)
    assert refusal.answers == [], refusal.log
    assert refusal.returncode not in (None, 0), refusal.log
    assert expected_message() in refusal.log


def test_a_celery_worker_refuses_to_start(database_url: str, tmp_path: Path) -> None:
    worker = Worker("refused", example_env(database_url, BROKEN), tmp_path / "worker.log")
    try:
        with pytest.raises(RuntimeError, match="celery worker exited"):
            worker.start(timeout=60)
    finally:
        worker.stop()
    assert worker.process is not None and worker.process.returncode != 0
    assert expected_message() in worker.log()
    assert " ready." not in worker.log()


def manage(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=example_env(database_url, BROKEN),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_manage_py_check_lists_the_error_in_djangos_format(database_url: str) -> None:
    result = manage(database_url, "check")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "SystemCheckError: System check identified some issues:" in result.stderr
    assert "ERRORS:" in result.stderr
    assert (
        "?: (django_idempotency.E002) IDEMPOTENCY['LOCK_TIMEOUT'] must be a positive number."
        in result.stderr
    )


def test_a_command_that_skips_the_checks_refuses_too(database_url: str) -> None:
    """``showmigrations`` runs no system checks, and ``--skip-checks`` skips them for any
    command: the start-up validation stops both."""
    for args in (("showmigrations",), ("migrate", "--skip-checks", "--noinput")):
        result = manage(database_url, *args)
        assert result.returncode != 0, result.stdout
        assert expected_message() in result.stderr
        assert "Apply all migrations" not in result.stdout
    assert not Path(database_url.removeprefix("sqlite:///")).exists()
