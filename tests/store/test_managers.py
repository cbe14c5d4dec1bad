"""The atomic SQL of IdempotencyKeyManager, on PostgreSQL (``default``), SQLite (``sqlite``)
and MariaDB (``mariadb``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.records import ClaimResult, ClaimState, KeyRow
from django_idempotency.store.sql.statements import statements

from ..support.factories import (
    CompletedKeyFactory,
    ExpiredKeyFactory,
    IdempotencyKeyFactory,
    StaleKeyFactory,
)
from ..support.mariadb import MARIADB, MYSQL_PATH, mysql_statements, with_mariadb
from ..support.threads import InBackground, in_background, run_at_once

DATABASES = with_mariadb("default", "sqlite")
pytestmark = pytest.mark.django_db(databases=DATABASES)


@pytest.fixture(params=["default", "sqlite", MARIADB, MYSQL_PATH])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each database alias in turn: PostgreSQL (or SQLite without it), SQLite, MariaDB, and
    MariaDB through MySQL's statements (no RETURNING: the claimant reads its row back)."""
    if request.param == "mariadb-as-mysql":
        with mysql_statements("mariadb"):
            yield "mariadb"
    else:
        yield str(request.param)


PRINT = "a" * 64
OTHER_PRINT = "b" * 64
RESPONSE = StoredResponse(
    status=201,
    headers={"Content-Type": "application/json", "Location": "/api/charges/7/"},
    body=b'{"id": 7}',
)


def claim(alias: str, key: str = "k1", fingerprint: str = PRINT, **kwargs: Any) -> ClaimResult:
    options: dict[str, Any] = {"ttl": 3600, "lock_timeout": 30, "using": alias}
    options.update(kwargs)
    return IdempotencyKey.objects.claim("user:1", key, fingerprint, **options)


def row(alias: str, pk: int | None) -> dict[str, Any]:
    assert pk is not None
    values: dict[str, Any] = dict(IdempotencyKey.objects.using(alias).filter(pk=pk).values().get())
    if values["response_body"] is not None:
        values["response_body"] = bytes(values["response_body"])
    return values


def age(alias: str, pk: int | None, **fields: timedelta) -> None:
    """Move timestamps into the past, as if time had passed."""
    assert pk is not None
    now = timezone.now()
    IdempotencyKey.objects.using(alias).filter(pk=pk).update(
        **{name: now - delta for name, delta in fields.items()}
    )


# -- claim ----------------------------------------------------------------------------------


def test_first_claim_inserts_an_in_progress_row(alias: str) -> None:
    result = claim(alias, method="POST", path="/pay/?a=1")
    assert result.state is ClaimState.CLAIMED
    assert result.token is not None and not result.taken_over
    values = row(alias, result.pk)
    assert values["status"] == "in_progress"
    assert values["claim_token"] == result.token
    assert values["fingerprint"] == PRINT
    assert values["request_method"] == "POST" and values["request_path"] == "/pay/?a=1"
    assert values["locked_at"] is not None
    assert values["response_status"] is None
    ttl = values["expires_at"] - values["created_at"]
    assert timedelta(seconds=3599) < ttl <= timedelta(seconds=3601)


def test_same_key_in_other_scopes_and_keys_is_independent(alias: str) -> None:
    first = claim(alias)
    other_scope = IdempotencyKey.objects.claim(
        "user:2", "k1", PRINT, ttl=60, lock_timeout=30, using=alias
    )
    other_key = claim(alias, key="k2")
    assert {first.state, other_scope.state, other_key.state} == {ClaimState.CLAIMED}
    assert len({first.pk, other_scope.pk, other_key.pk}) == 3


def test_second_claim_while_in_progress(alias: str) -> None:
    first = claim(alias)
    second = claim(alias)
    assert second.state is ClaimState.IN_PROGRESS
    assert second.pk == first.pk and second.token is None
    assert row(alias, first.pk)["claim_token"] == first.token


def test_claim_after_complete_returns_the_stored_response(alias: str) -> None:
    first = claim(alias)
    assert first.token is not None and first.pk is not None
    assert IdempotencyKey.objects.complete(first.pk, first.token, RESPONSE, ttl=600, using=alias)
    values = row(alias, first.pk)
    assert values["status"] == "completed" and values["locked_at"] is None
    assert values["completed_at"] is not None
    assert timedelta(seconds=599) < values["expires_at"] - values["completed_at"]
    again = claim(alias)
    assert again.state is ClaimState.COMPLETED
    assert again.response == RESPONSE


def test_a_quick_completion_keeps_the_expiry_of_its_claim(alias: str) -> None:
    """Completed within 1 % of the TTL of its claim, the key keeps the claim's expiry: the
    completion writes no indexed column (a HOT update on PostgreSQL)."""
    first = claim(alias, ttl=3600)
    assert first.token is not None and first.pk is not None
    claimed = row(alias, first.pk)["expires_at"]
    assert IdempotencyKey.objects.complete(first.pk, first.token, RESPONSE, ttl=3600, using=alias)
    values = row(alias, first.pk)
    assert values["status"] == "completed" and values["expires_at"] == claimed
    assert timedelta(seconds=3564) <= values["expires_at"] - values["completed_at"]


def test_a_long_request_has_its_ttl_counted_from_the_completion(alias: str) -> None:
    """A request that ran longer than 1 % of the TTL (here 60 s of 3600) is kept for the
    whole TTL after its completion, not for what is left of its claim's."""
    first = claim(alias, ttl=3600)
    assert first.token is not None and first.pk is not None
    age(alias, first.pk, expires_at=timedelta(seconds=60 - 3600))  # claimed a minute ago
    assert IdempotencyKey.objects.complete(first.pk, first.token, RESPONSE, ttl=3600, using=alias)
    values = row(alias, first.pk)
    lifetime = values["expires_at"] - values["completed_at"]
    assert timedelta(seconds=3599) < lifetime <= timedelta(seconds=3601)


@pytest.mark.postgres
def test_the_completion_is_a_hot_update_on_postgresql() -> None:
    """The completion changes no indexed column of the key row, so PostgreSQL writes its new
    version on the same heap page without a new index entry (pg_stat: n_tup_hot_upd)."""
    first = claim("default")
    assert first.token is not None and first.pk is not None
    table = IdempotencyKey._meta.db_table
    counts = (
        "SELECT pg_stat_get_xact_tuples_updated(%s::regclass), "
        "pg_stat_get_xact_tuples_hot_updated(%s::regclass)"
    )
    with transaction.atomic(using="default"), connections["default"].cursor() as cursor:
        cursor.execute(counts, [table, table])
        before = cursor.fetchone()
        assert IdempotencyKey.objects.complete(first.pk, first.token, RESPONSE, ttl=3600)
        cursor.execute(counts, [table, table])
        after = cursor.fetchone()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


def test_other_fingerprint_is_a_mismatch(alias: str) -> None:
    first = claim(alias)
    assert claim(alias, fingerprint=OTHER_PRINT).state is ClaimState.MISMATCH
    assert first.pk is not None and first.token is not None
    IdempotencyKey.objects.complete(first.pk, first.token, RESPONSE, ttl=600, using=alias)
    mismatch = claim(alias, fingerprint=OTHER_PRINT)
    assert mismatch.state is ClaimState.MISMATCH and mismatch.response is None


def test_stale_lease_is_taken_over_and_the_old_token_is_fenced(alias: str) -> None:
    old = claim(alias, lock_timeout=30)
    assert old.pk is not None and old.token is not None
    age(alias, old.pk, locked_at=timedelta(seconds=31))
    new = claim(alias, lock_timeout=30)
    assert new.state is ClaimState.CLAIMED and new.taken_over
    assert new.pk == old.pk and new.token != old.token
    before = row(alias, new.pk)
    assert before["claim_token"] == new.token and before["status"] == "in_progress"

    manager = IdempotencyKey.objects
    assert manager.complete(old.pk, old.token, RESPONSE, ttl=600, using=alias) is False
    assert manager.renew(old.pk, old.token, using=alias) is False
    assert manager.release(old.pk, old.token, using=alias) is False
    assert row(alias, new.pk) == before

    assert new.token is not None
    assert manager.complete(new.pk, new.token, RESPONSE, ttl=600, using=alias) is True
    assert claim(alias).response == RESPONSE


@pytest.mark.parametrize("steps", [None, {"fingerprint": PRINT, "done": []}])
def test_a_takeover_keeps_the_first_claims_time_only_of_a_key_with_steps(
    alias: str, steps: dict[str, Any] | None
) -> None:
    """A key in steps keeps the time of its first claim (``DOWNSTREAM_KEY_LIFETIME`` counts
    from it); any other takeover is a new claim, created now (the drain tells a newer
    record of a key by it)."""
    old = claim(alias, lock_timeout=30)
    assert old.pk is not None
    IdempotencyKey.objects.using(alias).filter(pk=old.pk).update(steps=steps)
    age(alias, old.pk, locked_at=timedelta(seconds=31), created_at=timedelta(hours=2))
    first = row(alias, old.pk)["created_at"]
    new = claim(alias, lock_timeout=30)
    assert new.state is ClaimState.CLAIMED and new.taken_over
    created = row(alias, new.pk)["created_at"]
    if steps is None:
        assert created > first + timedelta(hours=1)
    else:
        assert created == first


def test_fresh_lease_is_not_taken_over(alias: str) -> None:
    old = claim(alias, lock_timeout=30)
    age(alias, old.pk, locked_at=timedelta(seconds=20))
    assert claim(alias, lock_timeout=30).state is ClaimState.IN_PROGRESS
    assert row(alias, old.pk)["claim_token"] == old.token


def test_stale_lease_is_taken_over_by_a_different_request(alias: str) -> None:
    old = claim(alias)
    age(alias, old.pk, locked_at=timedelta(hours=1))
    new = claim(alias, fingerprint=OTHER_PRINT)
    assert new.state is ClaimState.CLAIMED and new.taken_over
    assert row(alias, new.pk)["fingerprint"] == OTHER_PRINT


def test_expired_completed_key_is_claimable_again(alias: str) -> None:
    expired = ExpiredKeyFactory(_using=alias, scope="user:1", key="k1", fingerprint=OTHER_PRINT)
    new = claim(alias, ttl=60)
    assert new.state is ClaimState.CLAIMED and new.taken_over
    assert new.pk == expired.pk
    values = row(alias, new.pk)
    assert values["status"] == "in_progress" and values["claim_token"] == new.token
    assert values["fingerprint"] == PRINT
    assert values["response_status"] is None and values["response_body"] is None
    assert values["response_headers"] == {} and values["completed_at"] is None
    assert values["expires_at"] > timezone.now()


def test_in_progress_key_past_its_ttl_with_a_live_lease_is_not_taken_over(alias: str) -> None:
    """TTL is how long a *completed* key is kept; a running request is governed by its lease."""
    old = claim(alias, ttl=1, lock_timeout=30)
    age(alias, old.pk, expires_at=timedelta(seconds=5))
    again = claim(alias, ttl=1, lock_timeout=30)
    assert again.state is ClaimState.IN_PROGRESS
    assert row(alias, old.pk)["claim_token"] == old.token
    assert old.pk is not None and old.token is not None
    assert IdempotencyKey.objects.renew(old.pk, old.token, using=alias)


def take_over(alias: str, pk: int, old_token: uuid.UUID) -> bool:
    """Whether the takeover replaced the claim (it returns the claim's id, None if not)."""
    return None is not IdempotencyKey.objects._take_over(
        pk,
        old_token,
        uuid.uuid4(),
        PRINT,
        ttl=60,
        lock_timeout=30,
        method="POST",
        path="/",
        using=alias,
    )


def test_take_over_needs_the_row_to_be_still_stale(alias: str) -> None:
    """The conditional UPDATE of a takeover re-checks staleness, not only the token:
    a row that was read stale and then renewed or completed by its (slow, not dead)
    owner must not be taken over."""
    manager = IdempotencyKey.objects
    old = claim(alias, lock_timeout=30)
    assert old.pk is not None and old.token is not None
    age(alias, old.pk, locked_at=timedelta(seconds=60))
    # A claimant has read the stale row (pk, old token); now the owner renews ...
    assert manager.renew(old.pk, old.token, using=alias)
    assert not take_over(alias, old.pk, old.token)
    # ... or completes.
    age(alias, old.pk, locked_at=timedelta(seconds=60))
    assert manager.complete(old.pk, old.token, RESPONSE, ttl=600, using=alias)
    assert not take_over(alias, old.pk, old.token)
    assert claim(alias).response == RESPONSE
    # An expired completed row and a stale lease are taken over.
    age(alias, old.pk, expires_at=timedelta(seconds=1))
    assert take_over(alias, old.pk, old.token)


@pytest.mark.parametrize("owner_action", ["complete", "renew"])
def test_owner_acting_between_a_claimants_read_and_takeover_keeps_its_key(
    alias: str, owner_action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interleave, in this order: the claimant reads the stale row; the slow owner
    completes (or renews) it; the claimant's takeover UPDATE runs. The owner keeps it."""
    manager = IdempotencyKey.objects
    old = claim(alias, lock_timeout=30)
    assert old.pk is not None and old.token is not None
    age(alias, old.pk, locked_at=timedelta(seconds=60))
    real_take_over = manager._take_over
    calls: list[int | None] = []

    def owner_acts_first(*args: Any, **kwargs: Any) -> int | None:
        if not calls:
            assert old.pk is not None and old.token is not None
            if owner_action == "complete":
                assert manager.complete(old.pk, old.token, RESPONSE, ttl=600, using=alias)
            else:
                assert manager.renew(old.pk, old.token, using=alias)
        calls.append(real_take_over(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(manager, "_take_over", owner_acts_first)
    result = claim(alias, lock_timeout=30)
    assert calls == [None]
    if owner_action == "complete":
        assert result.state is ClaimState.COMPLETED and result.response == RESPONSE
    else:
        assert result.state is ClaimState.IN_PROGRESS
        assert row(alias, old.pk)["claim_token"] == old.token


# -- renew and release ----------------------------------------------------------------------


def test_renew_moves_locked_at(alias: str) -> None:
    first = claim(alias)
    assert first.pk is not None and first.token is not None
    age(alias, first.pk, locked_at=timedelta(seconds=10))
    before = row(alias, first.pk)["locked_at"]
    assert IdempotencyKey.objects.renew(first.pk, first.token, using=alias) is True
    after = row(alias, first.pk)["locked_at"]
    assert after - before >= timedelta(seconds=9)
    assert IdempotencyKey.objects.renew(first.pk, uuid.uuid4(), using=alias) is False
    assert row(alias, first.pk)["locked_at"] == after


def test_renew_of_a_completed_key_is_false(alias: str) -> None:
    first = claim(alias)
    assert first.pk is not None and first.token is not None
    IdempotencyKey.objects.complete(first.pk, first.token, RESPONSE, ttl=600, using=alias)
    assert IdempotencyKey.objects.renew(first.pk, first.token, using=alias) is False
    assert row(alias, first.pk)["locked_at"] is None


def test_release_deletes_only_with_the_right_token(alias: str) -> None:
    first = claim(alias)
    assert first.pk is not None and first.token is not None
    manager = IdempotencyKey.objects
    assert manager.release(first.pk, uuid.uuid4(), using=alias) is False
    assert manager.using(alias).filter(pk=first.pk).exists()
    assert manager.release(first.pk, first.token, using=alias) is True
    assert not manager.using(alias).filter(pk=first.pk).exists()
    assert manager.release(first.pk, first.token, using=alias) is False
    assert claim(alias).state is ClaimState.CLAIMED


def test_release_does_not_delete_a_completed_key(alias: str) -> None:
    first = claim(alias)
    assert first.pk is not None and first.token is not None
    IdempotencyKey.objects.complete(first.pk, first.token, RESPONSE, ttl=600, using=alias)
    assert IdempotencyKey.objects.release(first.pk, first.token, using=alias) is False
    assert claim(alias).state is ClaimState.COMPLETED


def test_complete_twice_is_refused(alias: str) -> None:
    first = claim(alias)
    assert first.pk is not None and first.token is not None
    manager = IdempotencyKey.objects
    assert manager.complete(first.pk, first.token, RESPONSE, ttl=600, using=alias)
    other = StoredResponse(status=500, headers={}, body=b"no")
    assert manager.complete(first.pk, first.token, other, ttl=600, using=alias) is False
    assert claim(alias).response == RESPONSE


def test_release_stuck(alias: str) -> None:
    stuck = [IdempotencyKeyFactory(_using=alias) for _ in range(3)]
    done = ExpiredKeyFactory(_using=alias)
    manager = IdempotencyKey.objects
    assert manager.release_stuck([stuck[0].pk, done.pk], using=alias) == 1
    assert manager.release_stuck(using=alias) == 2
    assert list(manager.using(alias).values_list("pk", flat=True)) == [done.pk]


# -- purge ----------------------------------------------------------------------------------


def test_delete_expired_in_batches(alias: str) -> None:
    now = timezone.now()
    IdempotencyKey.objects.using(alias).bulk_create(
        IdempotencyKeyFactory.build(
            key=f"old{i}", status="completed", expires_at=now - timedelta(minutes=i + 1)
        )
        for i in range(25)
    )
    live = [IdempotencyKeyFactory(_using=alias) for _ in range(4)]
    manager = IdempotencyKey.objects
    assert manager.expired(using=alias).count() == 25
    counts = list(manager.iter_delete_expired(batch_size=10, cutoff=now, using=alias))
    assert counts == [10, 10, 5]
    remaining = set(manager.using(alias).values_list("pk", flat=True))
    assert remaining == {k.pk for k in live}
    assert list(manager.iter_delete_expired(batch_size=10, cutoff=now, using=alias)) == []


def test_delete_expired_counts_and_limits(alias: str) -> None:
    now = timezone.now()
    IdempotencyKey.objects.using(alias).bulk_create(
        CompletedKeyFactory.build(key=f"old{i}", expires_at=now - timedelta(hours=i + 1))
        for i in range(12)
    )
    manager = IdempotencyKey.objects
    # keys that expired less than 6 hours ago stay (the 5 of 1..5 hours)
    assert (
        manager.delete_expired(
            batch_size=4, older_than=timedelta(hours=5, minutes=30), now=now, using=alias
        )
        == 7
    )
    assert manager.delete_expired(batch_size=2, max_batches=2, now=now, using=alias) == 4
    assert manager.using(alias).count() == 1
    assert manager.delete_expired(batch_size=1000, using=alias) == 1
    assert manager.delete_expired(batch_size=1000, using=alias) == 0


def test_purge_spares_an_expired_key_whose_request_is_still_running(alias: str) -> None:
    """A key in progress under a live lease is never purged, however old its expiry: its
    request is running and will complete it. A stale lease (a dead worker's) is purged."""
    past = timezone.now() - timedelta(days=2)
    running = IdempotencyKeyFactory(_using=alias, key="running", expires_at=past)
    StaleKeyFactory(_using=alias, key="dead", expires_at=past)
    ExpiredKeyFactory(_using=alias, key="done")
    manager = IdempotencyKey.objects
    assert manager.delete_expired(batch_size=1, using=alias) == 2
    assert list(manager.using(alias).values_list("key", flat=True)) == ["running"]
    assert manager.delete_expired_pks([running.pk], using=alias) == 0
    assert manager.using(alias).filter(key="running").exists()


def test_a_negative_older_than_is_refused_and_deletes_nothing(alias: str) -> None:
    """A negative ``older_than`` would put the cutoff in the future, where live keys are."""
    live = CompletedKeyFactory(_using=alias, key="live")
    manager = IdempotencyKey.objects
    for purge in (
        lambda: manager.delete_expired(older_than=timedelta(hours=-1), using=alias),
        lambda: list(
            manager.iter_delete_expired(batch_size=10, older_than=timedelta(hours=-1), using=alias)
        ),
        lambda: manager.expired(older_than=timedelta(hours=-1), using=alias).count(),
    ):
        with pytest.raises(ValueError, match="older_than"):
            purge()
    assert manager.using(alias).filter(pk=live.pk).exists()


@pytest.mark.parametrize("purge", ["orm", "pks"])
def test_the_orm_purge_deletes_with_the_expiry_in_the_delete_whatever_receivers_listen(
    alias: str, purge: str
) -> None:
    """The purge through the ORM (other databases; the admin's action) is one ``DELETE``
    whose ``WHERE`` holds the expiry condition, like the one-statement purge, and sends no
    delete signals. With a ``pre_delete`` receiver connected, Django's ``delete()`` would
    read the rows, send the signal and then delete them by id alone: a key renewed in
    between (here by the receiver, as a retry would) would be deleted though live."""
    from django.db.models.signals import pre_delete

    key = ExpiredKeyFactory(_using=alias, key="renewed")
    renewed: list[bool] = []

    def renew(**_kwargs: Any) -> None:
        IdempotencyKey.objects.using(alias).filter(pk=key.pk).update(
            expires_at=timezone.now() + timedelta(hours=1)
        )
        renewed.append(True)

    pre_delete.connect(renew, sender=IdempotencyKey, weak=False)
    manager: Any = IdempotencyKey.objects
    try:
        if purge == "orm":
            deleted = sum(manager._iter_delete_expired_orm(10, timezone.now(), alias, None))
        else:
            deleted = manager.delete_expired_pks([key.pk], using=alias)
    finally:
        pre_delete.disconnect(renew, sender=IdempotencyKey)
    assert (deleted, renewed) == (1, [])
    assert not manager.using(alias).filter(pk=key.pk).exists()


def test_delete_expired_uses_one_alias_only() -> None:
    ExpiredKeyFactory(_using="sqlite")
    ExpiredKeyFactory(_using="default")
    assert IdempotencyKey.objects.delete_expired(using="sqlite") == 1
    assert IdempotencyKey.objects.using("default").count() == 1


# -- real races -----------------------------------------------------------------------------


@pytest.mark.django_db(databases=DATABASES, transaction=True)
def test_sixteen_threads_claim_one_key_exactly_one_wins(alias: str) -> None:
    results = run_at_once(16, lambda _: claim(alias, key="race"))
    states = [r.state for r in results]
    assert states.count(ClaimState.CLAIMED) == 1, states
    assert states.count(ClaimState.IN_PROGRESS) == 15, states
    assert IdempotencyKey.objects.using(alias).filter(key="race").count() == 1
    (winner,) = [r for r in results if r.state is ClaimState.CLAIMED]
    assert row(alias, winner.pk)["claim_token"] == winner.token


@pytest.mark.django_db(databases=DATABASES, transaction=True)
def test_sixteen_threads_take_over_one_stale_lease_exactly_one_wins(alias: str) -> None:
    old = claim(alias, key="stale")
    age(alias, old.pk, locked_at=timedelta(hours=1))
    results = run_at_once(16, lambda _: claim(alias, key="stale"))
    winners = [r for r in results if r.state is ClaimState.CLAIMED]
    assert len(winners) == 1, [r.state for r in results]
    assert winners[0].taken_over
    assert row(alias, old.pk)["claim_token"] == winners[0].token


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default"], transaction=True)
def test_claim_waiting_on_a_completing_owner_gets_its_response() -> None:
    """The owner completes a lease that looks stale, in a transaction that is still
    open; a claimant arriving now waits on the owner's row (the INSERT … ON CONFLICT
    waits for the uncommitted version), and once the owner commits it gets the stored
    response instead of taking the key over."""
    old = claim("default", key="slow")
    assert old.pk is not None and old.token is not None
    age("default", old.pk, locked_at=timedelta(hours=1))
    with transaction.atomic(using="default"):
        assert IdempotencyKey.objects.complete(old.pk, old.token, RESPONSE, ttl=600)
        claimant = in_background(lambda: claim("default", key="slow"))
        wait_for_lock_wait(claimant)
    outcome = claimant.result(timeout=30)
    assert outcome.state is ClaimState.COMPLETED, outcome
    assert outcome.response == RESPONSE
    assert row("default", old.pk)["status"] == "completed"


def wait_for_lock_wait(thread: InBackground[Any], timeout: float = 10.0) -> None:
    """Block until a backend of the test database waits on a lock.

    Polls from a separate autocommit connection: pg_stat_activity is a snapshot
    per transaction, so it cannot be watched from inside the open transaction.
    """
    import psycopg

    settings = connections["default"].settings_dict
    with psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        host=settings["HOST"],
        port=settings["PORT"],
        autocommit=True,
    ) as conn:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if waiting and waiting[0]:
                return
            assert thread.is_alive(), "the claimant finished without waiting on the row"
            time.sleep(0.01)  # polling interval, not a wait that hopes
    raise AssertionError("the claimant never waited on the row")


# -- read -----------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [IdempotencyKeyFactory, CompletedKeyFactory])
def test_read_returns_what_the_orm_returns(alias: str, factory: Any) -> None:
    made = factory(_using=alias, scope="user:1", key="k1")
    fields = ["pk", *KeyRow._fields[1:-1]]
    orm = IdempotencyKey.objects.using(alias).filter(pk=made.pk).values_list(*fields).get()
    read = IdempotencyKey.objects.read("user:1", "k1", using=alias)
    assert read is not None
    assert tuple(read) == (*orm, False)  # not from the outbox
    assert isinstance(read.claim_token, uuid.UUID)
    assert read.expires_at.tzinfo is not None
    assert IdempotencyKey.objects.read("user:1", "absent", using=alias) is None


# -- the statements -------------------------------------------------------------------------


def test_param_slots_name_the_parameters_in_the_order_params_fills_them(alias: str) -> None:
    connection = connections[alias]
    statement = statements(connection).claim
    slots = statement.param_slots
    values: dict[str, Any] = {name: f"<{name}>" for name, is_time in slots if not is_time}
    values.update({name: 60.0 for name, is_time in slots if is_time and name})
    params = statement.params(connection, values)
    assert len(params) == len(slots) == statement.sql.count("%s")
    for (name, is_time), param in zip(slots, params, strict=True):
        if not is_time:
            assert param == f"<{name}>"
    # The app's clock fills times on SQLite only; PostgreSQL takes them in the SQL.
    assert any(is_time for _name, is_time in slots) is (alias == "sqlite")


# -- a winner that commits while the claim waits (PostgreSQL) --------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_winner_that_commits_while_the_claim_waits_is_read_by_a_second_statement() -> None:
    """The claim's INSERT waits for another transaction's uncommitted row of the key; that
    one commits, the INSERT inserts nothing, and the loser's read, a statement of its own
    with a snapshot taken after the winner's commit, sees the row (a read folded into the
    INSERT's statement would share its snapshot, taken before the wait, and miss it)."""
    from django.test.utils import CaptureQueriesContext

    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(
                "INSERT INTO django_idempotency_idempotencykey (scope, key, fingerprint, "
                "status, claim_token, locked_at, request_method, request_path, "
                "response_headers, created_at, expires_at) VALUES ('user:1', 'race', %s, "
                "'in_progress', %s, now(), 'POST', '/x/', '{}', now(), now() + interval '1 h')",
                [PRINT, uuid.uuid4()],
            )

        def loser() -> tuple[ClaimResult, int]:
            try:
                with CaptureQueriesContext(connections["default"]) as queries:
                    result = claim("default", "race")
                return result, len(queries)
            finally:
                connections["default"].close()

        waiting = in_background(loser)
        deadline = time.monotonic() + 10
        with holder.cursor() as cursor:
            while time.monotonic() < deadline:
                cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                if cursor.fetchone()[0]:
                    break
                time.sleep(0.01)
        holder.commit()
        result, statements_sent = waiting.result(10)
    finally:
        holder.close()
    assert result.state == ClaimState.IN_PROGRESS
    assert statements_sent == 2  # the claim, then the read
