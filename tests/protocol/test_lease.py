"""LeaseKeeper (django_idempotency.protocol.lease) renewing real claims on the real databases."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.lease import LeaseKeeper
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.strategies.base import Attempt, Claim
from django_idempotency.strategies.db import DatabaseClaim, DatabaseStrategy

from ..support.proxy import renewing_link, through_proxy
from ..support.waiting import wait_until

pytestmark = pytest.mark.django_db(databases=["default", "sqlite"], transaction=True)


@pytest.fixture
def keeper() -> LeaseKeeper:
    """A keeper of the test's own (its thread idles once the test's leases end)."""
    return LeaseKeeper()


def real_claim(alias: str, key: str = "lease") -> DatabaseClaim:
    attempt = Attempt(
        scope="user:1", key=key, fingerprint="f" * 64, ttl=60, lock_timeout=30, database=alias
    )
    claim = DatabaseStrategy().claim(attempt)
    assert isinstance(claim, DatabaseClaim)
    return claim


def locked_at(alias: str, pk: int) -> object:
    return IdempotencyKey.objects.using(alias).values_list("locked_at", flat=True).get(pk=pk)


def test_renews_due_leases(alias: str, keeper: LeaseKeeper) -> None:
    claim = real_claim(alias)
    IdempotencyKey.objects.using(alias).filter(pk=claim.pk).update(
        locked_at=timezone.now() - timedelta(seconds=20)
    )
    before = locked_at(alias, claim.pk)
    with keeper.keep(claim, 0.05) as lease:
        wait_until(lambda: lease.renewals >= 3)
        assert not lease.lost
        after = locked_at(alias, claim.pk)
        assert after > before  # type: ignore[operator]
        assert timezone.now() - after < timedelta(seconds=5)  # type: ignore[operator]
    assert lease not in keeper._leases
    count = lease.renewals
    assert claim.renew()  # the claim itself is still ours
    assert lease.renewals == count


def test_marks_the_lease_lost_when_the_token_changed(alias: str, keeper: LeaseKeeper) -> None:
    claim = real_claim(alias)
    with keeper.keep(claim, 0.05) as lease:
        thief = IdempotencyKey.objects.claim(
            "user:1", "lease", "f" * 64, ttl=60, lock_timeout=0, using=alias
        )
        assert thief.taken_over
        wait_until(lambda: lease.lost)
        row = IdempotencyKey.objects.using(alias).get(pk=claim.pk)
        assert row.claim_token == thief.token
    assert not claim.renew()


def test_several_leases_are_renewed_independently(alias: str, keeper: LeaseKeeper) -> None:
    fast, slow = real_claim(alias, "fast"), real_claim(alias, "slow")
    started = time.monotonic()
    with keeper.keep(fast, 0.02) as fast_lease, keeper.keep(slow, 0.5) as slow_lease:
        wait_until(lambda: fast_lease.renewals >= 5)
        slow_renewals, elapsed = slow_lease.renewals, time.monotonic() - started
        assert slow_renewals <= elapsed / 0.5 + 1  # each on its own schedule
    assert not keeper._leases


class _Flaky(Claim):
    """A claim whose first renewal fails (a dropped connection), to test the retry."""

    def __init__(self) -> None:
        self.calls = 0

    def renew(self) -> bool:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("dropped")
        return True

    def store(self, response: StoredResponse, *, commit: bool) -> None:  # pragma: no cover
        raise NotImplementedError

    def release(self) -> bool:  # pragma: no cover
        raise NotImplementedError


def test_a_failed_renewal_is_retried(keeper: LeaseKeeper) -> None:
    claim = _Flaky()
    with keeper.keep(claim, 0.02) as lease:
        wait_until(lambda: lease.renewals >= 2)
    assert claim.calls >= 3 and not lease.lost


def test_unrenewable_claims_and_zero_intervals_are_not_kept(keeper: LeaseKeeper) -> None:
    claim = _Flaky()
    claim.renewable = False
    with keeper.keep(claim, 0.01):
        assert not keeper._leases
    with keeper.keep(_Flaky(), 0):
        assert not keeper._leases
    assert keeper._thread is None


@pytest.mark.postgres
def test_the_keeper_gives_its_connection_back_when_idle(keeper: LeaseKeeper) -> None:
    claim = real_claim("default")
    with keeper.keep(claim, 0.02) as lease:
        wait_until(lambda: lease.renewals >= 1)
        wait_until(lambda: others_connected() >= 1)  # the keeper connected to renew
    wait_until(lambda: others_connected() == 0)
    assert keeper._thread is not None and keeper._thread.is_alive()


def others_connected() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    return int(row[0])


def test_a_keeper_thread_per_process(keeper: LeaseKeeper) -> None:
    with keeper.keep(_Flaky(), 10):
        first = keeper._thread
        with keeper.keep(_Flaky(), 10):
            assert keeper._thread is first
    assert isinstance(first, threading.Thread) and first.daemon


def _lease_age(pk: int) -> float:
    """Seconds since the row's lease was renewed, by the database's clock."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM now() - locked_at) "
            f"FROM {IdempotencyKey._meta.db_table} WHERE id = %s",
            [pk],
        )
        row = cursor.fetchone()
    return float(row[0])


@pytest.mark.postgres
def test_a_stalled_connection_does_not_stop_the_renewals(
    keeper: LeaseKeeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keeper's own persistent connection goes silent (a query sent, no answer, the
    socket open): the renewal is given up after half an interval and the leases are
    renewed on a new connection, long before they could lapse; the late answer changes
    nothing."""
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 600)
    with through_proxy("default") as proxy:
        claims = [real_claim("default", f"stalled-{n}") for n in range(3)]
        with ExitStack() as stack:
            leases = [stack.enter_context(keeper.keep(claim, 0.5)) for claim in claims]
            wait_until(lambda: all(lease.renewals >= 1 for lease in leases), timeout=30)
            stalled = renewing_link(proxy, timeout=30)
            stalled.silence()
            before = [lease.renewals for lease in leases]
            # Each lease renewed three times more while the old connection stays silent.
            wait_until(
                lambda: all(
                    lease.renewals >= n + 3 for lease, n in zip(leases, before, strict=True)
                ),
                timeout=60,
            )
            assert not stalled.closed and stalled.silent
            assert all(_lease_age(claim.pk) < 10 for claim in claims)
            assert not any(lease.lost for lease in leases)
            stalled.heal()
        assert all(claim.renew() for claim in claims)  # still ours


class _Gated(Claim):
    """A real claim whose renewal, once started, waits at a gate before it reaches the
    database: a renewal on its way when the view's response is stored."""

    def __init__(self, claim: DatabaseClaim) -> None:
        self.claim = claim
        self.started = threading.Event()
        self.gate = threading.Event()
        self.answers: list[bool] = []

    def renew(self) -> bool:
        self.started.set()
        self.gate.wait(timeout=60)
        renewed = self.claim.renew()
        self.answers.append(renewed)
        return renewed

    def store(self, response: StoredResponse, *, commit: bool) -> None:
        self.claim.store(response, commit=commit)

    def release(self) -> bool:  # pragma: no cover
        raise NotImplementedError


def test_a_renewal_that_meets_the_completion_is_no_lost_lease(
    alias: str, keeper: LeaseKeeper, caplog: pytest.LogCaptureFixture
) -> None:
    """The view ends (its lease given up) and its response is stored while a renewal is on
    its way: the renewal then finds the key completed, which is the request's own end, not a
    loss. No "lease lost" warning: an operator would look for a request that never ran
    twice."""
    gated = _Gated(real_claim(alias))
    with keeper.keep(gated, 0.02) as lease:
        assert gated.started.wait(timeout=60)
        renewer = renewer_thread(keeper)
    with transaction.atomic(using=alias):
        gated.store(StoredResponse(201, {}, b"{}"), commit=False)
    gated.gate.set()
    wait_until(lambda: lease.renewals == 1 and not lease.pending)
    assert gated.answers == [False]  # the renewal did meet the completed key
    assert not lease.lost
    assert not [r for r in caplog.records if r.thread == renewer and r.levelname == "WARNING"]


def renewer_thread(keeper: LeaseKeeper) -> int | None:
    """The id of the thread renewing ``keeper``'s leases (this test's own keeper: the logs
    of other tests' leases, renewed by other threads, are not this test's)."""
    renewer = keeper._renewer
    assert renewer is not None
    return renewer.thread.ident


class _GatedFailure(_Gated):
    """The same, whose renewal then fails (a connection dropped on its way)."""

    def renew(self) -> bool:
        self.started.set()
        self.gate.wait(timeout=60)
        raise ConnectionError("dropped")


def test_a_renewal_that_fails_after_its_request_ended_is_not_retried_or_logged(
    keeper: LeaseKeeper, caplog: pytest.LogCaptureFixture
) -> None:
    gated = _GatedFailure(real_claim("sqlite"))
    with keeper.keep(gated, 0.02) as lease:
        assert gated.started.wait(timeout=60)
        renewer = renewer_thread(keeper)
    gated.gate.set()
    wait_until(lambda: not lease.pending)
    assert not [r for r in caplog.records if r.thread == renewer and r.levelname == "WARNING"]
    assert lease.renewals == 0 and not lease.lost
