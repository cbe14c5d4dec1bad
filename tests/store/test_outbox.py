"""``IdempotencyOutbox.objects``: add, lookup and drain, on PostgreSQL and SQLite.

The concurrency of ``add`` (a second insert of a key waits for the first transaction)
is shown with two real connections on PostgreSQL; the drain (one statement per batch on
PostgreSQL) with several drainer threads at once and with a drainer process killed
mid-batch; with real Celery worker processes in ``test_tasks.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.records import ClaimState
from django_idempotency.store.status import COMPLETED, IN_PROGRESS

from ..support.factories import CompletedKeyFactory, IdempotencyKeyFactory
from ..support.threads import run_at_once
from ..support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

BACKENDS = [pytest.param("default", marks=pytest.mark.postgres, id="postgres"), "sqlite"]
RESPONSE = StoredResponse(201, {"Content-Type": "application/json"}, b'{"id": 1}')


def _add(using: str, key: str, fingerprint: str = "f" * 64, ttl: float = 60) -> bool:
    return IdempotencyOutbox.objects.add(
        "user:1", key, fingerprint, RESPONSE, ttl=ttl, method="POST", path="/x/", using=using
    )


@pytest.mark.parametrize("using", BACKENDS)
def test_add_refuses_a_live_row_and_replaces_an_expired_one(using: str) -> None:
    assert _add(using, "a")
    assert not _add(using, "a", fingerprint="0" * 64)
    assert IdempotencyOutbox.objects.using(using).get(key="a").fingerprint == "f" * 64
    IdempotencyOutbox.objects.using(using).filter(key="a").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert _add(using, "a", fingerprint="0" * 64)
    assert IdempotencyOutbox.objects.using(using).get(key="a").fingerprint == "0" * 64


@pytest.mark.postgres
@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
def test_a_second_add_waits_for_the_first_transaction(first_commits: bool) -> None:
    inside = threading.Event()
    results: dict[str, bool] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                results["first"] = _add("default", "k")
                inside.set()
                # Until the second insert waits for this transaction (pg_stat_activity shows it).
                wait_until(lambda: _lock_waiters() > 0, timeout=60)
                results["seen_waiting"] = True
                if not first_commits:
                    transaction.set_rollback(True)
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(60)
    try:
        results["second"] = _add("default", "k")
    finally:
        thread.join(60)
    assert results["first"] is True
    assert results.get("seen_waiting"), "the second insert waited for the first transaction"
    assert results["second"] is (not first_commits)
    assert IdempotencyOutbox.objects.filter(key="k").count() == 1


@pytest.mark.parametrize("using", BACKENDS)
def test_lookup_prefers_the_outbox_and_ignores_expired_rows(using: str) -> None:
    manager = IdempotencyOutbox.objects
    assert manager.lookup("user:1", "k", using=using) is None
    CompletedKeyFactory(_using=using, scope="user:1", key="k", response_body=b"old")
    found = manager.lookup("user:1", "k", using=using)
    assert found is not None and (found.source, found.response.body) == ("key", b"old")  # type: ignore[union-attr]
    assert manager.lookup("user:1", "k", using=using, outbox_only=True) is None
    assert _add(using, "k")
    found = manager.lookup("user:1", "k", using=using)
    assert found is not None and found.source == "outbox" and found.response == RESPONSE
    manager.using(using).update(expires_at=timezone.now() - timedelta(seconds=1))
    with CaptureQueriesContext(connections[using]) as queries:
        assert manager.lookup("user:1", "k", using=using).source == "key"  # type: ignore[union-attr]
        assert manager.lookup("user:1", "missing", using=using) is None
    assert len(queries) == 2, "one statement per lookup"


@pytest.mark.parametrize("using", BACKENDS)
def test_drain_moves_rows_in_batches_and_fences_db_claims(using: str) -> None:
    keys = [uuid.uuid4().hex for _ in range(25)]
    for key in keys:
        assert _add(using, key)
    assert _add(using, "expired", ttl=60)
    IdempotencyOutbox.objects.using(using).filter(key="expired").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    # A db claim of the first key is still running; a completed row of the second exists.
    claim = IdempotencyKeyFactory(_using=using, scope="user:1", key=keys[0])
    CompletedKeyFactory(_using=using, scope="user:1", key=keys[1], response_body=b"stale")

    results = []
    while True:
        result = IdempotencyOutbox.objects.drain(10, using=using)
        if not result.rows:
            break
        results.append((result.drained, result.discarded))
    assert sum(d for d, _ in results) == 25 and sum(x for _, x in results) == 1
    assert [d + x for d, x in results] == [10, 10, 6]
    assert IdempotencyOutbox.objects.using(using).count() == 0
    rows = IdempotencyKey.objects.using(using)
    assert rows.count() == 25 and not rows.filter(key="expired").exists()
    assert set(rows.values_list("status", flat=True)) == {COMPLETED}
    body = rows.get(key=keys[1]).response_body
    assert body is not None and bytes(body) == RESPONSE.body
    # The running claim was fenced: its owner can no longer complete it.
    assert not IdempotencyKey.objects.complete(
        claim.pk, claim.claim_token, RESPONSE, ttl=60, using=using
    )
    assert not rows.filter(status=IN_PROGRESS).exists()


@pytest.mark.parametrize("using", BACKENDS)
def test_drain_holds_a_young_short_batch(using: str) -> None:
    hold = timedelta(seconds=30)
    for index in range(15):
        assert _add(using, f"k{index}")
    manager = IdempotencyOutbox.objects
    assert manager.drain(10, using=using, hold_partial=hold).drained == 10  # a full batch
    assert manager.drain(10, using=using, hold_partial=hold).held == 5  # short and young
    assert manager.using(using).count() == 5
    manager.using(using).update(created_at=timezone.now() - timedelta(seconds=31))
    assert manager.drain(10, using=using, hold_partial=hold).drained == 5  # old enough
    assert IdempotencyKey.objects.using(using).count() == 15


# -- a claim of a key that is still in the outbox (switching from hybrid) ---------------------


def _claim(using: str, key: str, fingerprint: str = "f" * 64) -> Any:
    return IdempotencyKey.objects.claim(
        "user:1", key, fingerprint, ttl=60, lock_timeout=30, using=using
    )


@pytest.mark.parametrize("using", BACKENDS)
def test_claim_replays_an_undrained_outbox_row_in_one_statement_pair(using: str) -> None:
    assert _add(using, "k")
    with CaptureQueriesContext(connections[using]) as queries:
        result = _claim(using, "k")
    assert result.state is ClaimState.COMPLETED and result.response == RESPONSE
    assert len(queries) == 2, "the claim's INSERT, then one read"
    assert not IdempotencyKey.objects.using(using).filter(key="k").exists()
    mismatch = _claim(using, "k", fingerprint="0" * 64)
    assert mismatch.state is ClaimState.MISMATCH and mismatch.response is None
    assert not IdempotencyKey.objects.using(using).filter(key="k").exists()


@pytest.mark.parametrize("using", BACKENDS)
def test_a_new_key_is_still_claimed_in_one_statement(using: str) -> None:
    with CaptureQueriesContext(connections[using]) as queries:
        result = _claim(using, "new")
    assert result.state is ClaimState.CLAIMED and len(queries) == 1
    assert IdempotencyOutbox.objects.using(using).count() == 0


@pytest.mark.parametrize("using", BACKENDS)
@pytest.mark.parametrize("row", ["expired", "stale"])
def test_an_outbox_row_beats_a_key_row_that_could_be_taken_over(using: str, row: str) -> None:
    """The key's IdempotencyKey row is expired (or a stale claim), but the outbox holds a
    newer completion that was not drained yet: that is replayed, nothing is taken over."""
    if row == "expired":
        old = CompletedKeyFactory(
            _using=using,
            scope="user:1",
            key="k",
            expires_at=timezone.now() - timedelta(seconds=5),
        )
    else:
        old = IdempotencyKeyFactory(
            _using=using,
            scope="user:1",
            key="k",
            locked_at=timezone.now() - timedelta(hours=1),
        )
    assert _add(using, "k")
    result = _claim(using, "k")
    assert result.state is ClaimState.COMPLETED and result.response == RESPONSE
    assert IdempotencyKey.objects.using(using).get(pk=old.pk).claim_token == old.claim_token
    # The takeover statement itself refuses while the outbox row is live ...
    assert not IdempotencyKey.objects._take_over(
        old.pk,
        old.claim_token,
        uuid.uuid4(),
        "f" * 64,
        ttl=60,
        lock_timeout=30,
        method="POST",
        path="/",
        using=using,
    )
    # ... and takes the row over once the outbox row has expired.
    IdempotencyOutbox.objects.using(using).update(expires_at=timezone.now() - timedelta(seconds=1))
    taken = _claim(using, "k")
    assert taken.state is ClaimState.CLAIMED and taken.taken_over and taken.pk == old.pk


@pytest.mark.parametrize("using", BACKENDS)
def test_an_expired_outbox_row_does_not_block_a_claim(using: str) -> None:
    assert _add(using, "k")
    IdempotencyOutbox.objects.using(using).update(expires_at=timezone.now() - timedelta(seconds=1))
    result = _claim(using, "k")
    assert result.state is ClaimState.CLAIMED and not result.taken_over


@pytest.mark.parametrize("using", BACKENDS)
def test_read_returns_a_live_outbox_row_as_a_completed_key(using: str) -> None:
    """``read`` (the advisory_lock strategy's) sees an undrained outbox row first."""
    CompletedKeyFactory(
        _using=using, scope="user:1", key="k", expires_at=timezone.now() - timedelta(seconds=5)
    )
    assert _add(using, "k")
    with CaptureQueriesContext(connections[using]) as queries:
        found = IdempotencyKey.objects.read("user:1", "k", using=using)
    assert len(queries) == 1
    assert found is not None and found.from_outbox and found.status == COMPLETED
    assert (found.response_status, found.response_body) == (RESPONSE.status, RESPONSE.body)
    assert found.response_headers == RESPONSE.headers and found.fingerprint == "f" * 64
    IdempotencyOutbox.objects.using(using).update(expires_at=timezone.now() - timedelta(seconds=1))
    found = IdempotencyKey.objects.read("user:1", "k", using=using)
    assert found is not None and not found.from_outbox


# -- fence_stale_claim (the hybrid strategy's check before it commits) ------------------------


@pytest.mark.parametrize("using", BACKENDS)
def test_fence_stale_claim(using: str) -> None:
    manager = IdempotencyKey.objects

    def free(key: str) -> bool:
        return manager.fence_stale_claim("user:1", key, lock_timeout=30, using=using)

    assert free("absent")
    CompletedKeyFactory(_using=using, scope="user:1", key="done")
    assert not free("done")
    CompletedKeyFactory(
        _using=using, scope="user:1", key="old", expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert free("old")
    IdempotencyKeyFactory(_using=using, scope="user:1", key="running")
    assert not free("running")
    # A running claim past its TTL is still governed by its lease.
    IdempotencyKeyFactory(
        _using=using,
        scope="user:1",
        key="long",
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    assert not free("long")
    stale = IdempotencyKeyFactory(
        _using=using, scope="user:1", key="dead", locked_at=timezone.now() - timedelta(minutes=5)
    )
    assert free("dead")
    assert not manager.using(using).filter(pk=stale.pk).exists()  # deleted: its owner is fenced
    assert set(manager.using(using).values_list("key", flat=True)) == {
        "done",
        "old",
        "running",
        "long",
    }


# -- add(fence_lock_timeout=...): the hybrid strategy's outbox row with its commit guard -----


def _add_fenced(using: str, key: str) -> bool:
    return IdempotencyOutbox.objects.add(
        "user:1", key, "f" * 64, RESPONSE, ttl=60, fence_lock_timeout=30, method="POST", using=using
    )


@pytest.mark.parametrize("using", BACKENDS)
def test_add_fenced_inserts_only_where_no_live_key_row_is(using: str) -> None:
    manager = IdempotencyKey.objects
    outbox = IdempotencyOutbox.objects.using(using)
    CompletedKeyFactory(_using=using, scope="user:1", key="done")
    CompletedKeyFactory(
        _using=using, scope="user:1", key="old", expires_at=timezone.now() - timedelta(seconds=1)
    )
    IdempotencyKeyFactory(_using=using, scope="user:1", key="running")
    IdempotencyKeyFactory(
        _using=using, scope="user:1", key="long", expires_at=timezone.now() - timedelta(seconds=1)
    )
    stale = IdempotencyKeyFactory(
        _using=using, scope="user:1", key="dead", locked_at=timezone.now() - timedelta(minutes=5)
    )
    assert _add_fenced(using, "absent")
    assert not _add_fenced(using, "done")
    assert _add_fenced(using, "old")  # an expired completed row: the drain replaces it
    assert not _add_fenced(using, "running")
    assert not _add_fenced(using, "long")  # a running claim past its TTL holds by its lease
    assert _add_fenced(using, "dead")
    assert not manager.using(using).filter(pk=stale.pk).exists()  # deleted: its owner is fenced
    assert set(outbox.values_list("key", flat=True)) == {"absent", "old", "dead"}
    assert not _add_fenced(using, "absent")  # a live outbox row wins
    assert set(manager.using(using).values_list("key", flat=True)) == {
        "done",
        "old",
        "running",
        "long",
    }


@pytest.mark.postgres
def test_add_fenced_is_one_statement_on_postgres() -> None:
    IdempotencyKeyFactory(
        scope="user:1", key="dead", locked_at=timezone.now() - timedelta(minutes=5)
    )
    with CaptureQueriesContext(connections["default"]) as queries:
        assert _add_fenced("default", "dead")
        assert not _add_fenced("default", "dead")
    assert len(queries) == 2


@pytest.mark.postgres
def test_add_fenced_keeps_a_stale_claim_renewed_while_it_waits() -> None:
    """The claim is renewed in a transaction that commits while the fenced insert waits
    for its row lock: the DELETE re-checks the row's newest version, finds the lease live
    and deletes nothing, and the insert is refused, though the statement's snapshot saw
    the lease stale."""
    stale = IdempotencyKeyFactory(
        scope="user:1", key="race", locked_at=timezone.now() - timedelta(minutes=5)
    )
    renewing = threading.Event()
    result: list[bool] = []

    def fence() -> None:
        try:
            renewing.wait(10)
            with transaction.atomic():
                result.append(_add_fenced("default", "race"))
        finally:
            connections.close_all()

    worker = threading.Thread(target=fence)
    worker.start()
    with transaction.atomic():
        IdempotencyKey.objects.filter(pk=stale.pk).update(locked_at=timezone.now())
        renewing.set()
        # The worker's DELETE is now waiting for this row (pg_stat_activity shows it).
        wait_until(lambda: _lock_waiters() > 0, timeout=60)
    worker.join(60)
    assert result == [False]
    assert IdempotencyKey.objects.filter(pk=stale.pk).exists()
    assert not IdempotencyOutbox.objects.filter(key="race").exists()


# -- the drain as one statement (PostgreSQL) and what it does over existing key rows ---------


@pytest.mark.parametrize("using", BACKENDS)
def test_drain_overwrites_every_kind_of_key_row_alike(using: str) -> None:
    """What a key row already holds does not change what the drain writes, on the one
    statement (PostgreSQL) as on the ORM path (SQLite): a ``db`` claim still running (the
    fallback's), a live completed row with another fingerprint and an expired one are all
    replaced by the outbox row, as a completed key with a fresh claim token; the row's id
    is kept."""
    existing = {
        "running": IdempotencyKeyFactory(_using=using, scope="user:1", key="running"),
        "other": CompletedKeyFactory(
            _using=using, scope="user:1", key="other", fingerprint="0" * 64, response_body=b"x"
        ),
        "old": CompletedKeyFactory(
            _using=using,
            scope="user:1",
            key="old",
            expires_at=timezone.now() - timedelta(seconds=5),
        ),
    }
    for key in [*existing, "new"]:
        assert _add(using, key)
    outbox = {row.key: row for row in IdempotencyOutbox.objects.using(using)}
    result = IdempotencyOutbox.objects.drain(10, using=using)
    assert (result.drained, result.discarded, result.held) == (4, 0, 0)
    rows = {row.key: row for row in IdempotencyKey.objects.using(using)}
    assert set(rows) == {"running", "other", "old", "new"}
    for key, row in rows.items():
        source = outbox[key]
        assert (row.status, row.locked_at, row.fingerprint) == (COMPLETED, None, "f" * 64)
        assert (row.response_status, row.response_headers) == (201, RESPONSE.headers)
        assert bytes(row.response_body or b"") == RESPONSE.body
        assert (row.request_method, row.request_path) == ("POST", "/x/")
        assert row.created_at == row.completed_at == source.created_at
        assert row.expires_at == source.expires_at
        if key in existing:
            assert row.pk == existing[key].pk
            assert row.claim_token != existing[key].claim_token
    assert len({row.claim_token for row in rows.values()}) == 4


@pytest.mark.parametrize("using", BACKENDS)
def test_an_expired_outbox_row_is_drained_without_the_newer_row_of_its_key(using: str) -> None:
    """An outbox row that expired before it was drained, and a newer record of its key
    written since (another strategy's, after a switch): the outbox row is only deleted."""
    assert _add(using, "switched")
    IdempotencyOutbox.objects.using(using).update(expires_at=timezone.now() - timedelta(seconds=1))
    newer = CompletedKeyFactory(_using=using, scope="user:1", key="switched", response_body=b"2")
    result = IdempotencyOutbox.objects.drain(10, using=using)
    assert (result.drained, result.discarded) == (0, 1)
    row = IdempotencyKey.objects.using(using).get(key="switched")
    assert (row.pk, row.claim_token, bytes(row.response_body or b"")) == (
        newer.pk,
        newer.claim_token,
        b"2",
    )


@pytest.mark.postgres
def test_the_drain_does_not_overwrite_a_record_made_after_the_response_expired() -> None:
    """A key row created at or after the outbox response's expiry is a newer record (the
    key could be claimed only once the response had expired). The drain's statement judges
    the response live when it starts; a claim committed while the statement waits for the
    key's row (the response expiring in between) is such a row: the upsert leaves it. Here
    the row is placed with that ``created_at`` while the response is still live."""
    assert _add("default", "later", ttl=60)
    response = IdempotencyOutbox.objects.get(key="later")
    newer = CompletedKeyFactory(
        _using="default",
        scope="user:1",
        key="later",
        response_body=b"2",
        created_at=response.expires_at,
        expires_at=response.expires_at + timedelta(seconds=30),
    )
    result = IdempotencyOutbox.objects.drain(10, using="default")
    assert (result.drained, result.discarded) == (0, 1)
    assert not IdempotencyOutbox.objects.exists()
    row = IdempotencyKey.objects.get(key="later")
    assert (row.claim_token, bytes(row.response_body or b"")) == (newer.claim_token, b"2")


@pytest.mark.postgres
@pytest.mark.parametrize("hold", [None, timedelta(seconds=30)], ids=["plain", "hold"])
def test_a_drain_batch_is_one_statement_on_postgres(hold: timedelta | None) -> None:
    for index in range(30):
        assert _add("default", f"k{index}")
    with CaptureQueriesContext(connections["default"]) as queries:
        result = IdempotencyOutbox.objects.drain(20, using="default", hold_partial=hold)
    assert result.drained == 20
    assert len(queries) == 1, [q["sql"][:60] for q in queries.captured_queries]
    assert IdempotencyOutbox.objects.count() == 10


@pytest.mark.postgres
def test_a_drainer_skips_the_batch_another_one_holds() -> None:
    """SKIP LOCKED: while one drainer's transaction holds its batch, a second drainer takes
    the next rows at once, without waiting and without touching the first one's; when the
    first rolls back, its rows are there to be drained again."""
    for index in range(30):
        assert _add("default", f"k{index:02d}")
    holding = threading.Event()
    release = threading.Event()

    def first() -> None:
        try:
            with transaction.atomic():
                assert IdempotencyOutbox.objects.drain(10, using="default").drained == 10
                holding.set()
                assert release.wait(30)
                transaction.set_rollback(True)
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert holding.wait(30)
        started = time.monotonic()
        second = IdempotencyOutbox.objects.drain(100, using="default")
        waited = time.monotonic() - started
        done = set(IdempotencyKey.objects.values_list("key", flat=True))
    finally:
        release.set()
        thread.join(30)
    assert second.drained == 20 and waited < 5
    assert done == {f"k{index:02d}" for index in range(10, 30)}, "the first batch was skipped"
    assert IdempotencyOutbox.objects.count() == 10  # the first batch rolled back
    assert IdempotencyOutbox.objects.drain(100, using="default").drained == 10
    assert IdempotencyKey.objects.count() == 30


@pytest.mark.postgres
def test_parallel_drainers_move_every_row_exactly_once() -> None:
    """Four threads, each with its own connection, drain one outbox at once in small
    batches: every row becomes a key with its own response, none twice, and the row
    counts the drainers report add up to the outbox's."""
    total = 4000
    IdempotencyOutbox.objects.bulk_create(
        [
            IdempotencyOutbox(
                scope="user:1",
                key=f"p{index:05d}",
                fingerprint=f"{index:064x}",
                request_method="POST",
                request_path="/x/",
                response_status=201,
                response_headers={},
                response_body=f"body {index}".encode(),
                expires_at=timezone.now() + timedelta(hours=1),
            )
            for index in range(total)
        ]
    )

    def drain(_: int) -> list[int]:
        moved = []
        while (result := IdempotencyOutbox.objects.drain(50, using="default")).rows:
            moved.append(result.drained)
        return moved

    batches = run_at_once(4, drain)
    assert sum(sum(each) for each in batches) == total
    assert sum(1 for each in batches if each) >= 2, "more than one drainer took batches"
    assert IdempotencyOutbox.objects.count() == 0
    rows = dict(IdempotencyKey.objects.values_list("key", "response_body"))
    assert len(rows) == total == IdempotencyKey.objects.count()
    assert all(bytes(rows[f"p{i:05d}"] or b"") == f"body {i}".encode() for i in range(total))


#: A drainer process: it drains one batch in a transaction, says so, and waits to be killed.
_DRAINER = """
import signal, sys, django
django.setup()
from django.db import transaction
from django_idempotency.models import IdempotencyOutbox
with transaction.atomic():
    print(IdempotencyOutbox.objects.drain(int(sys.argv[1])).drained, flush=True)
    signal.pause()  # until killed
"""


@pytest.mark.postgres
def test_a_drainer_killed_mid_batch_loses_nothing() -> None:
    """A real process drains a batch (the statement has run: the rows are deleted and the
    keys written in its transaction) and is killed with SIGKILL before it commits: every
    row is still in the outbox, no key was written, and the next drain moves them all."""
    for index in range(300):
        assert _add("default", f"k{index:03d}")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TEST_DATABASE_NAME": str(connections["default"].settings_dict["NAME"]),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    drainer = subprocess.Popen(
        [sys.executable, "-c", _DRAINER, "200"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert drainer.stdout is not None
        assert drainer.stdout.readline().strip() == "200", "the batch was drained, uncommitted"
        # Another drainer skips the batch the doomed one holds.
        assert IdempotencyOutbox.objects.drain(1000).drained == 100
    finally:
        drainer.kill()
        drainer.wait(30)
    assert IdempotencyOutbox.objects.count() == 200
    assert IdempotencyKey.objects.count() == 100
    # The rows are skipped until the server has ended the killed backend (rolled back).
    moved = [0]

    def drained_all() -> bool:
        moved[0] += IdempotencyOutbox.objects.drain(1000).drained
        return not IdempotencyOutbox.objects.exists()

    wait_until(drained_all, timeout=120)
    assert moved[0] == 200
    assert IdempotencyKey.objects.count() == 300 and IdempotencyOutbox.objects.count() == 0


def _lock_waiters() -> int:
    """Sessions on the test database that wait for a lock (other databases' are others')."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # fresh, inside a transaction too
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])
