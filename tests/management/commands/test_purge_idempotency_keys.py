"""``manage.py purge_idempotency_keys`` on PostgreSQL and on SQLite: batches, counted
messages (``ngettext``), silence at ``-v 0``, progress lines on a long run. Its exit
status in a subprocess is in test_drain_idempotency_outbox.py, beside the drain command's."""

from __future__ import annotations

import io
import re
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.utils import timezone

from django_idempotency.management.durations import format_duration, parse_duration
from django_idempotency.models import IdempotencyKey
from tests.support.factories import CompletedKeyFactory, ExpiredKeyFactory, IdempotencyKeyFactory

pytestmark = pytest.mark.django_db(databases=["default", "sqlite"])

DATABASES = [pytest.param("default", marks=pytest.mark.postgres, id="postgres"), "sqlite"]


def purge(*args: str, stdout: io.StringIO | None = None) -> str:
    out = stdout or io.StringIO()
    call_command("purge_idempotency_keys", *args, stdout=out)
    return out.getvalue()


def make_keys(
    using: str, *, expired: int, live: int = 2, expired_ago: timedelta | None = None
) -> None:
    extra = {}
    if expired_ago is not None:
        extra["expires_at"] = timezone.now() - expired_ago
    ExpiredKeyFactory.create_batch(expired, _using=using, **extra)
    CompletedKeyFactory.create_batch(live, _using=using)
    IdempotencyKeyFactory(_using=using)  # in progress, not expired


@pytest.mark.parametrize("using", DATABASES)
def test_deletes_expired_keys_only_in_batches(using: str) -> None:
    make_keys(using, expired=7)
    output = purge("--database", using, "--batch-size", "3")
    assert output == output.strip() + "\n"  # one summary line, no progress when not a tty
    assert (
        f"Deleted 7 expired idempotency keys from database {using!r} in 3 batches of up to 3"
        in output
    )
    remaining = IdempotencyKey.objects.using(using)
    assert remaining.count() == 3
    assert not remaining.filter(expires_at__lte=timezone.now()).exists()


@pytest.mark.parametrize("using", DATABASES)
def test_dry_run_counts_and_deletes_nothing(using: str) -> None:
    make_keys(using, expired=4)
    output = purge("--database", using, "--dry-run")
    assert output == f"Would delete 4 expired idempotency keys from database {using!r}.\n"
    assert IdempotencyKey.objects.using(using).count() == 7


@pytest.mark.parametrize("using", DATABASES)
def test_older_than_keeps_recently_expired_keys(using: str) -> None:
    ExpiredKeyFactory.create_batch(2, _using=using, expires_at=timezone.now() - timedelta(days=10))
    recent = ExpiredKeyFactory(_using=using, expires_at=timezone.now() - timedelta(hours=1))
    output = purge("--database", using, "--older-than", "7d")
    assert "Deleted 2 expired idempotency keys (expired more than 1w ago)" in output
    assert list(IdempotencyKey.objects.using(using).values_list("pk", flat=True)) == [recent.pk]
    assert "Would delete 1 " in purge("--database", using, "--older-than", "30m", "--dry-run")
    assert "Would delete 0 " in purge("--database", using, "--older-than", "90m", "--dry-run")


@pytest.mark.parametrize("using", DATABASES)
def test_progress_lines_show_rows_rate_and_time_left(using: str) -> None:
    make_keys(using, expired=5)
    lines = purge("--database", using, "--batch-size", "2", "--progress-every", "0").splitlines()
    assert len(lines) == 4  # one per batch (every 0s), then the summary
    assert re.fullmatch(r"deleted 2 of about 5 rows, [\d,.]+ rows/s, about \w+ left", lines[0])
    assert lines[1].startswith("deleted 4 of about 5 rows, ")
    assert lines[2].startswith("deleted 5 of about 5 rows, ")
    assert lines[3].startswith("Deleted 5 expired idempotency keys")


@pytest.mark.parametrize("using", DATABASES)
def test_silent_at_verbosity_0(using: str) -> None:
    make_keys(using, expired=3)
    assert purge("--database", using, "--dry-run", "-v", "0") == ""
    assert purge("--database", using, "-v", "0", "--batch-size", "1", "--progress-every", "0") == ""
    assert not IdempotencyKey.objects.using(using).filter(expires_at__lte=timezone.now()).exists()


@pytest.mark.parametrize("using", DATABASES)
def test_one_key_is_singular(using: str) -> None:
    make_keys(using, expired=1)
    assert purge("--database", using, "--dry-run") == (
        f"Would delete 1 expired idempotency key from database {using!r}.\n"
    )
    assert purge("--database", using).startswith(
        f"Deleted 1 expired idempotency key from database {using!r} in 1 batch of up to 1000 ("
    )


def test_progress_lines_come_at_most_every_interval() -> None:
    """A long run prints a line when ``every`` seconds have passed since the last one, and
    counts the rows left once, for the first line."""
    from django.core.management.base import BaseCommand

    from django_idempotency.management.progress import Progress

    now = [0.0]
    counted: list[int] = []
    command = BaseCommand(stdout=io.StringIO())

    def remaining() -> int:
        counted.append(1)
        return 9000

    progress = Progress(
        command, verb="deleted", verbosity=1, every=5, remaining=remaining, clock=lambda: now[0]
    )
    for second, done in [(1, 100), (4.9, 490), (5, 500), (6, 600), (9.9, 990), (10, 1000)]:
        now[0] = second
        progress.update(done)
    assert command.stdout._out.getvalue().splitlines() == [  # type: ignore[attr-defined]
        "deleted 500 of about 9,500 rows, 100 rows/s, about 1m30s left",
        "deleted 1,000 of about 9,500 rows, 100 rows/s, about 1m25s left",
    ]
    assert counted == [1]
    quiet = Progress(command, verb="deleted", verbosity=0, every=0, clock=lambda: now[0])
    now[0] = 100
    quiet.update(5)
    assert quiet.lines == 0


def test_a_slow_rate_keeps_a_decimal() -> None:
    """Below 10 rows/s the rate has one decimal: 3 rows in 10 s is 0.3 rows/s, not 0."""
    from django.core.management.base import BaseCommand

    from django_idempotency.management.progress import Progress

    now = [0.0]
    command = BaseCommand(stdout=io.StringIO())
    progress = Progress(command, verb="deleted", verbosity=1, every=5, clock=lambda: now[0])
    now[0] = 10
    progress.update(3)
    assert command.stdout._out.getvalue() == "deleted 3 rows, 0.3 rows/s\n"  # type: ignore[attr-defined]


def test_nothing_to_delete() -> None:
    output = purge("--database", "sqlite")
    assert "Deleted 0 expired idempotency keys from database 'sqlite' in 0 batches of up" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "0"], "argument --batch-size: must be between 1 and 100000, not 0"),
        (["--batch-size", "many"], "argument --batch-size: must be a whole number, not 'many'"),
        (["--older-than", "soon"], "argument --older-than: invalid duration 'soon'"),
        (["--older-than=-1d"], "invalid duration '-1d'"),
        (["--older-than", ""], "empty duration"),
        (["--database", "nope"], "unknown database alias 'nope'"),
    ],
)
def test_bad_arguments_are_command_errors(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)):
        purge(*args)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("2h", 7200),
        ("7d", 604800),
        ("1w", 604800),
        ("1h30m", 5400),
        ("45", 45),
        ("0.5h", 1800),
        (" 2H ", 7200),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "h", "1x", "1h1h", "1h-", "d7", "1 h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_format_duration() -> None:
    assert format_duration(timedelta(hours=26, seconds=5)) == "1d2h5s"
    assert format_duration(timedelta(0)) == "0s"


@pytest.mark.parametrize("using", DATABASES)
def test_single_statement_and_orm_batches_agree(using: str) -> None:
    """The one-statement purge (PostgreSQL, SQLite) and the ORM one (other databases)
    delete the same rows in the same batches, oldest expiry first."""
    manager = IdempotencyKey.objects
    now = timezone.now()
    for n in range(5):
        ExpiredKeyFactory(_using=using, expires_at=now - timedelta(minutes=n + 1))
    CompletedKeyFactory(_using=using)
    oldest = list(manager.using(using).order_by("expires_at").values_list("pk", flat=True)[:2])
    batches = list(
        manager.iter_delete_expired(batch_size=2, cutoff=now, using=using, max_batches=1)
    )
    assert batches == [2]
    assert not manager.using(using).filter(pk__in=oldest).exists()
    orm_path = manager._iter_delete_expired_orm  # type: ignore[attr-defined]
    assert list(orm_path(2, now, using, None)) == [2, 1]
    assert manager.using(using).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_purge_spares_a_key_taken_over_while_it_runs() -> None:
    """A request takes an expired key over (renews it) while a purge batch has already
    selected it: the purge waits for the row, sees the new expiry and leaves it."""
    key = ExpiredKeyFactory()
    cutoff = timezone.now()
    result: dict[str, object] = {}

    def purge() -> None:
        try:
            result["batches"] = list(
                IdempotencyKey.objects.iter_delete_expired(batch_size=10, cutoff=cutoff)
            )
        finally:
            connections.close_all()

    with transaction.atomic():
        IdempotencyKey.objects.filter(pk=key.pk).update(
            expires_at=timezone.now() + timedelta(days=1)
        )
        thread = threading.Thread(target=purge)
        thread.start()
        waiting = False
        for _ in range(100):  # until the purge blocks on the row this transaction holds
            with connection.cursor() as cursor:
                # pg_stat_activity is a snapshot per transaction unless cleared.
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a "
                    "ON a.pid = l.pid WHERE NOT l.granted AND a.datname = current_database()"
                )
                waiting = cursor.fetchone()[0] == 1
            if waiting:
                break
            time.sleep(0.05)
        assert waiting
    thread.join(10)
    assert result["batches"] == []
    assert IdempotencyKey.objects.filter(pk=key.pk).exists()
