"""``manage.py drain_idempotency_outbox`` against the real PostgreSQL: the outbox drained into
keys, its messages, its exit status for cron and Kubernetes, and ``--loop`` stopping cleanly
on SIGTERM and SIGINT in a real subprocess; and the purge command's exit status."""

from __future__ import annotations

import io
import json
import re
import signal
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.store.status import COMPLETED
from tests.support.commands import run_command, start_command
from tests.support.factories import ExpiredKeyFactory, IdempotencyOutboxFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

#: A database name on the real server that does not exist: every connection fails.
MISSING_DATABASE = "idem_no_such_database"


def drain(*args: str) -> str:
    out = io.StringIO()
    call_command("drain_idempotency_outbox", *args, stdout=out)
    return out.getvalue()


def fill(live: int, expired: int = 0) -> list[str]:
    rows = IdempotencyOutboxFactory.create_batch(live)
    for key in [r.key for r in rows]:
        IdempotencyOutbox.objects.filter(key=key).update(
            response_body=json.dumps({"key": key}).encode()
        )
    IdempotencyOutboxFactory.create_batch(expired, expires_at=timezone.now() - timedelta(minutes=1))
    return [r.key for r in rows]


def assert_drained_into_keys(keys: list[str]) -> None:
    assert IdempotencyOutbox.objects.count() == 0
    stored = dict(IdempotencyKey.objects.values_list("key", "response_body"))
    assert set(stored) == set(keys)
    for key in keys:
        body = stored[key]
        assert body is not None
        assert json.loads(bytes(body))["key"] == key
    assert set(IdempotencyKey.objects.values_list("status", flat=True)) == {COMPLETED}


def test_drains_the_outbox_into_keys_in_batches() -> None:
    keys = fill(live=5, expired=2)
    output = drain("--batch-size", "3")
    assert_drained_into_keys(keys)
    assert output == (
        "Drained 7 idempotency outbox rows (2 of them expired and only deleted) "
        f"from database 'default' in 3 transactions ({output.rsplit('(', 1)[1]}"
    )
    assert output.count("\n") == 1  # a short run: no progress line


def test_one_row_is_singular_and_no_expired_rows_go_unsaid() -> None:
    fill(live=1)
    assert drain().startswith(
        "Drained 1 idempotency outbox row from database 'default' in 1 transaction ("
    )
    empty = drain()
    assert empty.startswith("Drained 0 idempotency outbox rows from database 'default'")
    assert "expired" not in empty  # nothing said of the expired rows when there were none
    assert " in 0 transactions (" in empty


def test_silent_at_verbosity_0_and_progress_lines_at_1() -> None:
    keys = fill(live=4)
    assert drain("-v", "0", "--batch-size", "2") == ""
    assert_drained_into_keys(keys)
    more = fill(live=5)
    lines = drain("--batch-size", "2", "--progress-every", "0").splitlines()
    assert len(lines) == 4  # a line per batch (every 0s), then the summary
    assert re.fullmatch(r"drained 2 of about 5 rows, [\d,.]+ rows/s, about \w+ left", lines[0])
    assert lines[2].startswith("drained 5 of about 5 rows")
    assert lines[3].startswith("Drained 5 idempotency outbox rows")
    assert_drained_into_keys(keys + more)


def test_duration_stops_a_run_and_bad_arguments_are_errors() -> None:
    fill(live=3)
    assert drain("--duration", "0").startswith("Drained 0 idempotency outbox rows")
    assert IdempotencyOutbox.objects.count() == 3
    for args, message in [
        (["--batch-size", "0"], "must be between 1 and"),
        (["--duration", "soon"], "invalid duration 'soon'"),
        (["--max-failures", "0"], "--max-failures: must be 1 or more"),
        (["--database", "nope"], "unknown database alias 'nope'"),
    ]:
        with pytest.raises(CommandError, match=re.escape(message)):
            drain(*args)


def test_exit_status_for_cron_done_and_failed() -> None:
    keys = fill(live=3, expired=1)
    done = run_command(str(connection.settings_dict["NAME"]), "drain_idempotency_outbox")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Drained 4 idempotency outbox rows (1 of them")
    assert_drained_into_keys(keys)

    failed = run_command(MISSING_DATABASE, "drain_idempotency_outbox")
    assert failed.returncode == 1
    assert failed.stdout == ""
    assert "CommandError: database 'default':" in failed.stderr
    assert MISSING_DATABASE in failed.stderr

    usage = run_command(MISSING_DATABASE, "drain_idempotency_outbox", "--batch-size", "x")
    assert usage.returncode == 2


def test_purge_exit_status_done_and_failed() -> None:
    ExpiredKeyFactory.create_batch(2)
    done = run_command(str(connection.settings_dict["NAME"]), "purge_idempotency_keys", "-v", "0")
    assert (done.returncode, done.stdout) == (0, "")
    assert IdempotencyKey.objects.count() == 0
    failed = run_command(MISSING_DATABASE, "purge_idempotency_keys")
    assert failed.returncode == 1
    assert "CommandError: database 'default':" in failed.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_loop_drains_what_arrives_and_stops_cleanly_on_a_signal(signum: int) -> None:
    process = start_command(
        str(connection.settings_dict["NAME"]),
        "drain_idempotency_outbox",
        "--loop",
        "--interval",
        "0.2",
    )
    try:
        first = fill(live=3)
        wait_until(lambda: IdempotencyOutbox.objects.count() == 0, timeout=60)
        second = fill(live=2, expired=1)
        wait_until(lambda: IdempotencyOutbox.objects.count() == 0, timeout=30)
        assert_drained_into_keys(first + second)
        assert process.poll() is None  # still looping
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "Stopped by a signal; the batch under way was committed." in stdout
    assert "Drained 6 idempotency outbox rows (1 of them expired" in stdout
    assert "Traceback" not in stderr


def _busy_sessions() -> list[str]:
    """The states of the other sessions on the test database that are not idle."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state <> 'idle'"
        )
        return [str(state) for (state,) in cursor.fetchall()]


def test_a_signal_ends_the_wait_between_passes_at_once() -> None:
    process = start_command(
        str(connection.settings_dict["NAME"]),
        "drain_idempotency_outbox",
        "--loop",
        "--interval",
        "1h",
    )
    try:
        fill(live=1)
        wait_until(lambda: IdempotencyOutbox.objects.count() == 0, timeout=60)
        # The pass is over (its session holds no transaction): the loop waits its hour. A
        # signal just before that wait ends the loop the same way.
        wait_until(lambda: not _busy_sessions(), timeout=60)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=15)
        stopped_in = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert stopped_in < 600  # at once, not after its hour (a wide bound: a busy machine)
    assert "Drained 1 idempotency outbox row " in stdout


def test_loop_exits_1_after_max_failures_in_a_row() -> None:
    result = run_command(
        MISSING_DATABASE,
        "drain_idempotency_outbox",
        "--loop",
        "--interval",
        "0.1",
        "--max-failures",
        "2",
        timeout=60,
    )
    assert result.returncode == 1
    assert "[1 of 2 failed passes in a row]" in result.stderr
    assert "[2 of 2 failed passes in a row]" in result.stderr


#: Runs the command in a process where ``import celery`` fails, as where it is not installed.
WITHOUT_CELERY = """
import sys

class NoCelery:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "celery":
            raise ImportError("No module named 'celery'")

sys.meta_path.insert(0, NoCelery())
import django

django.setup()
from django.core.management import call_command

call_command("drain_idempotency_outbox", *sys.argv[1:])
"""


def test_the_command_needs_no_celery() -> None:
    keys = fill(live=2)
    result = run_command(str(connection.settings_dict["NAME"]), code=WITHOUT_CELERY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Drained 2 idempotency outbox rows")
    assert_drained_into_keys(keys)
