"""The claim's asynchronous commit against real crashes of a private PostgreSQL server.

The claim commits with ``synchronous_commit = off``; the view's transaction (its writes and
the completion) commits durably after it. PostgreSQL flushes its WAL in order, so the
view's commit flushes the claim's records before its own: a claim that a crash loses
belongs to a request none of whose writes committed, and a retry that runs the view again
is right. Here a private server (``fsync`` on, the defaults) runs the ``db`` strategy of
the example project under gunicorn and is crashed with ``pg_ctl stop -m immediate`` (no
checkpoint; crash recovery from the WAL at the next start):

* while the view runs, after its claim committed: after the restart the claim is gone or
  still in progress, no charge exists, and the retry runs the view exactly once (at once
  when the claim is gone, after ``LOCK_TIMEOUT`` when it is still there). With the WAL
  writer paused the claim's commit record has not left the server's memory at the crash
  (what a power loss does to WAL that reached only the OS), and the claim really is lost;
* right after a completed response reached the client, the WAL writer paused all along: the
  completed key and the charge are both there (the view's own commit flushed them, and the
  claim's row with them), and the retry replays.

The side effects are counted in the example's charge table and in ``PSP_CALL_LOG`` (one line
per call of the payment provider, that is per execution of the view's body). A first test
shows the mechanism on the WAL positions: the claim returns before its WAL is flushed, and
the next commit on the connection flushes it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
from django.db import connections

from django_idempotency.store.sql.statements import statements

from ..support.databases import count_rows, pg_admin, query_scalar
from ..support.example import ExampleServer, example_server, is_replay, manage, request
from ..support.postgres_servers import PrivatePostgres, postgres_bindir
from ..support.services import in_ci, which
from ..support.threads import in_background
from ..support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.server]

CHARGE = {"amount": 1999, "currency": "EUR"}
#: How long the payment provider takes: the view is inside it when the server crashes.
DELAY_MS = 1500
#: Short, so that a claim that survived the crash is stale soon; the heartbeat renews every
#: LOCK_TIMEOUT / 3, and a renewal (a durable commit) would flush the claim.
LOCK_TIMEOUT = 4.0
KEYS = "django_idempotency_idempotencykey"


def _missing(reason: str) -> NoReturn:
    if in_ci():
        pytest.fail(reason + ", and CI is set", pytrace=False)
    pytest.skip(reason + " (with CI set this fails)")


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivatePostgres]:
    """A private cluster with the example project migrated and seeded in database ``idem``;
    stopped and removed at the end of the module, also after a failure."""
    bindir = postgres_bindir()
    if bindir is None:
        _missing("the PostgreSQL server programs (initdb, pg_ctl, postgres) are not installed")
    if os.geteuid() == 0 and which("runuser") is None:
        _missing("runuser (to run a private PostgreSQL as the postgres user) is not installed")
    server = PrivatePostgres(bindir)
    try:
        server.create().start()
        pg_admin('CREATE DATABASE "idem"', server.url())
        manage(server.url("idem"), "migrate", "--noinput", "-v", "0")
        manage(server.url("idem"), "seed_demo")
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def postgres(private_postgres: PrivatePostgres) -> PrivatePostgres:
    """The private server, started again if an earlier test left it crashed."""
    if not private_postgres.running:
        private_postgres.start()
    return private_postgres


@pytest.fixture(scope="module")
def example(
    private_postgres: PrivatePostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ExampleServer, Path]]:
    """The example API (``db`` strategy) against the private server, and its PSP call log.
    One connection per request (``DATABASE_CONN_MAX_AGE=0``): none outlives a crash."""
    calls = tmp_path_factory.mktemp("psp") / "calls.log"
    calls.touch()
    with example_server(
        private_postgres.url("idem"),
        strategy="db",
        psp_delay_ms=DELAY_MS,
        lock_timeout=LOCK_TIMEOUT,
        workers=1,
        threads=4,
        env={"PSP_CALL_LOG": str(calls), "DATABASE_CONN_MAX_AGE": "0"},
    ) as server:
        yield server, calls


def _psp_calls(calls: Path) -> int:
    return len(calls.read_text().splitlines())


def _status(db: str, key: str) -> str | None:
    """The key's row: its status, or None when there is none."""
    return query_scalar(db, f"SELECT status FROM {KEYS} WHERE key = %s", (key,))


def _lease_age(db: str, key: str) -> float:
    """Seconds since the key's lease was last renewed, on the database's clock."""
    return float(
        query_scalar(
            db,
            f"SELECT EXTRACT(EPOCH FROM statement_timestamp() - locked_at) FROM {KEYS} "
            "WHERE key = %s",
            (key,),
        )
    )


# -- the mechanism ----------------------------------------------------------------------------


def test_the_claim_returns_before_its_wal_is_flushed_and_the_next_commit_flushes_it(
    postgres: PrivatePostgres,
) -> None:
    """The statements as the app sends them (PostgreSQL's, from ``default``), with the WAL
    writer paused so that only a commit's own flush moves the flush position."""
    connection = connections["default"]
    sql = statements(connection)
    token = uuid.uuid4()
    values: dict[str, Any] = {
        "scope": "user:1",
        "key": "k-lsn",
        "fingerprint": "f" * 64,
        "status": "in_progress",
        "claim_token": sql.prep("claim_token", token, connection),
        "request_method": "POST",
        "request_path": "/api/charges/",
        "response_headers": sql.prep("response_headers", {}, connection),
        "ttl": 3600.0,
        "stale": -60.0,
    }
    url = postgres.url("idem")
    with (
        postgres.wal_writer_paused(),
        psycopg.connect(url, autocommit=True) as app,
        psycopg.connect(url, autocommit=True) as observer,
    ):

        def written_to() -> str:
            return str(observer.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])  # type: ignore[index]

        def flushed(lsn: str) -> bool:
            found = observer.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (lsn,))
            return bool(found.fetchone()[0])  # type: ignore[index]

        start = written_to()
        row = app.execute(sql.claim.sql, sql.claim.params(connection, values)).fetchone()
        assert row is not None
        claimed_to = written_to()
        assert claimed_to != start  # the claim wrote WAL...
        assert not flushed(claimed_to)  # ...and its commit returned before it was flushed
        # Committed all the same: every other connection sees it (a duplicate gets a 409).
        status = observer.execute(f"SELECT status FROM {KEYS} WHERE id = %s", row).fetchone()
        assert status == ("in_progress",)
        # The setting ended with the claim's transaction.
        assert app.execute("SHOW synchronous_commit").fetchone() == ("on",)

        # The next transaction on the connection (the view's, here one statement) commits
        # durably, and its flush takes the claim's WAL, which comes before it, along.
        with app.transaction():
            renew = {"pk": row[0], "token": values["claim_token"]}
            assert app.execute(sql.renew.sql, sql.renew.params(connection, renew)).rowcount == 1
        assert flushed(written_to())
        assert flushed(claimed_to)

        # The claim's form inside a transaction has no commit mode of its own: run on its
        # own here, it waits for its flush like any commit.
        values.update(
            key="k-lsn-plain", claim_token=sql.prep("claim_token", uuid.uuid4(), connection)
        )
        plain = sql.claim_in_transaction
        assert app.execute(plain.sql, plain.params(connection, values)).fetchone() is not None
        assert flushed(written_to())


# -- crashes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("wal_writer", ["paused", "running"], ids=["claim-lost", "claim-written"])
def test_a_crash_while_the_view_runs_leaves_no_charge_and_the_retry_runs_once(
    postgres: PrivatePostgres, example: tuple[ExampleServer, Path], wal_writer: str
) -> None:
    server, calls = example
    db = postgres.url("idem")
    url = server.url + "/api/charges/"
    key = f"crash-in-view-{wal_writer}"
    charges, psp = count_rows(db, "payments_charge"), _psp_calls(calls)

    paused: AbstractContextManager[Any] = (
        postgres.wal_writer_paused() if wal_writer == "paused" else nullcontext()
    )
    with paused:
        first = in_background(lambda: request(url, key=key, body=CHARGE, timeout=30))
        # The claim has committed and the view is inside the payment provider's call.
        wait_until(lambda: _status(db, key) == "in_progress", timeout=60)
        wait_until(lambda: _psp_calls(calls) == psp + 1, timeout=60)
        if wal_writer == "running":
            # The WAL writer writes the claim's commit out (wal_writer_delay): until the WAL
            # is flushed past everything written so far, the claim's commit with it.
            written = query_scalar(db, "SELECT pg_current_wal_insert_lsn()::text")
            flushed = "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn"
            wait_until(lambda: bool(query_scalar(db, flushed, (written,))), timeout=60)
        postgres.crash()
    # The view comes back from the provider to a server that is gone: nothing commits.
    status, body = first.result(timeout=30)
    assert status == 503, (status, body)
    postgres.start()

    after_crash = _status(db, key)
    assert count_rows(db, "payments_charge") == charges
    if wal_writer == "paused":
        # Only ever in the server's memory: lost in the crash, as if it had never been made.
        # (Had a heartbeat renewal, a durable commit, run before the crash, it would have
        # flushed the claim: the crash comes well within LOCK_TIMEOUT / 3 of the claim.)
        assert after_crash is None, "the claim survived a crash with the WAL writer paused"
    else:
        assert after_crash in {None, "in_progress"}
    if after_crash == "in_progress":
        # A claim that survived still fences its key until its lease is stale.
        if _lease_age(db, key) < LOCK_TIMEOUT - 1:
            busy, busy_body = request(url, key=key, body=CHARGE)
            assert busy == 409, (busy, busy_body)
        wait_until(lambda: _lease_age(db, key) > LOCK_TIMEOUT, timeout=2 * LOCK_TIMEOUT)

    retry_status, retry = request(url, key=key, body=CHARGE)
    assert retry_status == 201 and not is_replay((retry_status, retry)), retry
    assert _psp_calls(calls) == psp + 2  # the crashed execution and the retry: once more
    assert count_rows(db, "payments_charge") == charges + 1
    assert _status(db, key) == "completed"

    again_status, again = request(url, key=key, body=CHARGE)
    assert again_status == 201 and is_replay((again_status, again))
    assert again["id"] == retry["id"]
    assert _psp_calls(calls) == psp + 2
    assert count_rows(db, "payments_charge") == charges + 1


def test_a_crash_right_after_the_answer_keeps_the_completed_key_and_its_charge(
    postgres: PrivatePostgres, example: tuple[ExampleServer, Path]
) -> None:
    server, calls = example
    db = postgres.url("idem")
    url = server.url + "/api/charges/"
    key = "crash-after-answer"
    charges, psp = count_rows(db, "payments_charge"), _psp_calls(calls)

    # The WAL writer is paused for the whole request: what is on disk at the crash is
    # what the request's own commits flushed.
    with postgres.wal_writer_paused():
        status, body = request(url, key=key, body=CHARGE)
        assert status == 201 and not is_replay((status, body)), body
        postgres.crash()
    postgres.start()

    # The view's durable commit flushed its charge and the completion, and before them the
    # claim's row that the completion updated.
    assert _status(db, key) == "completed"
    assert count_rows(db, "payments_charge") == charges + 1
    assert count_rows(db, "payments_charge", f"id = {int(body['id'])}") == 1

    replay_status, replay = request(url, key=key, body=CHARGE)
    assert replay_status == 201 and is_replay((replay_status, replay))
    assert replay["id"] == body["id"]
    assert _psp_calls(calls) == psp + 1
    assert count_rows(db, "payments_charge") == charges + 1
