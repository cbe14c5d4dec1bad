"""The key table partitioned by expiry, on the real PostgreSQL server: the conversion and
back, partitions created ahead and dropped whole, and the one guarantee that must not move,
one claim per key, raced by real threads across partition boundaries.

Partitions here are two seconds wide, so that a key's claims straddle boundaries within a
test; the fixture converts the test database's table and makes it plain again after. No
test waits for a boundary to pass: a partition that has ended is attached in the past
(``past_partition``), a row is moved there (or its times moved back) by an ``UPDATE``, and
the partitions are made to reach well past the longest expiry a test writes. A test that
waits for another backend to block waits for PostgreSQL to say so (``_waiting``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connections
from django.db.models import F
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store import partitions
from django_idempotency.store.records import ClaimResult, ClaimState
from django_idempotency.store.sql.statements import statements

from ..support.partitions import AHEAD, INTERVAL, partitioned_table, past_partition
from ..support.partitions import SMALL as SETTINGS
from ..support.threads import in_background, run_at_once
from ..support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["default"], transaction=True)]

PRINT = "a" * 64
OTHER_PRINT = "b" * 64
RESPONSE = StoredResponse(status=201, headers={"Content-Type": "text/plain"}, body=b"done")


@pytest.fixture
def partitioned() -> Iterator[None]:
    """The test database's key table partitioned into two-second ranges; plain again after."""
    with partitioned_table():
        yield


def claim(key: str, fingerprint: str = PRINT, **options: Any) -> ClaimResult:
    kwargs: dict[str, Any] = {"ttl": 10, "lock_timeout": 5, "using": "default"}
    kwargs.update(options)
    return IdempotencyKey.objects.claim("user:1", key, fingerprint, **kwargs)


def racer(key: str) -> Callable[[int], ClaimResult]:
    """Racer ``i`` claims ``key`` with a TTL ``i`` partitions longer than racer 0's."""

    def work(i: int) -> ClaimResult:
        return claim(key, ttl=10 + INTERVAL * i)

    return work


#: Seconds the partitions reach past the longest expiry a test writes, at its start or at
#: each round: however slow the machine, no row falls past the last partition.
MARGIN = 120


def reach(longest_ttl: float) -> None:
    """Partitions created until ``MARGIN`` seconds past an expiry ``longest_ttl`` from now
    (the database's clock; ``maintain`` reaches ``max(TTL, LOCK_TIMEOUT)`` plus ``ahead``)."""
    partitions.maintain("default", ahead=max(longest_ttl - 10, 0) + MARGIN)


def race(n: int, key: str) -> list[ClaimResult]:
    """``n`` racers of ``key`` at once (:func:`racer`), the partitions reaching past the
    longest racer's expiry first."""
    reach(10 + INTERVAL * (n - 1))
    return run_at_once(n, racer(key))


def db_now() -> Any:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def earlier(seconds: float, *pks: int | None) -> None:
    """The rows ``pks`` as they would be ``seconds`` later: their claim, lease and expiry
    moved back (an expiry into an earlier partition), instead of a wait."""
    back = timedelta(seconds=seconds)
    IdempotencyKey.objects.filter(pk__in=[pk for pk in pks if pk is not None]).update(
        created_at=F("created_at") - back,
        locked_at=F("locked_at") - back,
        expires_at=F("expires_at") - back,
    )


def _waiting(pattern: str) -> int:
    """Backends of the test database, other than this one, that wait for a lock while
    running a query like ``pattern`` (``ILIKE``). Read afresh inside a transaction too
    (where PostgreSQL would show the snapshot of the statistics it first read)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND datname = current_database() AND wait_event_type = 'Lock' "
            "AND query ILIKE %s",
            [pattern],
        )
        return int(cursor.fetchone()[0])


def rows(key: str) -> int:
    return IdempotencyKey.objects.filter(scope="user:1", key=key).count()


def fillfactors() -> dict[str, list[str] | None]:
    """The storage options of the key table, or of each of its partitions."""
    table = IdempotencyKey._meta.db_table
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.reloptions FROM pg_class c WHERE c.oid = to_regclass(%s) "
            "AND c.relkind = 'r' UNION ALL SELECT c.relname, c.reloptions FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [table, table],
        )
        return dict(cursor.fetchall())


def test_every_partition_leaves_room_for_a_hot_completion(partitioned: None) -> None:
    """Each partition keeps a fifth of its pages free (fillfactor 80, as migration 0004 sets
    on the plain table), those created ahead too, and a completion in a partition that keeps
    its key's expiry is a HOT update: the row stays on its page and no index gets an entry.

    The expiry is kept only when the completion comes within 1 % of the TTL of the claim
    (``EXPIRY_SLACK``: 0.1 s of this test's 10 s), which a busy machine may miss; a
    completion that moved its expiry changed an indexed column and is rightly not HOT. So
    the test takes new keys until one completion kept its expiry (at most 50 tries), and
    holds that one to its partition and to a HOT update."""
    created = partitions.maintain("default", ahead=AHEAD * 2).created
    found = fillfactors()
    assert created and set(created) <= set(found)
    assert found and all(options == ["fillfactor=80"] for options in found.values()), found
    for attempt in range(50):
        done = claim(f"hot-{attempt}")
        assert done.pk is not None and done.token is not None
        partition = partition_of(done.pk)
        claimed_expiry = IdempotencyKey.objects.get(pk=done.pk).expires_at
        before = updates_of(partition)
        assert IdempotencyKey.objects.complete(done.pk, done.token, RESPONSE, ttl=10)
        if IdempotencyKey.objects.get(pk=done.pk).expires_at == claimed_expiry:
            # The expiry kept, the partition with it (a completion that moved its expiry
            # may rightly have moved its row into the next two-second partition).
            assert partition_of(done.pk) == partition
            break
    else:
        pytest.fail("no completion in 50 came within 1 % of its TTL of its claim")
    (updated, hot), (updated_before, hot_before) = updates_of(partition), before
    assert updated - updated_before == 1 and hot - hot_before == 1


def updates_of(partition: str) -> tuple[int, int]:
    """The updates of ``partition`` so far, and how many of them were HOT, this backend's
    own counted too."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s",
            [partition],
        )
        updated, hot = cursor.fetchone()
    return int(updated), int(hot)


def partition_of(pk: int | None) -> str:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {IdempotencyKey._meta.db_table} WHERE id = %s",
            [pk],
        )
        return str(cursor.fetchone()[0])


# -- the conversion ------------------------------------------------------------------------------


def test_the_conversion_makes_a_partitioned_table_and_the_statements_follow(
    partitioned: None,
) -> None:
    connection = connections["default"]
    assert partitions.is_partitioned(connection)
    assert statements(connection).partitioned
    found = partitions.partitions(connection)
    assert len(found) >= (10 + AHEAD) // INTERVAL
    assert all(p.upper - p.lower <= timedelta(seconds=INTERVAL) for p in found)
    assert [p.upper for p in found[:-1]] == [p.lower for p in found[1:]]  # contiguous
    first = claim("k1")
    assert first.state is ClaimState.CLAIMED
    assert partition_of(first.pk).startswith("django_idempotency_idempotencykey_p")


def test_converting_twice_is_a_no_op_and_undo_restores_the_plain_table(partitioned: None) -> None:
    assert partitions.convert("default", ahead=AHEAD) is False
    done = claim("kept")
    assert done.pk is not None and done.token is not None
    assert IdempotencyKey.objects.complete(done.pk, done.token, RESPONSE, ttl=10)
    assert partitions.undo("default") is True
    assert partitions.undo("default") is False
    connection = connections["default"]
    assert not partitions.is_partitioned(connection)
    assert fillfactors() == {IdempotencyKey._meta.db_table: ["fillfactor=80"]}
    with override_settings(IDEMPOTENCY={**SETTINGS, "PARTITION_INTERVAL": None}):
        assert claim("kept").response == RESPONSE  # the plain statements, the row kept
        with pytest.raises(IntegrityError):  # (scope, key) unique again
            IdempotencyKey.objects.create(
                scope="user:1",
                key="kept",
                fingerprint=PRINT,
                status="completed",
                claim_token=uuid.uuid4(),
                expires_at=timezone.now() + timedelta(hours=1),
            )
    assert partitions.convert("default", ahead=AHEAD) is True  # for the fixture's undo


def test_the_conversion_keeps_the_live_rows_and_their_replays() -> None:
    if connections["default"].vendor != "postgresql":
        pytest.skip("time partitions are PostgreSQL's")
    with override_settings(IDEMPOTENCY={**SETTINGS, "PARTITION_INTERVAL": None}):
        done = claim("replayed")
        assert done.pk is not None and done.token is not None
        assert IdempotencyKey.objects.complete(done.pk, done.token, RESPONSE, ttl=10)
        running = claim("running")
        gone = claim("expired")
        assert running.pk is not None and gone.pk is not None
        IdempotencyKey.objects.filter(pk=gone.pk).update(
            status="completed", expires_at=timezone.now() - timedelta(seconds=1)
        )
        IdempotencyKey.objects.filter(pk=running.pk).update(  # past its TTL, lease live
            expires_at=timezone.now() - timedelta(seconds=1)
        )
        left = claim("left")  # given back with a step done, its TTL and lease long over
        assert left.pk is not None
        IdempotencyKey.objects.filter(pk=left.pk).update(
            recovery_point="create",
            steps={"fingerprint": PRINT, "done": [{"name": "create", "kind": "local"}]},
            expires_at=timezone.now() - timedelta(days=1),
            locked_at=timezone.now() - timedelta(days=1),
        )
    with override_settings(IDEMPOTENCY=SETTINGS):
        assert partitions.convert("default", ahead=AHEAD) is True
        try:
            assert claim("replayed").response == RESPONSE
            assert claim("running").state is ClaimState.IN_PROGRESS
            assert rows("expired") == 0
            # Kept, as the purge keeps it (still expired): its retry resumes it.
            assert IdempotencyKey.objects.get(key="left").recovery_point == "create"
            assert IdempotencyKey.objects.unfinished().filter(key="left").exists()
            kept = IdempotencyKey.objects.get(key="running")
            assert kept.expires_at > timezone.now()  # a lease ahead: no partition drops it
            assert claim("new").state is ClaimState.CLAIMED
            assert IdempotencyKey.objects.get(key="new").pk > kept.pk  # identity continues
        finally:
            partitions.undo("default")


# -- one claim per key across partitions ---------------------------------------------------------


def test_racers_whose_expiries_fall_in_different_partitions_claim_once(partitioned: None) -> None:
    """Sixteen threads claim one key, each with its own TTL, two seconds apart: every racer
    would insert into another partition, where no unique index sees the others. Twenty
    rounds; each has exactly one winner and one row."""
    for round_ in range(20):
        key = f"race-{round_}"
        results = race(16, key)
        states = [r.state for r in results]
        assert states.count(ClaimState.CLAIMED) == 1, (round_, states)
        assert states.count(ClaimState.IN_PROGRESS) == 15, (round_, states)
        assert rows(key) == 1, round_


def test_racers_taking_over_a_stale_claim_across_partitions_win_once(partitioned: None) -> None:
    for round_ in range(10):
        key = f"stale-{round_}"
        old = claim(key)
        assert old.pk is not None
        IdempotencyKey.objects.filter(pk=old.pk).update(
            locked_at=timezone.now() - timedelta(seconds=6)
        )
        results = race(8, key)
        winners = [r for r in results if r.state is ClaimState.CLAIMED]
        assert len(winners) == 1, (round_, [r.state for r in results])
        assert winners[0].taken_over and winners[0].pk != old.pk  # a new row
        assert rows(key) == 1
        assert IdempotencyKey.objects.get(key=key).claim_token == winners[0].token
        assert old.token is not None
        assert not IdempotencyKey.objects.complete(old.pk, old.token, RESPONSE, ttl=10)


def test_a_key_claimed_in_one_partition_is_settled_when_now_is_in_the_next(
    partitioned: None,
) -> None:
    """Two keys claimed with a two-second TTL and a 30 s lease, then two partitions later
    (their times moved back, not waited for): the running one is still in progress, the
    other is completed into a later partition and replayed."""
    lease: dict[str, Any] = {"lock_timeout": 30}
    done = claim("settled", ttl=INTERVAL, **lease)
    running = claim("running", ttl=INTERVAL, **lease)
    assert done.pk is not None and done.token is not None
    earlier(2 * INTERVAL, done.pk, running.pk)  # now is past their TTL (2 s)
    first_partition = partition_of(done.pk)
    assert partition_of(running.pk) == first_partition
    # In progress under a live lease: a 409 however old its TTL.
    assert claim("running", ttl=INTERVAL, **lease).state is ClaimState.IN_PROGRESS
    assert claim("running", OTHER_PRINT, **lease).state is ClaimState.MISMATCH
    # Completed now: its TTL counts from the completion, into a later partition.
    assert IdempotencyKey.objects.complete(done.pk, done.token, RESPONSE, ttl=10)
    assert partition_of(done.pk) != first_partition
    replay = claim("settled")
    assert replay.state is ClaimState.COMPLETED and replay.response == RESPONSE
    assert claim("settled", OTHER_PRINT).state is ClaimState.MISMATCH
    assert rows("settled") == 1


def test_a_renewal_keeps_a_running_key_a_lease_ahead_of_its_ttl(partitioned: None) -> None:
    running = claim("long", ttl=1)  # the claim's expiry is a lease (5 s) ahead at least
    assert running.pk is not None and running.token is not None
    row = IdempotencyKey.objects.get(pk=running.pk)
    assert row.locked_at is not None
    assert row.expires_at >= row.locked_at + timedelta(seconds=5)
    earlier(1, running.pk)  # a second later
    row = IdempotencyKey.objects.get(pk=running.pk)
    assert IdempotencyKey.objects.renew(running.pk, running.token, lock_timeout=5)
    renewed = IdempotencyKey.objects.get(pk=running.pk)
    assert renewed.locked_at is not None
    assert renewed.expires_at >= renewed.locked_at + timedelta(seconds=5)
    assert renewed.expires_at > row.expires_at


def test_advisory_locks_completed_record_replaces_only_an_expired_one(partitioned: None) -> None:
    manager = IdempotencyKey.objects
    assert manager.store_completed("user:1", "adv", PRINT, RESPONSE, ttl=INTERVAL)
    assert not manager.store_completed("user:1", "adv", PRINT, RESPONSE, ttl=10)  # live
    IdempotencyKey.objects.filter(key="adv").update(expires_at=timezone.now())
    assert manager.store_completed("user:1", "adv", OTHER_PRINT, RESPONSE, ttl=10)
    assert rows("adv") == 1
    assert IdempotencyKey.objects.get(key="adv").fingerprint == OTHER_PRINT


def test_a_claim_whose_expiry_has_no_partition_fails_and_says_so(
    partitioned: None, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(IntegrityError):
        claim("far", ttl=10 * 24 * 3600)
    assert "no partition" in caplog.text
    assert rows("far") == 0


def test_holds_expiry_says_whether_a_claim_past_it_would_fail(partitioned: None) -> None:
    """What the advisory_lock strategy asks before the view runs: the partitions reach
    ``AHEAD`` past the TTL, not an hour."""
    connection = connections["default"]
    assert partitions.holds_expiry(connection, 0)
    assert partitions.holds_expiry(connection, 10)
    assert not partitions.holds_expiry(connection, 3600)
    with pytest.raises(IntegrityError):
        claim("far", ttl=3600)


def test_holds_expiry_is_true_without_partitions() -> None:
    """A plain table holds every expiry, and is not asked (no statement)."""
    connection = connections["default"]
    assert not statements(connection).partitioned
    with CaptureQueriesContext(connection) as queries:
        assert partitions.holds_expiry(connection, 10 * 365 * 24 * 3600)
    assert len(queries) == 0


# -- dropping whole partitions -------------------------------------------------------------------


def test_maintain_drops_the_partitions_that_ended_and_creates_ahead(partitioned: None) -> None:
    """An expired record in a partition that ended (attached in the past, not waited for):
    the maintenance drops it with every other partition that had ended on the database's
    clock, and creates partitions further ahead than the conversion did."""
    connection = connections["default"]
    lower, _upper = past_partition()
    old = claim("old", ttl=INTERVAL)
    assert old.pk is not None and old.token is not None
    assert IdempotencyKey.objects.complete(old.pk, old.token, RESPONSE, ttl=INTERVAL)
    IdempotencyKey.objects.filter(pk=old.pk).update(expires_at=lower)
    expired_in = partition_of(old.pk)
    before = {p.name for p in partitions.partitions(connection)}
    started = db_now()
    further = AHEAD + 10 * INTERVAL  # past the conversion's reach: partitions to create
    done = partitions.maintain("default", ahead=further)
    found = partitions.partitions(connection)
    after = {p.name for p in found}
    assert expired_in in done.dropped and expired_in not in after
    assert all(p.upper > started for p in found)  # nothing that had ended is left
    assert done.created and set(done.created) <= after
    assert not done.deferred
    assert rows("old") == 0
    assert max(p.upper for p in found) >= started + timedelta(seconds=10 + further)
    assert before - after == set(done.dropped)


def test_partitions_are_dropped_while_claims_run(partitioned: None) -> None:
    """Four threads claim and complete new keys without pause while the partitions whose
    range ended are detached and dropped: no claim fails, and every key is claimed once.
    The run lasts until two partitions were dropped with claims going on (a partition ends
    every two seconds of the database's clock), however long that takes."""
    stop = threading.Event()
    claimed = [0] * 4

    def client(i: int) -> int:
        while not stop.is_set():
            result = claim(f"busy-{i}-{claimed[i]}", ttl=INTERVAL)
            assert result.state is ClaimState.CLAIMED
            assert result.pk is not None and result.token is not None
            assert IdempotencyKey.objects.complete(result.pk, result.token, RESPONSE, ttl=INTERVAL)
            claimed[i] += 1
        return claimed[i]

    def purger() -> int:
        dropped = 0
        try:
            wait_until(lambda: all(claimed), timeout=120)
            while dropped < 2:
                dropped += len(partitions.maintain("default", ahead=AHEAD).dropped)
                stop.wait(0.2)  # polling interval
            counted = sum(claimed)
            wait_until(lambda: sum(claimed) > counted + 4, timeout=120)  # claims after it
        finally:
            stop.set()
        return dropped

    background = in_background(purger)
    counts = run_at_once(4, client)
    assert background.result(timeout=300) >= 2
    assert all(counts)


def test_a_takeover_that_loses_to_a_renewal_moving_the_row_claims_again(
    partitioned: None,
) -> None:
    """The owner's renewal moves its row to a later partition while a claimant's takeover
    waits on the row: PostgreSQL fails the takeover with a serialization failure (40001),
    which the claim retries, and the retry finds the live lease: in progress, no error."""
    from django.db import transaction

    old = claim("moved", ttl=1)  # expiry a lease (5 s) ahead
    assert old.pk is not None and old.token is not None
    IdempotencyKey.objects.filter(pk=old.pk).update(
        locked_at=timezone.now() - timedelta(seconds=6)  # stale to a claimant
    )
    before = partition_of(old.pk)
    with transaction.atomic():
        assert IdempotencyKey.objects.renew(old.pk, old.token, lock_timeout=30)
        claimant = in_background(lambda: claim("moved"))
        # The claimant's takeover now waits on the renewed row.
        wait_until(lambda: _waiting("%") > 0, timeout=60)
    result = claimant.result()
    assert result.state is ClaimState.IN_PROGRESS
    assert partition_of(old.pk) != before
    assert IdempotencyKey.objects.get(key="moved").claim_token == old.token


def test_without_client_side_binding_the_lock_and_the_claim_are_two_statements_of_one_transaction(
    partitioned: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Server-side binding (or psycopg 2) cannot send the lock and the claim as one query:
    they go as two statements in one transaction, and a key is still claimed once."""
    from django.test.utils import CaptureQueriesContext

    from django_idempotency.store.sql import partitioned as sql_partitioned

    monkeypatch.setattr(sql_partitioned, "commits_in_statement", lambda connection: False)
    with CaptureQueriesContext(connections["default"]) as queries:
        assert claim("two-statements").state is ClaimState.CLAIMED
    sent = [q["sql"] for q in queries.captured_queries]
    locks = [s for s in sent if s.startswith("SELECT pg_advisory_xact_lock")]
    assert len(locks) == 1 and "INSERT" not in locks[0], sent
    assert sent.index(locks[0]) + 1 == next(i for i, s in enumerate(sent) if "INSERT" in s)
    for round_ in range(5):
        key = f"race-two-{round_}"
        results = race(8, key)
        assert [r.state for r in results].count(ClaimState.CLAIMED) == 1
        assert rows(key) == 1


def test_the_partitioned_statements_work_on_the_plain_table_while_rolling_out() -> None:
    """PARTITION_INTERVAL set, the table not converted yet: the claim, the takeover, the
    renewal and advisory_lock's completed record all work on the plain table too."""
    if connections["default"].vendor != "postgresql":
        pytest.skip("time partitions are PostgreSQL's")
    with override_settings(IDEMPOTENCY=SETTINGS):
        assert statements(connections["default"]).partitioned
        assert not partitions.is_partitioned(connections["default"])
        old = claim("rolling")
        assert old.pk is not None and old.token is not None
        assert IdempotencyKey.objects.renew(old.pk, old.token, lock_timeout=5)
        IdempotencyKey.objects.filter(pk=old.pk).update(
            locked_at=timezone.now() - timedelta(seconds=6)
        )
        new = claim("rolling")
        assert new.state is ClaimState.CLAIMED and new.taken_over and new.pk != old.pk
        assert new.pk is not None and new.token is not None
        assert IdempotencyKey.objects.complete(new.pk, new.token, RESPONSE, ttl=10)
        assert claim("rolling").response == RESPONSE
        manager = IdempotencyKey.objects
        assert manager.store_completed("user:1", "adv", PRINT, RESPONSE, ttl=10, commit=False)
        IdempotencyKey.objects.filter(key="adv").update(expires_at=timezone.now())
        assert manager.store_completed("user:1", "adv", OTHER_PRINT, RESPONSE, ttl=10)
        assert rows("rolling") == rows("adv") == 1


# -- the hybrid outbox drained into partitions ---------------------------------------------------


def outbox_row(key: str, *, expires_in: float = 20.0) -> Any:
    from ..support.factories import IdempotencyOutboxFactory

    now = timezone.now()
    return IdempotencyOutboxFactory(
        key=key, fingerprint=PRINT, created_at=now, expires_at=now + timedelta(seconds=expires_in)
    )


def test_the_outbox_drains_into_the_partitioned_table_over_any_row_of_its_keys(
    partitioned: None,
) -> None:
    """Each live outbox row becomes its key's one row, completed, in the partition of its
    expiry: over a stale claim of the key (a db claim made while Redis was down) and over
    an expired record, wherever they are; an expired outbox row is only deleted."""
    stale = claim("stale")
    assert stale.pk is not None
    IdempotencyKey.objects.filter(pk=stale.pk).update(
        locked_at=timezone.now() - timedelta(seconds=6)
    )
    old = claim("expired", ttl=1)
    assert old.pk is not None and old.token is not None
    assert IdempotencyKey.objects.complete(old.pk, old.token, RESPONSE, ttl=1)
    lower, _upper = past_partition()
    IdempotencyKey.objects.filter(pk=old.pk).update(expires_at=lower)  # expired
    reach(60)
    for key in ("stale", "expired", "new"):
        outbox_row(key, expires_in=60)
    outbox_row("gone", expires_in=-1)
    held = IdempotencyOutbox.objects.drain(using="default", hold_partial=timedelta(hours=1))
    assert (held.held, held.rows, IdempotencyOutbox.objects.count()) == (4, 0, 4)
    result = IdempotencyOutbox.objects.drain(using="default")
    assert (result.drained, result.discarded, result.held) == (3, 1, 0)
    assert not IdempotencyOutbox.objects.exists()
    for key in ("stale", "expired", "new"):
        row = IdempotencyKey.objects.get(key=key)  # one row
        assert row.status == IdempotencyKey.Status.COMPLETED
        assert claim(key).state is ClaimState.COMPLETED
    assert rows("gone") == 0 and claim("gone").state is ClaimState.CLAIMED


def test_a_drain_racing_claims_of_its_keys_leaves_one_row_a_key(partitioned: None) -> None:
    """A drainer moves 200 outbox rows while eight threads claim the same keys, with TTLs
    that put their rows in other partitions: no claim wins a key whose response is in the
    outbox or drained, and every key ends with one completed row."""
    keys = [f"drained-{i}" for i in range(200)]
    reach(60)
    for key in keys:
        outbox_row(key, expires_in=60)

    def work(i: int) -> list[ClaimResult]:
        if i == 0:
            IdempotencyOutbox.objects.drain(batch_size=50, using="default")
            IdempotencyOutbox.objects.drain(batch_size=1000, using="default")
            return []
        return [claim(key, ttl=10 + INTERVAL * i) for key in keys[i::4]]

    results = [r for found in run_at_once(9, work) for r in found]
    assert results and all(r.state is ClaimState.COMPLETED for r in results), {
        r.state for r in results
    }
    assert not IdempotencyOutbox.objects.exists()
    counts = IdempotencyKey.objects.filter(key__in=keys).values_list("key", "status")
    assert sorted(counts) == sorted((key, "completed") for key in keys)


def test_a_claim_waits_for_a_drain_that_moves_its_key_as_the_response_expires(
    partitioned: None,
) -> None:
    """The drain moves a response in its last seconds (a backlog) and commits after it
    expired. A claim of the key meanwhile finds the outbox row expired and no key row it can
    see: without the key's lock it would insert a second row beside the drained one. It
    waits for the drain's lock instead, then takes the drained, expired row over: one row."""
    from django.db import transaction

    expires = outbox_row("last-moment", expires_in=3).expires_at  # drained at once
    drained, done = threading.Event(), threading.Event()

    def drain() -> None:
        with transaction.atomic(using="default"):
            assert IdempotencyOutbox.objects.drain(using="default").drained == 1
            drained.set()
            done.wait(60)  # commit only once the claim is waiting (or has inserted)

    drainer = in_background(drain)
    assert drained.wait(60)
    wait_until(lambda: db_now() > expires, timeout=60)  # expired; the drain not committed
    claimant = in_background(lambda: claim("last-moment"))
    # The claim waits for the key's lock (without it, it would insert and never wait).
    wait_until(lambda: _waiting("%pg_advisory_xact_lock%") > 0, timeout=60)
    done.set()
    drainer.result()
    result = claimant.result()
    assert rows("last-moment") == 1
    assert result.state is ClaimState.CLAIMED and result.taken_over


def test_a_purge_batch_that_a_renewal_moved_a_row_from_under_is_taken_again(
    partitioned: None,
) -> None:
    """A claim whose lease lapsed in an expired range is purgeable; its owner, alive after
    all, renews it while the purge's DELETE waits for the row: the renewal moves the row to
    a later partition, and the DELETE fails with SQLSTATE 40001. The batch is taken again
    and leaves the row, renewed."""
    from django.db import transaction

    lapsed = claim("lapsed")
    assert lapsed.pk is not None and lapsed.token is not None
    first = min(p.lower for p in partitions.partitions(connections["default"]))
    assert first <= timezone.now()
    IdempotencyKey.objects.filter(pk=lapsed.pk).update(
        expires_at=first, locked_at=timezone.now() - timedelta(seconds=6)
    )
    expired_range = partition_of(lapsed.pk)
    renewed, commit = threading.Event(), threading.Event()

    def renew() -> bool:
        with transaction.atomic(using="default"):
            assert lapsed.pk is not None and lapsed.token is not None
            moved = IdempotencyKey.objects.renew(lapsed.pk, lapsed.token, using="default")
            renewed.set()
            commit.wait(10)
        return moved

    owner = in_background(renew)
    assert renewed.wait(10)
    purger = in_background(lambda: IdempotencyKey.objects.delete_expired(batch_size=10))
    wait_until(lambda: _waiting("%DELETE%") > 0, timeout=60)  # waits for the renewal's lock
    commit.set()
    assert owner.result() is True
    assert purger.result() == 0
    assert rows("lapsed") == 1 and partition_of(lapsed.pk) != expired_range


def test_an_expired_outbox_row_is_drained_without_the_newer_row_of_its_key(
    partitioned: None,
) -> None:
    """An outbox row that expired before it was drained, and a newer completed record of
    its key written since (another strategy's, after a switch): the drain deletes the
    outbox row and leaves the record, wherever its partition is."""
    outbox_row("switched", expires_in=-1)
    newer = claim("switched", ttl=30)
    assert newer.state is ClaimState.CLAIMED and newer.pk is not None and newer.token
    assert IdempotencyKey.objects.complete(newer.pk, newer.token, RESPONSE, ttl=30)
    result = IdempotencyOutbox.objects.drain(using="default")
    assert (result.drained, result.discarded) == (0, 1)
    row = IdempotencyKey.objects.get(key="switched")
    assert (row.claim_token, row.status) == (newer.token, IdempotencyKey.Status.COMPLETED)
    assert claim("switched").state is ClaimState.COMPLETED


# -- a drop takes only what expired --------------------------------------------------------------


def test_maintain_refuses_a_negative_older_than_and_drops_nothing(partitioned: None) -> None:
    """A negative ``older_than`` would drop the partitions whose range ends in the future."""
    live = claim("live")
    before = partitions.partitions(connections["default"])
    with pytest.raises(ValueError, match="older_than"):
        partitions.maintain("default", older_than=timedelta(hours=-1))
    assert partitions.partitions(connections["default"]) == before
    assert rows("live") == 1 and live.state is ClaimState.CLAIMED


def test_a_drop_takes_the_expired_record_and_leaves_the_newer_one_of_its_key(
    partitioned: None,
) -> None:
    """A key's expired record in a partition that ended, its newer record in a live one: the
    ended partition is dropped, with the expired record only."""
    lower, _upper = past_partition()
    old = claim("key")
    assert old.pk is not None and old.token is not None
    assert IdempotencyKey.objects.complete(old.pk, old.token, RESPONSE, ttl=10)
    IdempotencyKey.objects.filter(pk=old.pk).update(expires_at=lower)
    ended = partition_of(old.pk)
    newer = claim("key", ttl=30)
    assert newer.state is ClaimState.CLAIMED and newer.taken_over and newer.pk is not None
    live = partition_of(newer.pk)
    done = partitions.maintain("default", ahead=AHEAD)
    assert ended in done.dropped and not done.deferred  # (others may have ended too)
    assert live in {p.name for p in partitions.partitions(connections["default"])}
    assert list(IdempotencyKey.objects.values_list("pk", flat=True)) == [newer.pk]


@pytest.mark.parametrize("move", ["renewal", "takeover"])
def test_a_row_moved_out_of_an_ended_partition_while_it_is_dropped_is_kept(
    partitioned: None, move: str
) -> None:
    """A claim whose lease lapsed, in a partition that ended: its owner renews it (or another
    request takes it over), which moves the row to a live partition (an UPDATE across
    partitions, or a DELETE and an INSERT), and the transaction stays open while the
    maintenance detaches and drops the ended partition. The drop waits for that transaction;
    the moved row is in its new partition, and is kept."""
    from django.db import transaction

    lower, _upper = past_partition()
    lapsed = claim("moved")
    assert lapsed.pk is not None and lapsed.token is not None
    IdempotencyKey.objects.filter(pk=lapsed.pk).update(
        expires_at=lower, locked_at=timezone.now() - timedelta(seconds=6)
    )
    ended = partition_of(lapsed.pk)
    moved, commit = threading.Event(), threading.Event()

    def mover() -> int:
        with transaction.atomic(using="default"):
            if move == "renewal":
                assert lapsed.pk is not None and lapsed.token is not None
                assert IdempotencyKey.objects.renew(lapsed.pk, lapsed.token, using="default")
                pk = lapsed.pk
            else:
                taken = claim("moved")
                assert taken.state is ClaimState.CLAIMED and taken.taken_over
                assert taken.pk is not None
                pk = taken.pk
            moved.set()
            commit.wait(30)
        return pk

    owner = in_background(mover)
    assert moved.wait(30)
    maintenance = in_background(lambda: partitions.maintain("default", ahead=AHEAD))
    wait_until(lambda: _waiting_ddl() > 0, timeout=30)  # the drop waits for the move
    commit.set()
    pk = owner.result()
    done = maintenance.result()
    assert ended in done.dropped and not done.deferred  # (others may have ended too)
    row = IdempotencyKey.objects.get(key="moved")
    assert row.pk == pk and row.status == IdempotencyKey.Status.IN_PROGRESS
    assert row.expires_at > timezone.now() and partition_of(pk) != ended


def _waiting_ddl() -> int:
    """Backends whose ``DETACH``/``DROP`` of a partition waits for a lock."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND wait_event_type = 'Lock' AND (query ILIKE '%%DETACH PARTITION%%' "
            "OR query ILIKE 'DROP TABLE%%')"
        )
        return int(cursor.fetchone()[0])
