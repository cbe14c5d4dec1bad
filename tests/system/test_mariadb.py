"""What is MariaDB's own in the db strategy, against the real server (``mariadb``).

The managers' statements run on MariaDB in tests/store/test_managers.py like on the other
databases; here are the ways MariaDB (and MySQL, whose statements run here too) could break
"one execution, one stored answer, no 500" where PostgreSQL would not: collations that
make two keys one, the session's time zone, InnoDB's lock waits and deadlocks, a killed
connection, REPEATABLE READ snapshots (check E033), and the outbox drain's upsert.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import closing, nullcontext
from datetime import UTC, timedelta
from typing import Any

import pytest
from django.db import NotSupportedError, OperationalError, connections, transaction
from django.test import RequestFactory, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_idempotency import strategies
from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.protocol.engine import handle
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.errors import is_connection_lost, is_transient
from django_idempotency.store.records import ClaimResult, ClaimState
from django_idempotency.store.sql.mysql import MariaDBDialect, MySQLDialect
from django_idempotency.store.sql.statements import statements

from ..support.assertions import assert_problem
from ..support.mariadb import database_url_of, mysql_connect, mysql_statements
from ..support.proxy import through_proxy
from ..support.threads import in_background, run_at_once
from ..testapp.models import SideEffect

pytestmark = [pytest.mark.mariadb, pytest.mark.django_db(databases=["mariadb"])]

ALIAS = "mariadb"
PRINT = "a" * 64
RESPONSE = StoredResponse(status=201, headers={"Content-Type": "application/json"}, body=b"{}")
KEYS = IdempotencyKey._meta.db_table


def claim(key: str = "k1", scope: str = "user:1", **options: Any) -> ClaimResult:
    values: dict[str, Any] = {"ttl": 3600, "lock_timeout": 30, "using": ALIAS}
    values.update(options)
    return IdempotencyKey.objects.claim(scope, key, PRINT, **values)


def server_connection() -> Any:
    """A connection of the test's own to the test database (not Django's)."""
    return closing(mysql_connect(database_url_of(ALIAS)))


# -- the server is the one the statements are for -------------------------------------------


def test_mariadb_gets_mariadbs_statements() -> None:
    sql = statements(connections[ALIAS])
    assert sql.dialect is MariaDBDialect
    assert " RETURNING " in sql.claim.sql and "ON DUPLICATE KEY UPDATE" in sql.claim.sql
    assert sql.store is None and sql.outbox_add is None  # advisory_lock's, hybrid's


@pytest.mark.django_db(databases=["mariadb"], transaction=True)
@pytest.mark.parametrize("dialect", [MariaDBDialect, MySQLDialect], ids=["mariadb", "mysql"])
def test_a_winner_sends_one_statement_on_mariadb_and_reads_back_on_mysql(dialect: Any) -> None:
    """MariaDB's claim returns the winner's id; MySQL's returns nothing, and the winner
    learns it won by reading its own token back: one statement more, the same outcome."""
    with mysql_statements(ALIAS) if dialect is MySQLDialect else nullcontext():
        with CaptureQueriesContext(connections[ALIAS]) as queries:
            won = claim("one-or-two")
        lost = claim("one-or-two")
    assert won.state is ClaimState.CLAIMED and lost.state is ClaimState.IN_PROGRESS
    assert len(queries) == (1 if dialect is MariaDBDialect else 2)
    assert won.pk is not None
    assert IdempotencyKey.objects.using(ALIAS).get(pk=won.pk).claim_token == won.token


# -- collations: two keys are never one ----------------------------------------------------


def test_keys_and_scopes_compare_byte_for_byte() -> None:
    """MariaDB's default collation says 'Pay-1' = 'pay-1' and 'user:1' = 'user:1 ': with
    it, the second request would get the first one's stored response. The migration makes
    scope and key binary and no-pad, so each of these is a key of its own."""
    pairs = [
        ("user:1", "Pay-1"),
        ("user:1", "pay-1"),
        ("user:1", "PAY-1"),
        ("user:alice", "k"),
        ("user:Alice", "k"),
        ("user:alice ", "k"),
        ("user:é", "k"),
        ("user:e", "k"),
        ("user:\U0001f600", "k"),
    ]
    results = [claim(key, scope) for scope, key in pairs]
    assert [r.state for r in results] == [ClaimState.CLAIMED] * len(pairs)
    assert len({r.pk for r in results}) == len(pairs)
    stored = IdempotencyKey.objects.using(ALIAS).values_list("scope", "key")
    assert sorted(stored) == sorted(pairs)


def test_the_key_columns_have_a_binary_no_pad_collation() -> None:
    """After every migration (a later AlterField of scope or key would silently give the
    columns the table's case-insensitive collation back)."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME IN ('scope', 'key') "
            "AND TABLE_NAME IN (%s, %s)",
            [KEYS, IdempotencyOutbox._meta.db_table],
        )
        found = cursor.fetchall()
    assert len(found) == 4
    assert {collation for _table, _column, collation in found} == {"utf8mb4_nopad_bin"}


# -- the clock: the server's, in UTC, whatever the session or the app says ------------------


@pytest.mark.django_db(databases=["mariadb"], transaction=True)
def test_leases_are_judged_on_the_servers_utc_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's time zone nine hours east and the app's clock 45 s ahead change
    nothing: times are UTC_TIMESTAMP(6), and Django reads them as UTC."""
    connection = connections[ALIAS]
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+09:00'")
        cursor.execute("SELECT UTC_TIMESTAMP(6)")
        server_now = timezone.make_aware(cursor.fetchone()[0], UTC)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=45))
    first = claim("clock", lock_timeout=30)
    assert first.state is ClaimState.CLAIMED and first.pk is not None
    row = IdempotencyKey.objects.using(ALIAS).get(pk=first.pk)
    assert abs(row.created_at - server_now) < timedelta(seconds=5)
    assert row.locked_at is not None and abs(row.locked_at - server_now) < timedelta(seconds=5)
    # Not stale for the server, though the app's clock is 45 s past a 30 s lease.
    assert claim("clock", lock_timeout=30).state is ClaimState.IN_PROGRESS
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {KEYS} SET locked_at = UTC_TIMESTAMP(6) - INTERVAL 31 SECOND WHERE id = %s",
            [first.pk],
        )
    taken = claim("clock", lock_timeout=30)
    assert taken.state is ClaimState.CLAIMED and taken.taken_over


@pytest.mark.parametrize("skew", [90, -90], ids=["app-ahead-90s", "app-behind-90s"])
def test_the_drain_judges_expiry_on_the_servers_clock(
    monkeypatch: pytest.MonkeyPatch, skew: int
) -> None:
    """The drain through the ORM (MariaDB has no one-statement drain) reads the server's
    clock: a row with 30 s left is moved and one expired 30 s ago dropped, and rows written
    two minutes ago are not held back as young, whatever the app server's clock says."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT UTC_TIMESTAMP(6)")
        server_now = timezone.make_aware(cursor.fetchone()[0], UTC)
    for key, left in (("live", 30), ("expired", -30)):
        IdempotencyOutbox.objects.using(ALIAS).create(
            scope="user:1",
            key=key,
            fingerprint=PRINT,
            response_status=201,
            created_at=server_now - timedelta(minutes=2),
            expires_at=server_now + timedelta(seconds=left),
        )
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=skew))
    outbox = IdempotencyOutbox.objects
    result = outbox.drain(using=ALIAS, hold_partial=timedelta(minutes=1))
    assert (result.drained, result.discarded, result.held) == (1, 1, 0)
    assert list(IdempotencyKey.objects.using(ALIAS).values_list("key", flat=True)) == ["live"]


# -- InnoDB's lock waits and deadlocks -------------------------------------------------------


@pytest.fixture
def row_held() -> Iterator[tuple[Any, ClaimResult]]:
    """A claimed key whose row another connection holds locked (``FOR UPDATE`` in an open
    transaction), and that connection: a claimant of the key waits for it."""
    held = claim("held", scope="anonymous")  # the scope of an anonymous request
    with server_connection() as holder:
        cursor = holder.cursor()
        cursor.execute("BEGIN")
        cursor.execute(f"SELECT id FROM {KEYS} WHERE id = %s FOR UPDATE", [held.pk])
        try:
            yield holder, held
        finally:
            holder.rollback()


@pytest.fixture
def short_lock_waits() -> Iterator[None]:
    """Django's connection to MariaDB waits one second for a row lock (50 by default)."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
    yield
    connections[ALIAS].close()


@pytest.mark.django_db(databases=["mariadb"], transaction=True)
def test_a_lock_wait_timeout_in_the_claim_is_retried(
    row_held: tuple[Any, ClaimResult], short_lock_waits: None
) -> None:
    """The claim's INSERT waits for the row another transaction holds, and times out: that
    rolled back nothing but the claim's own statement, which is sent again. Once the holder
    lets go, the claim gets its answer (the key is in progress)."""
    holder, _held = row_held
    release = threading.Timer(1.5, holder.rollback)  # after the first timeout (1 s)
    release.start()
    try:
        result = claim("held", scope="anonymous")
    finally:
        release.cancel()
        release.join()  # the holder's connection is the fixture's again
    assert result.state is ClaimState.IN_PROGRESS


@pytest.mark.urls("tests.support.faults")
@pytest.mark.django_db(databases=["mariadb"], transaction=True)
def test_a_claim_that_keeps_timing_out_is_a_503_transient_conflict(
    row_held: tuple[Any, ClaimResult], short_lock_waits: None
) -> None:
    """Five lock wait timeouts in a row: 503 transient-conflict with Retry-After, the view
    never ran, nothing changed; never a 500."""
    request = RequestFactory().post(
        "/fault/fn/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="held"
    )
    request.user = _anonymous()
    with override_settings(IDEMPOTENCY={"DATABASE": ALIAS}):
        strategies.reset()
        response = handle(request, lambda: _must_not_run())
    strategies.reset()
    assert_problem(response, 503, "transient-conflict")
    assert response.headers.get("Retry-After")
    assert SideEffect.objects.using(ALIAS).count() == 0


def _anonymous() -> Any:
    from django.contrib.auth.models import AnonymousUser

    return AnonymousUser()


def _must_not_run() -> Any:
    raise AssertionError("the view ran although the key was never claimed")


@pytest.mark.django_db(databases=["mariadb"], transaction=True)
def test_a_real_deadlock_is_transient() -> None:
    """Two transactions take two rows in opposite orders; InnoDB kills one with 1213,
    which is classified as a conflict a retry gets past (503 transient-conflict)."""
    first, second = claim("a"), claim("b")
    connection = connections[ALIAS]
    with server_connection() as other:
        cursor, other_id = other.cursor(), other.thread_id()
        cursor.execute("BEGIN")
        cursor.execute(f"UPDATE {KEYS} SET locked_at = locked_at WHERE id = %s", [second.pk])
        errors: list[BaseException] = []
        with transaction.atomic(using=ALIAS):
            with connection.cursor() as mine:
                mine.execute(f"UPDATE {KEYS} SET locked_at = locked_at WHERE id = %s", [first.pk])

            def cross() -> None:
                try:
                    cursor.execute(f"UPDATE {KEYS} SET fingerprint = 'x' WHERE id = %s", [first.pk])
                except Exception as exc:  # the deadlock, when InnoDB picks this one
                    errors.append(exc)

            waiting = threading.Thread(target=cross)
            waiting.start()
            _wait_for_lock_wait(other_id, waiting)
            assert waiting.is_alive(), f"the cross update ended before it waited: {errors}"
            try:
                with connection.cursor() as mine:
                    mine.execute(f"UPDATE {KEYS} SET fingerprint = 'y' WHERE id = %s", [second.pk])
            except OperationalError as exc:
                errors.append(exc)
            waiting.join(30)
        other.rollback()
    assert len(errors) == 1, errors
    error = errors[0]
    if isinstance(error, OperationalError):  # Django's, from mysqlclient's
        assert is_transient(error)
    else:
        assert error.args[0] == 1213


#: Seconds between two reads of ``INNODB_TRX``: more than its cache's 100 ms.
INNODB_TRX_POLL = 0.25


def _wait_for_lock_wait(waiter: int, thread: threading.Thread, timeout: float = 120.0) -> None:
    """Until the transaction of the connection whose thread id is ``waiter`` waits for a
    row lock (that one: the server is shared, another's lock wait says nothing), or
    ``thread``, which sent its statement, has ended (it failed instead of waiting: the
    caller tells why). ``timeout`` only tells a hang.

    Polled every quarter of a second: InnoDB refreshes what ``INNODB_TRX`` shows only
    when it has not been read for 100 ms (``CACHE_MIN_IDLE_TIME_US``), so polls closer
    than that read the first poll's copy forever, from before the wait began, while
    the wait runs into its 50 s timeout (1205): a script doing this test's steps met
    that 2 times in 4 at a 10 ms poll, and 0 times in 200 at 250 ms."""
    from ..support.waiting import wait_until

    with server_connection() as watcher:
        watcher.autocommit(True)  # each poll a statement of its own
        cursor = watcher.cursor()

        def waiting() -> bool:
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX "
                "WHERE trx_mysql_thread_id = %s AND trx_state = 'LOCK WAIT'",
                [waiter],
            )
            return bool(cursor.fetchone()[0])

        wait_until(lambda: waiting() or not thread.is_alive(), timeout, INNODB_TRX_POLL)


@pytest.mark.django_db(databases=["mariadb"], transaction=True)
def test_sixteen_threads_on_eight_keys_each_key_claimed_once() -> None:
    """Concurrent duplicate-key inserts next to each other in the unique index (gap and
    insert-intention locks): no error reaches the caller, each key has one winner."""
    results = run_at_once(16, lambda n: (n % 8, claim(f"gap-{n % 8}")))
    winners: dict[int, list[ClaimResult]] = {}
    for key, result in results:
        assert result.state in (ClaimState.CLAIMED, ClaimState.IN_PROGRESS), result
        if result.state is ClaimState.CLAIMED:
            winners.setdefault(key, []).append(result)
    assert sorted(winners) == list(range(8))
    assert all(len(won) == 1 for won in winners.values()), winners
    assert IdempotencyKey.objects.using(ALIAS).filter(key__startswith="gap-").count() == 8


# -- a connection killed under the claim -----------------------------------------------------


@pytest.mark.django_db(databases=["mariadb"], transaction=True)
def test_a_killed_connection_is_a_lost_connection() -> None:
    """KILL from another session: the next statement's error says the connection is gone
    (503 database-unavailable), and Django's next connection works."""
    connection = connections[ALIAS]
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (thread_id,) = cursor.fetchone()
    with server_connection() as admin:
        admin.cursor().execute(f"KILL CONNECTION {int(thread_id)}")
    with pytest.raises(OperationalError) as raised:
        claim("after-kill")
    assert is_connection_lost(raised.value, connection)
    connection.close()
    assert claim("after-kill").state is ClaimState.CLAIMED


# -- a server that hangs: mysqlclient's read_timeout (W017) ----------------------------------


@pytest.mark.django_db(databases=["mariadb"], transaction=True)
def test_a_claim_sent_into_a_silent_server_ends_at_the_read_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server falls silent, its socket open, while a claim waits (a proxy holds the
    traffic): with ``read_timeout`` in OPTIONS, as W017 asks, the claim fails as a lost
    connection, a 503 whose outcome is unknown, instead of waiting for ever (the test
    would hang); ``DATABASE_TIMEOUT`` does not cut connections on MariaDB. Once the path
    heals, Django connects again. The timeout (3 s a read, which mysqlclient tries three
    times) leaves a busy machine's answers through the proxy room to arrive."""
    database = connections[ALIAS].settings_dict
    monkeypatch.setitem(database, "OPTIONS", {**database.get("OPTIONS", {}), "read_timeout": 3})
    with through_proxy(ALIAS) as proxy:
        assert claim("before").state is ClaimState.CLAIMED  # connected while it answers
        proxy.silence()
        with pytest.raises(OperationalError) as raised:
            claim("silent")
        assert is_connection_lost(raised.value, connections[ALIAS])
        proxy.heal()
        connections[ALIAS].close()
    assert claim("after").state is ClaimState.CLAIMED


# -- REPEATABLE READ: why check E033 requires READ COMMITTED ---------------------------------


@pytest.mark.django_db(databases=["mariadb"], transaction=True)
@pytest.mark.parametrize(
    ("level", "expected"),
    [("READ COMMITTED", ClaimState.COMPLETED), ("REPEATABLE READ", ClaimState.IN_PROGRESS)],
)
def test_a_claim_in_a_transaction_sees_the_winner_under_read_committed_only(
    level: str, expected: ClaimState
) -> None:
    """The winner completes the key after the caller's transaction has read something; a
    claim of the key inside that transaction then reads the winner's row under READ
    COMMITTED (a replay) but its snapshot under REPEATABLE READ (the row seems to keep
    vanishing: 409 for a key that is done). Nothing runs twice either way, but the check
    refuses REPEATABLE READ."""
    connection = connections[ALIAS]
    with connection.cursor() as cursor:
        cursor.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {level}")

    def winner() -> None:
        try:
            won = claim("snapshot")
            assert won.pk is not None and won.token is not None
            assert IdempotencyKey.objects.complete(won.pk, won.token, RESPONSE, ttl=60, using=ALIAS)
        finally:
            connections[ALIAS].close()

    try:
        with transaction.atomic(using=ALIAS):
            SideEffect.objects.using(ALIAS).count()  # the transaction's snapshot, if any
            in_background(winner).result(30)
            result = claim("snapshot")
        assert result.state is expected
    finally:
        connection.close()  # the next connection is READ COMMITTED again (the settings')


# -- the outbox drain and the upserts MariaDB does not have ----------------------------------


@pytest.mark.django_db(databases=["mariadb"], transaction=True)
def test_the_drain_moves_outbox_rows_and_fences_a_running_claim() -> None:
    """A row of the outbox (the hybrid strategy's, written here through the ORM) is drained
    into IdempotencyKey with ON DUPLICATE KEY UPDATE: over a running claim of the same key,
    whose owner then finds its claim gone; two drainers at once move each row once."""
    now = timezone.now()
    running = claim("drained-over")
    rows = [
        IdempotencyOutbox(
            scope="user:1",
            key=key,
            fingerprint=PRINT,
            request_method="POST",
            request_path="/pay/",
            response_status=201,
            response_headers={"Content-Type": "application/json"},
            response_body=json.dumps({"key": key}).encode(),
            created_at=now,
            expires_at=now + timedelta(hours=1),
        )
        for key in ["drained-over", *(f"drained-{n}" for n in range(20))]
    ]
    IdempotencyOutbox.objects.using(ALIAS).bulk_create(rows)

    def drain(_: int) -> int:
        try:
            return IdempotencyOutbox.objects.drain(batch_size=5, using=ALIAS).drained
        finally:
            connections[ALIAS].close()

    drained = 0
    while IdempotencyOutbox.objects.pending(using=ALIAS):
        drained += sum(run_at_once(2, drain))
    assert drained == 21
    keys = IdempotencyKey.objects.using(ALIAS)
    assert keys.filter(key__startswith="drained").count() == 21
    assert set(keys.values_list("status", flat=True)) == {"completed"}
    replay = claim("drained-over")
    assert replay.state is ClaimState.COMPLETED
    assert replay.response is not None and json.loads(replay.response.body) == {
        "key": "drained-over"
    }
    assert running.pk is not None and running.token is not None
    assert not IdempotencyKey.objects.complete(
        running.pk, running.token, RESPONSE, ttl=60, using=ALIAS
    )


def test_the_upserts_of_advisory_lock_and_hybrid_say_they_are_not_here() -> None:
    with pytest.raises(NotSupportedError, match="advisory_lock"):
        IdempotencyKey.objects.store_completed("user:1", "k", PRINT, RESPONSE, ttl=60, using=ALIAS)
    with pytest.raises(NotSupportedError, match="hybrid"):
        IdempotencyOutbox.objects.add("user:1", "k", PRINT, RESPONSE, ttl=60, using=ALIAS)
    assert not IdempotencyKey.objects.using(ALIAS).exists()


def test_an_unknown_key_token_changes_nothing() -> None:
    """The fenced statements on MariaDB count matched rows (Django's FOUND_ROWS): a renewal
    that sets the same time still counts, a wrong token never does."""
    won = claim("fenced")
    assert won.pk is not None and won.token is not None
    manager = IdempotencyKey.objects
    assert manager.renew(won.pk, won.token, using=ALIAS)
    assert manager.renew(won.pk, won.token, using=ALIAS)
    assert not manager.renew(won.pk, uuid.uuid4(), using=ALIAS)
    assert not manager.complete(won.pk, uuid.uuid4(), RESPONSE, ttl=60, using=ALIAS)
    assert not manager.release(won.pk, uuid.uuid4(), using=ALIAS)
    assert manager.complete(won.pk, won.token, RESPONSE, ttl=60, using=ALIAS)


# -- the lease: a slow view keeps its key ---------------------------------------------------


@pytest.mark.urls("tests.support.faults")
@pytest.mark.django_db(databases=["mariadb"], transaction=True)
def test_a_view_slower_than_the_lock_timeout_keeps_its_key(settings: Any) -> None:
    """The heartbeat renews the lease on MariaDB (an UPDATE fenced by the token, whose row
    count Django's FOUND_ROWS makes the matched rows): a duplicate sent after LOCK_TIMEOUT,
    while the view still runs, gets 409 instead of taking the key over and running it again."""
    from django.test import Client

    from ..support import faults

    settings.IDEMPOTENCY = {"DATABASE": ALIAS, "LOCK_TIMEOUT": 1, "HEARTBEAT_INTERVAL": 0.2}
    strategies.reset()
    faults.reset()
    finish = threading.Event()

    def hold(key: str) -> None:  # the view runs until the test lets it finish
        finish.wait(30)

    faults.interference.append(hold)
    faults.plan.append("interfere")

    def send() -> Any:
        try:
            return Client().post(
                "/fault/fn/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="slow"
            )
        finally:
            connections.close_all()

    try:
        first = in_background(send)
        assert faults.view_started.wait(30), "the view never ran"
        running = IdempotencyKey.objects.using(ALIAS).get(key="slow")
        _wait_for_renewal(running.pk, after=running.locked_at, lock_timeout=1.0)
        during = send()
        finish.set()
        done = first.result(30)
        after = send()
    finally:
        finish.set()
        faults.reset()
        strategies.reset()
    assert during.status_code == 409
    assert done.status_code == 201 and not done.has_header("Idempotent-Replayed")
    assert after.status_code == 201 and after.has_header("Idempotent-Replayed")
    assert SideEffect.objects.using(ALIAS).filter(label="slow").count() == 1


def _wait_for_renewal(pk: int, *, after: Any, lock_timeout: float) -> None:
    """Until the lease has been renewed and the claim is older than ``lock_timeout`` (a
    claimant would take over a lease that was not renewed by now)."""
    from ..support.waiting import wait_until

    def renewed_past_the_timeout() -> bool:
        row = IdempotencyKey.objects.using(ALIAS).get(pk=pk)
        age = (timezone.now() - row.created_at).total_seconds()
        return row.locked_at is not None and row.locked_at > after and age > lock_timeout * 1.5

    wait_until(renewed_past_the_timeout, timeout=20)
