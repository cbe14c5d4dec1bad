"""The db and advisory_lock strategies on a key table partitioned by expiry (PostgreSQL):
whole requests through the decorator, the essentials of their plain-table tests (the claim,
the replay, the mismatch, the release, the takeover of a stale claim, the retake of an
expired key) and a race of real threads whose side effects are counted."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import Client, override_settings
from django.utils import timezone

from django_idempotency.errors import StoreUnavailable
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.replay import REPLAYED_HEADER, StoredResponse
from django_idempotency.strategies.advisory import AdvisoryClaim
from django_idempotency.strategies.base import Attempt, store_failed

from ..support.api import advisory_waiters, race_held
from ..support.assertions import assert_problem
from ..support.partitions import SMALL, partitioned_table
from ..testapp import views
from ..testapp.models import SideEffect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["default"], transaction=True)]


@pytest.fixture(params=["db", "advisory_lock"])
def strategy(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each strategy in turn, on the partitioned table."""
    with partitioned_table({**SMALL, "STRATEGY": request.param}):
        yield str(request.param)


def post(data: Any, key: str = "k1") -> Any:
    return Client(raise_request_exception=False).post(
        "/t/fn/", json.dumps(data), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def runs(key_label: str = "fn") -> int:
    return SideEffect.objects.filter(label=key_label).count()


def test_completes_replays_and_rejects_another_request(strategy: str) -> None:
    first = post({"a": 1})
    assert first.status_code == 201
    replay = post({"a": 1})
    assert replay.content == first.content and replay[REPLAYED_HEADER] == "true"
    assert_problem(post({"a": 2}), 422, "key-reused")
    assert runs() == 1
    assert IdempotencyKey.objects.filter(key="k1").count() == 1


def test_a_server_error_releases_the_key_and_the_retry_runs(strategy: str) -> None:
    assert post({"status": 500}).status_code == 500
    assert post({"status": 201}).status_code == 201
    assert runs() == 1  # the failed run's writes rolled back with it
    assert IdempotencyKey.objects.filter(key="k1").count() == 1


def test_an_expired_key_runs_again_in_a_later_partition(strategy: str) -> None:
    assert post({"a": 1}).status_code == 201
    IdempotencyKey.objects.filter(key="k1").update(expires_at=timezone.now())
    again = post({"a": 1})
    assert again.status_code == 201 and REPLAYED_HEADER not in again
    assert runs() == 2
    assert IdempotencyKey.objects.filter(key="k1").count() == 1


def test_a_stale_claim_is_taken_over() -> None:
    """A claim whose owner died (db strategy): the retry takes it over, into a new row."""
    with partitioned_table({**SMALL, "STRATEGY": "db"}):
        assert post({"a": 1}).status_code == 201
        old = IdempotencyKey.objects.get(key="k1")
        IdempotencyKey.objects.filter(pk=old.pk).update(
            status="in_progress", locked_at=timezone.now() - timedelta(seconds=6)
        )
        again = post({"a": 1})
        assert again.status_code == 201 and REPLAYED_HEADER not in again
        assert runs() == 2
        (row,) = IdempotencyKey.objects.filter(key="k1")
        assert row.pk != old.pk and row.status == "completed"


def test_racing_requests_run_the_view_once(strategy: str) -> None:
    for round_ in range(5):
        key = f"race-{round_}"

        def send(_i: int, body: dict[str, Any], key: str = key) -> int:
            return int(post(body, key=key).status_code)

        # The first one runs until the others are answered or queue on its lock.
        statuses = race_held(8, send, uuid.uuid4().hex, advisory_waiters)
        assert statuses.count(201) >= 1, statuses
        assert set(statuses) <= {201, 409}, statuses
        assert IdempotencyKey.objects.filter(key=key).count() == 1
    assert runs() == 5


# -- an expiry that no partition holds -----------------------------------------------------------

#: A TTL past the partitions ahead (``AHEAD``, 40 s): no partition holds the key's expiry.
FAR = {"TTL": 3600}


@pytest.fixture
def bodies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every run of the test view's body, counted outside every transaction (a row of
    SideEffect rolls back with the view's writes)."""
    ran: list[str] = []
    behave = views._behave

    def counted(label: str, payload: dict[str, Any]) -> Any:
        ran.append(label)
        return behave(label, payload)

    monkeypatch.setattr(views, "_behave", counted)
    return ran


def test_a_claim_past_the_last_partition_is_503_with_retry_after_before_the_view(
    strategy: str, bodies: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """docs/operations.md: such a claim is a 503 with Retry-After, and the log names the fix.
    The view does not run (with advisory_lock it used to run, and fail at its completion),
    nothing is stored, and once the partitions reach far enough the retry runs."""
    with override_settings(IDEMPOTENCY={**SMALL, "STRATEGY": strategy, **FAR}):
        response = post({"a": 1})
    assert_problem(response, 503, "store-unavailable")
    assert response["Retry-After"] == "1"
    assert "no partition" in caplog.text and "purge_idempotency_keys" in caplog.text
    assert bodies == []
    assert not IdempotencyKey.objects.filter(key="k1").exists()
    assert post({"a": 1}).status_code == 201  # the TTL the partitions hold
    assert bodies == ["fn"]


def test_queued_duplicates_past_the_last_partition_never_run_the_view(
    strategy: str, bodies: list[str]
) -> None:
    """Duplicates that queue on the key (advisory_lock's wait for the lock) each find the
    missing partition before the view: none runs it."""
    with override_settings(IDEMPOTENCY={**SMALL, "STRATEGY": strategy, **FAR}):

        def send(_i: int, body: dict[str, Any]) -> tuple[int, str | None]:
            response = post(body, key="queued")
            return int(response.status_code), response.get("Retry-After")

        # A view that ran (it must not) would wait until the others queue on its lock.
        answers = race_held(4, send, uuid.uuid4().hex, advisory_waiters)
    assert answers == [(503, "1")] * 4
    assert bodies == []


def test_a_completion_past_the_last_partition_is_503_with_retry_after(strategy: str) -> None:
    """The completion's expiry is its own now plus the TTL: should no partition hold it,
    the 503 carries Retry-After too, whether the completion also commits or not."""
    from django.db import IntegrityError

    with pytest.raises(IntegrityError) as info:
        IdempotencyKey.objects.store_completed(
            "user:1", "far", "a" * 64, StoredResponse(201, {}, b""), ttl=3600
        )
    for committing in (False, True):
        error = store_failed(info.value, committing=committing)
        assert isinstance(error, StoreUnavailable) and error.retry_after == 1


def test_a_response_stored_after_a_rollback_past_the_last_partition_is_503() -> None:
    """advisory_lock stores the response of a view whose transaction rolled back in a
    transaction of its own: should no partition hold its expiry by then, that too is a 503
    with Retry-After, not the database's error."""
    far = Attempt("user:1", "pending", "a" * 64, ttl=3600, lock_timeout=5)
    with (
        partitioned_table({**SMALL, "STRATEGY": "advisory_lock"}),
        pytest.raises(StoreUnavailable) as info,
    ):
        AdvisoryClaim(far).store_pending(StoredResponse(201, {}, b""))
    assert info.value.retry_after == 1


def test_a_view_in_steps_resumes_on_the_partitioned_table(strategy: str) -> None:
    """The key given back after a failed step is taken over into a new row (``db``) or
    resumed in place (``advisory_lock``), with the steps that committed and the time of
    its first claim."""
    views.FAIL_ONCE["parts"] = "record"
    body = json.dumps({"label": "parts"})

    def send() -> Any:
        return Client(raise_request_exception=False).post(
            "/t/steps/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="s1"
        )

    assert send().status_code == 500
    hour_ago = timezone.now() - timedelta(hours=1)
    IdempotencyKey.objects.filter(key="s1").update(created_at=hour_ago)
    retry = send()
    assert retry.status_code == 201, retry.content
    assert retry.json()["resumed"] is True
    # The first claim's time goes over to the new row (DOWNSTREAM_KEY_LIFETIME counts from it).
    assert IdempotencyKey.objects.get(key="s1").created_at == hour_ago
    labels = sorted(
        SideEffect.objects.filter(label__startswith="parts:").values_list("label", flat=True)
    )
    assert labels == ["parts:create", "parts:receipt", "parts:record"]
    (row,) = IdempotencyKey.objects.filter(key="s1")
    assert row.status == "completed" and row.recovery_point == "receipt"


def test_a_partition_drop_keeps_a_key_left_with_steps_and_its_retry_resumes(
    strategy: str,
) -> None:
    """A key given back after a failed step, its lease lapsed and its TTL over, in a
    partition that ended, beside a completed key that expired there: the maintenance drops
    the partition and the completed key with it, after moving the key with steps to a live
    partition (a drop that took it made its retry a new request, which ran the committed
    step again); the retry resumes it."""
    from django_idempotency.store import partitions

    from ..support.partitions import past_partition

    views.FAIL_ONCE["drop"] = "record"

    def send(key: str = "s1", label: str = "drop") -> Any:
        return Client(raise_request_exception=False).post(
            "/t/steps/",
            json.dumps({"label": label}),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
        )

    assert send().status_code == 500
    assert send("done", "other").status_code == 201
    lower, upper = past_partition()
    IdempotencyKey.objects.update(expires_at=lower, locked_at=lower)
    done = partitions.maintain("default")
    assert partitions.partition_name(partitions.table(), lower) in done.dropped
    assert not done.deferred
    (kept,) = IdempotencyKey.objects.all()
    assert (kept.key, kept.recovery_point) == ("s1", "create")
    assert kept.expires_at > upper
    # Still expired where it was moved: the purge's count of the keys it keeps sees it.
    assert list(IdempotencyKey.objects.unfinished().values_list("key", flat=True)) == ["s1"]
    retry = send()
    assert retry.status_code == 201, retry.content
    assert retry.json()["resumed"] is True
    assert SideEffect.objects.filter(label="drop:create").count() == 1


def test_a_steps_record_keeps_its_key_a_lease_ahead() -> None:
    """A step recorded by an owner whose key's expiry has passed (a request that outlived
    its TTL, its row in a partition that ended) moves the expiry a lease ahead, as a renewal
    does: a key in progress with steps is never left in a partition the maintenance drops,
    even when it got them after the maintenance moved such keys out."""
    from django_idempotency.store.clock import database_now
    from django_idempotency.strategies.stepped import StepClaim, SteppedDatabaseStrategy

    from ..support.partitions import past_partition

    with partitioned_table({**SMALL, "STRATEGY": "db"}):
        lease = 30  # seconds, within the partitions ahead
        claim = SteppedDatabaseStrategy().claim(
            Attempt(
                scope="user:1",
                key="late",
                fingerprint="f" * 64,
                ttl=10,
                lock_timeout=lease,
                database="default",
            )
        )
        assert isinstance(claim, StepClaim)
        lower, upper = past_partition()
        IdempotencyKey.objects.filter(pk=claim.pk).update(expires_at=lower)
        before = database_now(connections["default"])
        claim.record([{"name": "create", "kind": "local", "result": 1}], "create")
        row = IdempotencyKey.objects.get(pk=claim.pk)
        assert row.recovery_point == "create"
        assert row.expires_at >= before + timedelta(seconds=lease) > upper
