"""The lifecycle of a claimed key (``protocol.lifecycle``): the moves written down in
``TRANSITIONS`` are the only ones taken, and each path of a real claim on PostgreSQL ends
in the state that says what happened to the view's writes and to the key."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models.functions import Now

from django_idempotency.errors import LeaseLost
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.lifecycle import TRANSITIONS, Lifecycle, State
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.status import COMPLETED
from django_idempotency.strategies.base import Attempt, InProgress
from django_idempotency.strategies.db import DatabaseStrategy

from ..support.waiting import wait_until
from ..testapp.models import SideEffect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RESPONSE = StoredResponse(201, {"Content-Type": "application/json"}, b'{"ok": true}')
FINAL = {state for state, moves in TRANSITIONS.items() if not moves}


def attempt(key: str, **more: object) -> Attempt:
    values: dict[str, object] = {
        "scope": "user:1",
        "key": key,
        "fingerprint": "f" * 64,
        "ttl": 60.0,
        "lock_timeout": 30.0,
        "database": "default",
    }
    values.update(more)
    return Attempt(**values)  # type: ignore[arg-type]


def test_every_state_is_reached_from_claimed_and_every_path_ends() -> None:
    assert set(TRANSITIONS) == set(State)
    reached, todo = {State.CLAIMED}, [State.CLAIMED]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    assert reached == set(State)
    assert {
        State.COMMITTED,
        State.AWAITING_OUTER_COMMIT,
        State.GIVEN_BACK,
        State.LOST,
        State.SUPERSEDED,
        State.SETTLED,
        State.UNKNOWN,
    } == FINAL


def test_a_move_that_is_not_written_down_is_refused() -> None:
    lifecycle = Lifecycle(DatabaseStrategy(), attempt("k"))
    lifecycle._move(State.CLAIMED)
    lifecycle._move(State.RUNNING)
    lifecycle._move(State.COMPLETED)
    lifecycle._move(State.COMMITTED)
    with pytest.raises(AssertionError, match="COMMITTED -> GIVEN_BACK"):
        lifecycle._move(State.GIVEN_BACK)


def run(key: str, step: str, **more: object) -> Lifecycle:
    """One request's lifecycle on the db strategy: the view writes a row, then ``step``."""
    with Lifecycle(DatabaseStrategy(), attempt(key, **more)) as lifecycle:
        assert lifecycle.claimed
        SideEffect.objects.create(label=key)
        if step == "complete":
            lifecycle.complete(RESPONSE)
        elif step == "release":
            lifecycle.release()
        elif step == "doom":  # DRF after an APIException with ATOMIC_REQUESTS
            transaction.set_rollback(True)
            lifecycle.complete(RESPONSE)
    return lifecycle


def status(key: str) -> str | None:
    row = IdempotencyKey.objects.filter(key=key).values_list("status", flat=True).first()
    return None if row is None else str(row)


def test_completed_then_committed() -> None:
    key = uuid.uuid4().hex
    assert run(key, "complete").state is State.COMMITTED
    assert status(key) == COMPLETED and SideEffect.objects.filter(label=key).exists()


def test_released_is_given_back_with_the_writes_rolled_back() -> None:
    key = uuid.uuid4().hex
    assert run(key, "release").state is State.GIVEN_BACK
    assert status(key) is None and not SideEffect.objects.filter(label=key).exists()


def test_neither_completed_nor_released_is_given_back() -> None:
    key = uuid.uuid4().hex
    assert run(key, "nothing").state is State.GIVEN_BACK
    assert status(key) is None


def test_an_exception_in_the_view_gives_the_key_back() -> None:
    key = uuid.uuid4().hex
    lifecycle = Lifecycle(DatabaseStrategy(), attempt(key))

    def failing_view() -> None:
        with lifecycle:
            SideEffect.objects.create(label=key)
            raise RuntimeError("the view failed")

    with pytest.raises(RuntimeError):
        failing_view()
    assert lifecycle.state is State.GIVEN_BACK
    assert status(key) is None and not SideEffect.objects.filter(label=key).exists()


def test_a_doomed_transaction_stores_the_response_after_its_rollback() -> None:
    key = uuid.uuid4().hex
    assert run(key, "doom").state is State.COMMITTED
    assert status(key) == COMPLETED and not SideEffect.objects.filter(label=key).exists()


def test_inside_the_projects_transaction_it_waits_for_that_commit() -> None:
    key = uuid.uuid4().hex
    with transaction.atomic():
        lifecycle = run(key, "complete")
        assert lifecycle.state is State.AWAITING_OUTER_COMMIT and not lifecycle.committed
    assert status(key) == COMPLETED


def test_a_duplicate_gets_the_outcome_and_no_state() -> None:
    key = uuid.uuid4().hex
    with Lifecycle(DatabaseStrategy(), attempt(key)) as first:
        with Lifecycle(DatabaseStrategy(), attempt(key)) as duplicate:
            assert isinstance(duplicate.outcome, InProgress) and not duplicate.claimed
        assert duplicate.state is None
        first.complete(RESPONSE)


def test_a_claim_taken_over_ends_lost_and_keeps_the_other_execution() -> None:
    key = uuid.uuid4().hex
    stale = Lifecycle(DatabaseStrategy(), attempt(key, lock_timeout=0.05))

    def other() -> None:
        # Another execution takes the stale lease over, completes and commits, on its
        # own connection (a thread of its own), once the lease has lapsed by the
        # database's clock (the one the claim judges it by).
        lapsed = Now() - timedelta(seconds=0.05)
        stale_now = IdempotencyKey.objects.filter(key=key, locked_at__lt=lapsed).exists
        wait_until(stale_now, timeout=60)
        run(key, "complete", lock_timeout=0.05)

    def stale_view() -> None:
        with stale:
            SideEffect.objects.create(label="stale")
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
            stale.complete(RESPONSE)

    with pytest.raises(LeaseLost):
        stale_view()
    assert stale.state is State.LOST
    assert status(key) == COMPLETED
    labels = SideEffect.objects.filter(label__in=["stale", key]).values_list("label", flat=True)
    assert list(labels) == [key]
