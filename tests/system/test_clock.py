"""Leases are judged on the database's clock, not on each app server's.

The app clock is the input under test: ``django.utils.timezone.now`` is patched to run
45 seconds ahead of (or behind) the PostgreSQL server in the process that claims,
renews, completes or purges, while the database and its clock stay real. Row
timestamps are set with the server's own ``statement_timestamp()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.lifecycle import Lifecycle
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.records import ClaimResult, ClaimState

from ..support.commands import run_command
from ..support.factories import CompletedKeyFactory, IdempotencyKeyFactory
from ..support.faketime import skewed

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

PRINT = "a" * 64
RESPONSE = StoredResponse(status=201, headers={}, body=b'{"id": 1}')
SKEWS = [pytest.param(45, id="app-ahead-45s"), pytest.param(-45, id="app-behind-45s")]
TABLE = IdempotencyKey._meta.db_table


@contextmanager
def app_clock(skew_seconds: float) -> Iterator[None]:
    """``timezone.now()`` runs ``skew_seconds`` off the database's clock inside the block."""
    real: Callable[[], datetime] = timezone.now
    shift = timedelta(seconds=skew_seconds)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timezone, "now", lambda: real() + shift)
        yield


def db_now() -> datetime:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        value: datetime = cursor.fetchone()[0]
    return value


def set_locked_at(pk: int | None, seconds_ago: float) -> None:
    """``locked_at`` = the database's time minus ``seconds_ago`` (a renewal then)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET locked_at = statement_timestamp() - %s * interval '1 second' "
            "WHERE id = %s",
            [seconds_ago, pk],
        )


def set_expires_at(pk: int | None, seconds_from_now: float) -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET expires_at = statement_timestamp() + %s * interval '1 second' "
            "WHERE id = %s",
            [seconds_from_now, pk],
        )


def claim(**kwargs: Any) -> ClaimResult:
    options: dict[str, Any] = {"ttl": 3600, "lock_timeout": 30, "using": "default"}
    options.update(kwargs)
    return IdempotencyKey.objects.claim("user:1", "k1", PRINT, **options)


def token_of(pk: int | None) -> uuid.UUID:
    assert pk is not None
    return IdempotencyKey.objects.using("default").get(pk=pk).claim_token


def near_db_now(value: datetime | None, offset: float = 0.0) -> bool:
    assert value is not None
    return abs((value - db_now()).total_seconds() - offset) < 5


# -- the claim and the takeover --------------------------------------------------------------


@pytest.mark.parametrize("skew", SKEWS)
def test_a_live_lease_is_not_taken_over_whatever_the_app_clock(skew: int) -> None:
    owner = claim()
    set_locked_at(owner.pk, 10)  # renewed 10 s ago (a heartbeat interval) by the DB clock
    with app_clock(skew):
        again = claim()
    assert again.state is ClaimState.IN_PROGRESS, again
    assert token_of(owner.pk) == owner.token


@pytest.mark.parametrize("skew", SKEWS)
def test_a_stale_lease_is_taken_over_whatever_the_app_clock(skew: int) -> None:
    owner = claim()
    set_locked_at(owner.pk, 600)
    with app_clock(skew):
        new = claim()
    assert new.state is ClaimState.CLAIMED and new.taken_over
    assert token_of(owner.pk) == new.token
    assert owner.pk is not None
    row = IdempotencyKey.objects.using("default").get(pk=owner.pk)
    assert near_db_now(row.locked_at) and near_db_now(row.created_at)
    assert near_db_now(row.expires_at, offset=3600)


def test_a_lease_stale_by_the_db_clock_is_taken_over_by_a_server_that_lags() -> None:
    """40 s old by the database's clock, 30 s lock timeout: stale, though a server 45 s
    behind sees it as renewed 5 s in its future."""
    owner = claim()
    set_locked_at(owner.pk, 40)
    with app_clock(-45):
        new = claim()
    assert new.state is ClaimState.CLAIMED and new.taken_over


@pytest.mark.parametrize("skew", SKEWS)
def test_a_claim_is_stamped_with_the_db_clock(skew: int) -> None:
    with app_clock(skew):
        result = claim()
    assert result.pk is not None
    row = IdempotencyKey.objects.using("default").get(pk=result.pk)
    assert near_db_now(row.locked_at) and near_db_now(row.created_at)
    assert near_db_now(row.expires_at, offset=3600)


@pytest.mark.parametrize("skew", SKEWS)
def test_an_expired_completed_key_is_judged_on_the_db_clock(skew: int) -> None:
    done = CompletedKeyFactory(scope="user:1", key="k1", fingerprint=PRINT)
    set_expires_at(done.pk, 20)  # still replayed for 20 s
    with app_clock(skew):
        assert claim().state is ClaimState.COMPLETED
    set_expires_at(done.pk, -20)
    with app_clock(skew):
        assert claim().state is ClaimState.CLAIMED


# -- the owner's statements ------------------------------------------------------------------


@pytest.mark.parametrize("skew", SKEWS)
def test_renew_keeps_the_lease_alive_whatever_the_app_clock(skew: int) -> None:
    owner = claim()
    assert owner.pk is not None and owner.token is not None
    set_locked_at(owner.pk, 25)
    with app_clock(skew):
        assert IdempotencyKey.objects.renew(owner.pk, owner.token)
    assert near_db_now(IdempotencyKey.objects.get(pk=owner.pk).locked_at)
    # A claimant on either clock finds the lease live.
    assert claim().state is ClaimState.IN_PROGRESS
    with app_clock(skew):
        assert claim().state is ClaimState.IN_PROGRESS
    assert token_of(owner.pk) == owner.token


@pytest.mark.parametrize("skew", SKEWS)
def test_complete_stamps_completed_and_expires_at_with_the_db_clock(skew: int) -> None:
    owner = claim()
    assert owner.pk is not None and owner.token is not None
    with app_clock(skew):
        assert IdempotencyKey.objects.complete(owner.pk, owner.token, RESPONSE, ttl=600)
    row = IdempotencyKey.objects.get(pk=owner.pk)
    assert near_db_now(row.completed_at) and near_db_now(row.expires_at, offset=600)


@pytest.mark.parametrize("skew", SKEWS)
def test_store_completed_stamps_with_the_db_clock(skew: int) -> None:
    with app_clock(skew):
        IdempotencyKey.objects.store_completed("user:1", "k1", PRINT, RESPONSE, ttl=600)
    row = IdempotencyKey.objects.get(scope="user:1", key="k1")
    assert near_db_now(row.created_at) and near_db_now(row.completed_at)
    assert near_db_now(row.expires_at, offset=600)


# -- the purge -------------------------------------------------------------------------------


@override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 30})
def test_purge_spares_a_live_lease_when_the_app_clock_is_ahead() -> None:
    running = IdempotencyKeyFactory(key="running")
    set_expires_at(running.pk, -3600)  # past its TTL, but its request is still running
    set_locked_at(running.pk, 10)
    dead = IdempotencyKeyFactory(key="dead")
    set_expires_at(dead.pk, -3600)
    set_locked_at(dead.pk, 600)
    manager = IdempotencyKey.objects
    with app_clock(45):
        assert manager.delete_expired() == 1
        assert manager.delete_expired_pks([running.pk]) == 0
        assert list(manager.iter_delete_expired(batch_size=10)) == []
    assert list(manager.values_list("key", flat=True)) == ["running"]


def test_purge_keeps_a_key_that_is_live_by_the_db_clock() -> None:
    live = CompletedKeyFactory(key="live")
    set_expires_at(live.pk, 20)
    gone = CompletedKeyFactory(key="gone")
    set_expires_at(gone.pk, -20)
    manager = IdempotencyKey.objects
    with app_clock(45):
        assert manager.expired().count() == 1
        assert manager.delete_expired() == 1
        assert manager.delete_expired_pks([live.pk]) == 0
    assert list(manager.values_list("key", flat=True)) == ["live"]
    with app_clock(-45):
        set_expires_at(live.pk, -20)
        assert manager.delete_expired(older_than=timedelta(seconds=10)) == 1
    assert not manager.exists()


# -- the hybrid strategy's check of a db claim -----------------------------------------------


@pytest.mark.parametrize("skew", SKEWS)
def test_fence_stale_claim_judges_the_lease_on_the_db_clock(skew: int) -> None:
    owner = claim()
    set_locked_at(owner.pk, 10)
    manager = IdempotencyKey.objects
    with app_clock(skew):
        assert manager.fence_stale_claim("user:1", "k1", lock_timeout=30) is False
    assert token_of(owner.pk) == owner.token
    set_locked_at(owner.pk, 600)
    with app_clock(skew):
        assert manager.fence_stale_claim("user:1", "k1", lock_timeout=30) is True
    assert owner.pk is not None
    assert not manager.filter(pk=owner.pk).exists()


@override_settings(IDEMPOTENCY={"STRATEGY": "advisory_lock"})
def test_advisory_lock_judges_expiry_on_the_database_clock() -> None:
    """A completed key with 20 s of its TTL left (by the database's clock) is replayed by
    an app server whose clock runs 45 s ahead, never run again as if it had expired."""
    from django_idempotency.strategies import reset
    from django_idempotency.strategies.advisory import AdvisoryLockStrategy
    from django_idempotency.strategies.base import Attempt, Replay

    reset()
    row = CompletedKeyFactory(fingerprint=PRINT, response_body=RESPONSE.body)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET expires_at = statement_timestamp() + interval '20 seconds' "
            "WHERE id = %s",
            [row.pk],
        )
    attempt = Attempt(row.scope, row.key, PRINT, ttl=60, lock_timeout=5)
    with app_clock(45), Lifecycle(AdvisoryLockStrategy(), attempt) as outcome_life:
        outcome = outcome_life.outcome
        assert isinstance(outcome, Replay)


def test_the_hybrid_lookup_judges_expiry_on_the_database_clock() -> None:
    """The hybrid strategy's database check finds a completed key with 20 s of its TTL
    left (by the database's clock) from an app server whose clock runs 45 s ahead."""
    from django_idempotency.models import IdempotencyOutbox

    row = CompletedKeyFactory(fingerprint=PRINT, response_body=RESPONSE.body)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET expires_at = statement_timestamp() + interval '20 seconds' "
            "WHERE id = %s",
            [row.pk],
        )
    with app_clock(45):
        found = IdempotencyOutbox.objects.lookup(row.scope, row.key)
    assert found is not None and found.completed


# -- the hybrid strategy's outbox row ----------------------------------------------------------


@pytest.mark.parametrize("fenced", [False, True], ids=["plain", "fenced"])
@pytest.mark.parametrize("skew", SKEWS)
def test_an_outbox_row_is_stamped_with_the_db_clock(skew: int, fenced: bool) -> None:
    """The row's ``created_at`` and ``expires_at`` are the database's, as the key table's
    are: a server 45 s behind with ``TTL`` 60 would otherwise write a row with 15 s left."""
    from django_idempotency.models import IdempotencyOutbox

    fence: dict[str, Any] = {"fence_lock_timeout": 30} if fenced else {}
    with app_clock(skew):
        assert IdempotencyOutbox.objects.add("user:1", "k1", PRINT, RESPONSE, ttl=60, **fence)
    row = IdempotencyOutbox.objects.get(scope="user:1", key="k1")
    assert near_db_now(row.created_at) and near_db_now(row.expires_at, offset=60)
    assert row.expires_at - row.created_at == timedelta(seconds=60)


#: A worker of its own whose clock is off (tests/support/faketime.py): it prints how far its
#: clock is from the database's, then writes an outbox row as the hybrid strategy does.
SKEWED_OUTBOX_ADD = """
import django
django.setup()
from django.db import connection
from django.utils import timezone
from django_idempotency.models import IdempotencyOutbox
from django_idempotency.protocol.replay import StoredResponse

with connection.cursor() as cursor:
    cursor.execute("SELECT statement_timestamp()")
    database_now = cursor.fetchone()[0]
print((timezone.now() - database_now).total_seconds())
response = StoredResponse(status=201, headers={}, body=b'{"id": 1}')
assert IdempotencyOutbox.objects.add("user:1", "skewed", "a" * 64, response, ttl=60)
"""


@pytest.mark.faketime
@pytest.mark.django_db(transaction=True)
def test_a_worker_90s_behind_writes_an_outbox_row_that_lives_its_ttl() -> None:
    """A real process whose clock runs 90 s behind the database's (libfaketime) completes a
    request under ``hybrid`` with ``TTL`` 60: its outbox row lives 60 s by the database's
    clock, and is found live (a row stamped by the worker's clock would have been written
    expired, and a retry after a Redis flush would have run the view again)."""
    from django_idempotency.models import IdempotencyOutbox

    before = db_now()
    done = run_command(
        connections["default"].settings_dict["NAME"], code=SKEWED_OUTBOX_ADD, env=skewed("-90s")
    )
    after = db_now()
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) < -80  # the worker's clock really was behind
    row = IdempotencyOutbox.objects.get(scope="user:1", key="skewed")
    assert before <= row.created_at <= after
    assert row.expires_at - row.created_at == timedelta(seconds=60)
    found = IdempotencyOutbox.objects.lookup("user:1", "skewed")
    assert found is not None and found.completed and found.source == "outbox"
