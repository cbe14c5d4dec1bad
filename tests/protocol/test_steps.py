"""Steps with recovery points (docs/steps.md), in whole requests on the real PostgreSQL
server, under ``db`` and ``advisory_lock``: a view that fails at each step resumes on the
retry after the steps that committed, with one effect per step; a step of a claim that was
taken over is refused and rolled back; fingerprint, replay and unsupported strategies."""

from __future__ import annotations

import io
import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import connections, transaction
from django.db.models.functions import Now
from django.test import Client, override_settings
from django.urls import reverse

from django_idempotency.decorators import idempotent
from django_idempotency.errors import InvalidConfiguration, StoreUnavailable
from django_idempotency.models import IdempotencyKey
from django_idempotency.values.attempt import Attempt

from ..support.assertions import assert_problem
from ..support.factories import ExpiredKeyFactory, StaleKeyFactory
from ..support.services import REDIS_URL
from ..testapp import holds, views
from ..testapp.models import SideEffect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

URL = "/t/steps/"
STEPS = ["create", "call", "record", "receipt"]


@pytest.fixture(params=["db", "advisory_lock"])
def strategy(request: pytest.FixtureRequest) -> Iterator[str]:
    # A lease that lapses at once: a retry after an exception takes the key over at once
    # either way (the key is given back), and a test that makes the lease lapse need not wait.
    with override_settings(IDEMPOTENCY={"STRATEGY": request.param, "LOCK_TIMEOUT": 30}):
        views.REMOTE_CALLS.clear()
        yield str(request.param)


def post(key: str, url: str = URL, **payload: Any) -> Any:
    client = Client(raise_request_exception=False)
    return client.post(
        url, json.dumps(payload), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def effects(label: str) -> Counter[str]:
    return Counter(
        name.split(":", 1)[1]
        for name in SideEffect.objects.filter(label__startswith=label + ":").values_list(
            "label", flat=True
        )
    )


def row(key: str) -> IdempotencyKey:
    return IdempotencyKey.objects.get(key=key)


def names(key: str) -> list[str]:
    """The steps the key's row records, in order."""
    steps = row(key).steps
    assert isinstance(steps, dict)
    return [step["name"] for step in steps["done"]]


def test_a_view_in_steps_runs_each_once_and_replays(strategy: str) -> None:
    first = post("k1", label="a")
    assert first.status_code == 201, first.content
    assert effects("a") == {"create": 1, "record": 1, "receipt": 1}
    assert len(views.REMOTE_CALLS) == 1
    key = row("k1")
    assert key.status == "completed" and key.recovery_point == "receipt"
    assert names("k1") == STEPS
    replay = post("k1", label="a")
    assert replay.status_code == 201 and replay.content == first.content
    assert effects("a") == {"create": 1, "record": 1, "receipt": 1}


@pytest.mark.parametrize("fail", ["create", "call", "after-call", "record", "receipt"])
def test_a_retry_after_a_failed_step_resumes_after_the_steps_that_committed(
    strategy: str, fail: str
) -> None:
    views.FAIL_ONCE["b"] = fail
    failed = post("k1", label="b")
    assert failed.status_code == 500
    done = row("k1").steps if IdempotencyKey.objects.filter(key="k1").exists() else None
    retry = post("k1", label="b")
    assert retry.status_code == 201, retry.content
    # The failed step's writes rolled back; each step took effect once, in order.
    assert effects("b") == {"create": 1, "record": 1, "receipt": 1}
    downstream = {call[0] for call in views.REMOTE_CALLS}
    assert len(downstream) == 1, "the remote step had one downstream key on every attempt"
    assert names("k1") == STEPS
    body = retry.json()
    assert body["resumed"] is (done is not None and bool(done["done"]))
    assert SideEffect.objects.get(label="b:create").pk == body["created"]


def test_a_step_of_a_claim_taken_over_is_refused_and_rolled_back(strategy: str) -> None:
    label = f"c-{strategy}"  # a hold of its own for each run (a released hold stays open)

    def take_over() -> None:
        # Another execution took the key over while the view ran its second local step.
        wait_for_key()
        IdempotencyKey.objects.filter(key="k1").update(claim_token=uuid.uuid4())
        connections.close_all()
        holds.release(f"{label}:record")

    thief = threading.Thread(target=take_over)
    thief.start()
    response = post("k1", label=label, hold="record")
    thief.join()
    assert_problem(response, 409, "lease-lost")
    assert effects(label) == {"create": 1}, "the refused step rolled back"
    assert row("k1").recovery_point == "create"


def wait_for_key() -> None:
    from ..support.waiting import wait_until

    wait_until(lambda: IdempotencyKey.objects.filter(key="k1", recovery_point="create").exists())
    connections.close_all()


def test_another_request_with_a_used_key_is_refused_after_a_crash(strategy: str) -> None:
    views.FAIL_ONCE["d"] = "record"
    assert post("k1", label="d").status_code == 500
    assert_problem(post("k1", label="other"), 422, "key-reused")
    retry = post("k1", label="d")
    assert retry.status_code == 201, retry.content
    assert effects("d") == {"create": 1, "record": 1, "receipt": 1}


def test_a_strategy_that_cannot_run_steps_is_a_503_not_a_500() -> None:
    # Valid settings whose strategy keeps its claims in Redis (nothing is sent to it).
    with override_settings(IDEMPOTENCY={"STRATEGY": "redis", "REDIS_URL": REDIS_URL}):
        response = post("k1", label="e")
    assert_problem(response, 503, "store-unavailable")
    assert effects("e") == Counter()


def test_a_view_with_steps_under_redis_is_refused_at_declaration() -> None:
    with pytest.raises(InvalidConfiguration, match="E090"):
        idempotent(steps=True, strategy="redis")(views._stepped)


def test_a_drf_view_with_idempotency_steps_resumes_too(strategy: str) -> None:
    views.FAIL_ONCE["f"] = "record"
    assert post("k1", "/t/steps/drf/", label="f").status_code == 500
    retry = post("k1", "/t/steps/drf/", label="f")
    assert retry.status_code == 201, retry.content
    assert retry.json()["resumed"] is True
    assert effects("f") == {"create": 1, "record": 1, "receipt": 1}
    assert names("k1") == STEPS
    replay = post("k1", "/t/steps/drf/", label="f")
    assert replay.status_code == 201 and replay.content == retry.content


STORED = {"fingerprint": "f" * 64, "done": [{"name": "create", "kind": "local", "result": 7}]}


def test_a_takeover_keeps_a_stale_claims_steps_and_clears_an_expired_keys() -> None:
    stale = StaleKeyFactory(fingerprint="f" * 64, recovery_point="create", steps=STORED)
    expired = ExpiredKeyFactory(fingerprint="f" * 64, recovery_point="create", steps=STORED)
    for found in (stale, expired):
        claimed = IdempotencyKey.objects.claim(
            found.scope, found.key, "f" * 64, ttl=60, lock_timeout=30
        )
        assert claimed.taken_over and claimed.pk == found.pk
    stale.refresh_from_db()
    expired.refresh_from_db()
    assert (stale.recovery_point, stale.steps) == ("create", STORED)
    assert (expired.recovery_point, expired.steps) == (None, None)


def test_a_stale_claim_with_steps_is_never_taken_over_by_other_content() -> None:
    """A request with other content finds a crashed request's steps: it is answered as a
    reused key (``422``) without touching the row. Taking the row over first (and handing it
    back) showed its fingerprint in the row meanwhile, so that the crashed request's own
    retry, arriving then, was answered ``422`` too and gave up on a payment half done; and
    a view without steps under the same key completed the row over those steps."""
    from django_idempotency.store.records import ClaimState

    stale = StaleKeyFactory(key="k1", fingerprint="f" * 64, recovery_point="create", steps=STORED)
    other = IdempotencyKey.objects.claim(stale.scope, "k1", "e" * 64, ttl=60, lock_timeout=30)
    assert other.state is ClaimState.MISMATCH
    row = IdempotencyKey.objects.get(pk=stale.pk)
    assert (row.claim_token, row.fingerprint, row.steps) == (stale.claim_token, "f" * 64, STORED)
    own = IdempotencyKey.objects.claim(stale.scope, "k1", "f" * 64, ttl=60, lock_timeout=30)
    assert own.state is ClaimState.CLAIMED and own.taken_over and own.pk == stale.pk


def test_a_takeover_whose_steps_cannot_be_read_keeps_them_for_the_next_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read of the steps a takeover found fails (the database errs on that statement
    alone): the request is answered 503 and the row is handed back with its steps, never
    deleted with them, so that the next retry resumes after them."""
    from django.db import OperationalError

    from django_idempotency.strategies import stepped

    stale = StaleKeyFactory(key="k1", fingerprint="f" * 64, recovery_point="create", steps=STORED)
    attempt = Attempt(scope=stale.scope, key="k1", fingerprint="f" * 64, ttl=60, lock_timeout=30)

    def fails(*args: Any) -> None:
        raise OperationalError("canceling statement due to statement timeout")

    monkeypatch.setattr(stepped, "load_state", fails)
    with pytest.raises(StoreUnavailable):
        stepped.SteppedDatabaseStrategy().claim(attempt)
    stale.refresh_from_db()
    assert (stale.status, stale.recovery_point, stale.steps) == ("in_progress", "create", STORED)
    monkeypatch.undo()
    resumed = stepped.SteppedDatabaseStrategy().claim(attempt)
    assert isinstance(resumed, stepped.StepClaim) and resumed.done == STORED["done"]
    resumed.release()


def test_the_admin_shows_a_keys_recovery_point_and_steps(admin_client: Client) -> None:
    key = StaleKeyFactory(recovery_point="create", steps=STORED)
    page = admin_client.get(
        reverse("admin:django_idempotency_idempotencykey_change", args=[key.pk])
    ).content.decode()
    assert "Recovery point" in page and ">create<" in page
    assert "<li>local <strong>create</strong>: <code>7</code></li>" in page


def test_steps_inside_a_transaction_of_the_projects_are_a_503(strategy: str) -> None:
    """Its steps would commit only with that transaction: refused at the first step, with
    nothing of it kept."""
    with transaction.atomic():
        response = post("k1", label="g")
    assert_problem(response, 503, "store-unavailable")
    assert effects("g") == Counter()
    assert not IdempotencyKey.objects.filter(key="k1").exists()


def test_a_step_marked_for_rollback_is_a_503_and_not_recorded(strategy: str) -> None:
    response = post("k1", "/t/steps/doomed/")
    assert_problem(response, 503, "store-unavailable")
    assert effects("doomed") == {"create": 1}
    assert names("k1") == ["create"]  # kept for the retry, without the rolled-back step


def release_in_admin(client: Client, key: IdempotencyKey) -> Any:
    data = {"action": "release_stuck_keys", "_selected_action": [str(key.pk)], "post": "yes"}
    return client.post(reverse("admin:django_idempotency_idempotencykey_changelist"), data)


def test_releasing_a_key_with_steps_keeps_them_for_its_retry(
    strategy: str, admin_client: Client
) -> None:
    """The admin's release gives the claim back instead of deleting the row: the retry
    takes it over at once and resumes after the steps that committed."""
    views.FAIL_ONCE["h"] = "record"
    assert post("k1", label="h").status_code == 500
    # As a crashed worker leaves it: in progress under a live lease, one step committed.
    IdempotencyKey.objects.filter(key="k1").update(locked_at=Now())
    stuck = row("k1")
    assert (stuck.status, stuck.recovery_point) == ("in_progress", "create")
    assert release_in_admin(admin_client, stuck).status_code == 302
    released = row("k1")
    assert (released.recovery_point, released.steps) == ("create", stuck.steps)
    assert released.claim_token != stuck.claim_token
    retry = post("k1", label="h")
    assert retry.status_code == 201, retry.content
    assert retry.json()["resumed"] is True
    assert effects("h") == {"create": 1, "record": 1, "receipt": 1}
    assert names("k1") == STEPS


def test_the_release_confirmation_says_a_key_with_steps_keeps_them(admin_client: Client) -> None:
    stale = StaleKeyFactory(recovery_point="create", steps=STORED)
    plain = StaleKeyFactory()
    data = {"action": "release_stuck_keys", "_selected_action": [str(stale.pk), str(plain.pk)]}
    page = admin_client.post(
        reverse("admin:django_idempotency_idempotencykey_changelist"), data
    ).content.decode()
    assert "1 selected key has a recovery point: it is not deleted" in page
    release_in_admin(admin_client, stale)
    release_in_admin(admin_client, plain)
    kept = IdempotencyKey.objects.get(pk=stale.pk)
    assert (kept.status, kept.recovery_point, kept.steps) == ("in_progress", "create", STORED)
    assert kept.claim_token != stale.claim_token
    assert not IdempotencyKey.objects.filter(pk=plain.pk).exists()
    entry = LogEntry.objects.get(object_id=str(stale.pk))
    assert entry.action_flag == CHANGE and "recovery point" in entry.get_change_message()


def purge_in_admin(client: Client, key: str) -> str:
    """The admin's purge action on ``key``; the page it leads to."""
    data = {
        "action": "purge_expired_keys",
        "_selected_action": [str(row(key).pk)],
        "post": "yes",
    }
    url = reverse("admin:django_idempotency_idempotencykey_changelist")
    return str(client.post(url, data, follow=True).content.decode())


def purge_every_way(client: Client) -> None:
    """The command, the task and the admin's action on ``k1``, each in turn."""
    from django.core.management import call_command

    from django_idempotency.tasks import purge_expired_keys

    out = io.StringIO()
    call_command("purge_idempotency_keys", stdout=out)
    assert "Kept 1 key in progress with steps whose TTL is over" in out.getvalue()
    assert purge_expired_keys() == 0
    page = purge_in_admin(client, "k1")
    assert "1 key is in progress with steps and was kept" in page


def test_the_purge_never_deletes_a_key_left_in_progress_with_steps(
    strategy: str, admin_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A key left in progress with a committed step, its lease lapsed and its TTL long over:
    the purge (command, task, admin action) leaves it, since a request claiming its key
    afresh would run that step again; the retry resumes it. Completed, its TTL over, it is
    purged like any key."""
    from django_idempotency.tasks import purge_expired_keys

    views.FAIL_ONCE["p"] = "record"
    assert post("k1", label="p").status_code == 500
    # k1: in progress, lease lapsed long ago (the claim was given back), one step done.
    IdempotencyKey.objects.filter(key="k1").update(expires_at=Now() - timedelta(days=2))
    purge_every_way(admin_client)
    assert row("k1").recovery_point == "create"
    # Said at WARNING after each purge (the command's and the task's), for the operator.
    warned = [
        r for r in caplog.records if getattr(r, "idempotency_outcome", "") == "unfinished_kept"
    ]
    assert len(warned) == 2 and all(r.levelname == "WARNING" for r in warned)
    retry = post("k1", label="p")
    assert retry.status_code == 201 and retry.json()["resumed"] is True
    assert effects("p") == {"create": 1, "record": 1, "receipt": 1}
    IdempotencyKey.objects.filter(key="k1").update(expires_at=Now() - timedelta(seconds=1))
    assert purge_expired_keys() == 1
    assert not IdempotencyKey.objects.filter(key="k1").exists()


def test_a_retry_after_the_ttl_of_a_key_left_with_steps_resumes_it(strategy: str) -> None:
    """A key left in progress with a committed step, its TTL over but not purged yet: the
    retry resumes after that step under either strategy, as before its TTL (``db``'s
    takeover keeps a stale claim's steps; ``advisory_lock`` reads such a row as absent and
    claims through the same takeover, which must then load those steps too)."""
    views.FAIL_ONCE["x"] = "record"
    assert post("k1", label="x").status_code == 500
    IdempotencyKey.objects.filter(key="k1").update(expires_at=Now() - timedelta(seconds=1))
    retry = post("k1", label="x")
    assert retry.status_code == 201, retry.content
    assert retry.json()["resumed"] is True
    assert effects("x") == {"create": 1, "record": 1, "receipt": 1}
    assert names("k1") == STEPS


def test_a_resumed_request_whose_step_outlasts_its_lease_keeps_its_key_from_the_purge(
    strategy: str,
) -> None:
    """A step that outlasts ``LOCK_TIMEOUT`` while the key's ``TTL`` is over: the running
    request's lease is renewed under either strategy, so the purge, which keeps a key in
    progress under a live lease, leaves it and the request completes with each step once
    (a purge that deleted the key under its running owner made the next step 409 and the
    retry after it run the committed steps again). The purge is judged at an instant after
    the key's expiry, with the lease it saw at the resume: a lease renewed since is live."""
    from django_idempotency.store.clock import DatabaseNow

    from ..support.threads import in_background
    from ..support.waiting import wait_until

    label = f"purged-{strategy}"
    views.FAIL_ONCE[label] = "record"
    # The same body every time (a hold in the last step, which the first never reaches).
    assert post("k1", label=label, hold="receipt").status_code == 500  # given back, 1 step
    keys = IdempotencyKey.objects.filter(key="k1")
    with override_settings(IDEMPOTENCY={"STRATEGY": strategy, "HEARTBEAT_INTERVAL": 0.05}):
        retry = in_background(lambda: post("k1", label=label, hold="receipt"))
        wait_until(lambda: holds.arrived(f"{label}:receipt") == 1, timeout=60)
        resumed_at = keys.get().locked_at
        assert resumed_at is not None
        wait_until(lambda: keys.filter(locked_at__gt=resumed_at).exists(), timeout=60)  # renewed
        now = keys.annotate(now=DatabaseNow()).values_list("now", flat=True).get()
        purged = list(
            IdempotencyKey.objects.iter_delete_expired(
                batch_size=100, cutoff=now + timedelta(days=2), lease_cutoff=resumed_at
            )
        )
        holds.release(f"{label}:receipt")
        answer = retry.result(timeout=60)
    assert sum(purged) == 0 and keys.exists()
    assert answer.status_code == 201, answer.content
    assert answer.json()["resumed"] is True
    assert effects(label) == {"create": 1, "record": 1, "receipt": 1}


def test_a_first_step_that_outlasts_heartbeats_loses_no_lease(strategy: str) -> None:
    """Heartbeats while the first step runs: under ``advisory_lock`` the claim's row commits
    with that step and is seen by no other connection before it, and the lease is not
    "lost" meanwhile (it was, and a warning said so); the request completes as usual."""
    from django_idempotency.protocol.lease import Lease, keeper

    from ..support.threads import in_background
    from ..support.waiting import wait_until

    label, key = f"first-{strategy}", f"first-{uuid.uuid4()}"

    def own_lease() -> Lease | None:
        """This request's lease, once it has been renewed three times."""
        found = [lease for lease in set(keeper._leases) if lease.claim.attempt.key == key]
        return found[0] if found and found[0].renewals >= 3 else None

    with override_settings(IDEMPOTENCY={"STRATEGY": strategy, "HEARTBEAT_INTERVAL": 0.05}):
        run = in_background(lambda: post(key, label=label, hold="create"))
        wait_until(lambda: holds.arrived(f"{label}:create") == 1, timeout=60)
        wait_until(lambda: own_lease() is not None, timeout=60)
        lease = own_lease()
        # Read while the first step still runs (a renewal that meets the completion may
        # find the key completed, and is no loss of a running request).
        lost = None if lease is None else lease.lost
        holds.release(f"{label}:create")
        answer = run.result(timeout=60)
    assert lost is False
    assert answer.status_code == 201, answer.content
    assert effects(label) == {"create": 1, "record": 1, "receipt": 1}


def test_a_key_released_while_its_request_still_runs_has_each_step_once() -> None:
    """Under ``db``: the request is held in its second local step when the key is released;
    the retry (the same request) takes the key over at once and reaches the same step; both
    are let go together: the first request's step is fenced (409 lease-lost) and rolled
    back, the retry completes. Each step took effect once."""
    from ..support.waiting import wait_until

    label = "released-live"
    answers: dict[str, Any] = {}

    def send(name: str) -> None:
        try:
            answers[name] = post("k1", label=label, hold="record")
        finally:
            connections.close_all()

    with override_settings(IDEMPOTENCY={"STRATEGY": "db", "LOCK_TIMEOUT": 30}):
        views.REMOTE_CALLS.clear()
        first = threading.Thread(target=send, args=("first",))
        first.start()
        wait_for_key()  # the first step committed; the request waits in the second
        assert IdempotencyKey.objects.release_stuck() == 1
        retry = threading.Thread(target=send, args=("retry",))
        retry.start()
        # The retry took the key over and called the provider: it is at the held step too.
        wait_until(lambda: len(views.REMOTE_CALLS) == 2, timeout=60)
        holds.release(f"{label}:record")
        first.join()
        retry.join()
    assert answers["retry"].status_code == 201, answers["retry"].content
    assert answers["retry"].json()["resumed"] is True
    assert_problem(answers["first"], 409, "lease-lost")
    assert effects(label) == {"create": 1, "record": 1, "receipt": 1}
    assert len({call[0] for call in views.REMOTE_CALLS}) == 1, "one downstream key"
    assert row("k1").status == "completed"


# -- a provider that forgets its keys: DOWNSTREAM_KEY_LIFETIME ---------------------------------

REMOTE_FIRST = "/t/steps/remote-first/"
#: Past the default DOWNSTREAM_KEY_LIFETIME (a day, Stripe's): a provider may have forgotten.
FORGOTTEN = timedelta(days=1, minutes=1)


def first_claimed(key: str, ago: timedelta) -> None:
    """Move the key's first claim ``ago`` into the past, by the database's clock."""
    from django_idempotency.store.clock import DatabaseNow

    IdempotencyKey.objects.filter(key=key).update(created_at=DatabaseNow() - ago)


def test_a_remote_step_a_crashed_attempt_called_longer_ago_than_its_keys_live_is_not_called_again(
    strategy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The remote step was called, and the attempt crashed before its result was recorded.
    A retry within the provider's key lifetime calls it again with the same downstream key
    (the provider answers the first call's result); once the key's first claim is older
    than ``DOWNSTREAM_KEY_LIFETIME``, the provider may have forgotten that key and would
    charge again: the call is not made, the answer is ``409 remote-outcome-unknown``, and
    the key is kept as it is (every retry gets the same answer) for reconciliation."""
    views.FAIL_ONCE["forgot"] = "after-call"
    assert post("k1", label="forgot").status_code == 500
    assert len(views.REMOTE_CALLS) == 1
    first_claimed("k1", FORGOTTEN)
    for _ in range(2):
        refused = post("k1", label="forgot")
        assert_problem(refused, 409, "remote-outcome-unknown")
        assert len(views.REMOTE_CALLS) == 1, "the remote step was called again"
        assert effects("forgot") == {"create": 1}
        assert row("k1").status == "in_progress" and names("k1") == ["create"]
    # An operator is told what to look up, at ERROR, each time: the step's downstream key.
    records = [r for r in caplog.records if r.levelname == "ERROR" and "reconcile" in r.message]
    assert len(records) == 2
    for record in records:
        assert record.idempotency_outcome == "remote_outcome_unknown"  # type: ignore[attr-defined]
        assert views.REMOTE_CALLS[0][0] in record.message


def test_the_lifetime_leaves_room_for_the_call_itself(strategy: str) -> None:
    """A key first claimed within the lifetime, but by less than two leases (the longest a
    live owner may take from the check to its call): refused too, so that the call never
    reaches the provider after it forgot the key."""
    views.FAIL_ONCE["edge"] = "after-call"
    assert post("k1", label="edge").status_code == 500
    first_claimed("k1", timedelta(days=1) - timedelta(seconds=30))  # LOCK_TIMEOUT is 30
    assert_problem(post("k1", label="edge"), 409, "remote-outcome-unknown")
    first_claimed("k1", timedelta(days=1) - timedelta(minutes=10))  # by 9 minutes within
    retry = post("k1", label="edge")
    assert retry.status_code == 201, retry.content
    assert len(views.REMOTE_CALLS) == 2


def test_a_takeover_keeps_the_time_of_the_keys_first_claim(strategy: str) -> None:
    """Within the lifetime the retry resumes and calls again with the same downstream key;
    its takeover keeps the first claim's time, so that the lifetime counts from the first
    attempt whatever the number of retries."""
    views.FAIL_ONCE["kept"] = "after-call"
    assert post("k1", label="kept").status_code == 500
    first_claimed("k1", timedelta(hours=1))
    first = row("k1").created_at
    retry = post("k1", label="kept")
    assert retry.status_code == 201, retry.content
    assert len({call[0] for call in views.REMOTE_CALLS}) == 1 and len(views.REMOTE_CALLS) == 2
    assert row("k1").created_at == first


def test_a_first_remote_step_commits_its_key_before_the_call(strategy: str) -> None:
    """A view whose first step is remote commits nothing before it otherwise: an attempt
    that crashed after the call left no row (``advisory_lock``) or had it deleted by the
    release (``db``), and a retry after the provider forgot the key charged again. The key
    is committed before the call: the retry finds it, and the lifetime holds."""
    views.FAIL_ONCE["first"] = "after-call"
    assert post("k1", REMOTE_FIRST, label="first").status_code == 500
    assert len(views.REMOTE_CALLS) == 1
    assert row("k1").status == "in_progress"
    first_claimed("k1", FORGOTTEN)
    assert_problem(post("k1", REMOTE_FIRST, label="first"), 409, "remote-outcome-unknown")
    assert len(views.REMOTE_CALLS) == 1
    assert_problem(post("k1", REMOTE_FIRST, label="other"), 422, "key-reused")


def test_a_first_remote_step_is_called_again_within_the_lifetime(strategy: str) -> None:
    views.FAIL_ONCE["again"] = "after-call"
    assert post("k1", REMOTE_FIRST, label="again").status_code == 500
    retry = post("k1", REMOTE_FIRST, label="again")
    assert retry.status_code == 201, retry.content
    assert len(views.REMOTE_CALLS) == 2 and len({call[0] for call in views.REMOTE_CALLS}) == 1
    assert effects("again") == {"record": 1}
    replay = post("k1", REMOTE_FIRST, label="again")
    assert replay.status_code == 201 and len(views.REMOTE_CALLS) == 2


@pytest.mark.parametrize("lifetime", [None, 3 * 24 * 3600])
def test_the_lifetime_is_a_setting(lifetime: float | None) -> None:
    """``None`` checks nothing; a longer lifetime (a provider that keeps keys longer)."""
    with override_settings(
        IDEMPOTENCY={"STRATEGY": "db", "LOCK_TIMEOUT": 30, "DOWNSTREAM_KEY_LIFETIME": lifetime}
    ):
        views.REMOTE_CALLS.clear()
        views.FAIL_ONCE["set"] = "after-call"
        assert post("k1", label="set").status_code == 500
        first_claimed("k1", FORGOTTEN)
        retry = post("k1", label="set")
        assert retry.status_code == 201, retry.content
        assert len(views.REMOTE_CALLS) == 2


def test_releasing_a_key_whose_remote_step_was_called_keeps_it(strategy: str) -> None:
    """The admin's release of a stuck key whose only record is the mark of a remote call (a
    first step that is remote) gives its claim back and keeps the row, as for a key with a
    recovery point: deleted, its retry was a new request that called the provider again,
    whatever the provider had forgotten by then."""
    views.FAIL_ONCE["stuck"] = "after-call"
    assert post("k1", REMOTE_FIRST, label="stuck").status_code == 500
    keys = IdempotencyKey.objects.filter(key="k1")
    keys.update(locked_at=Now())  # a live lease: a stuck key
    assert row("k1").recovery_point is None
    assert IdempotencyKey.objects.release_stuck() == 1
    assert keys.get().status == "in_progress"
    first_claimed("k1", FORGOTTEN)
    assert_problem(post("k1", REMOTE_FIRST, label="stuck"), 409, "remote-outcome-unknown")
    assert len(views.REMOTE_CALLS) == 1


def test_a_lifetime_check_that_cannot_read_the_key_is_a_503_and_calls_nothing(
    strategy: str,
) -> None:
    """The read of the key's first claim fails (the database errs on that statement alone):
    the request is answered ``503 store-unavailable``, the provider is not called, and the
    key is kept with its mark for the next retry, which calls it once."""
    from django.db import OperationalError

    views.FAIL_ONCE["unread"] = "after-call"
    assert post("k1", label="unread").status_code == 500

    def first_claim_read_fails(execute: Any, sql: str, *args: Any) -> Any:
        if '"created_at" >' in sql:
            raise OperationalError("canceling statement due to statement timeout")
        return execute(sql, *args)

    with connections["default"].execute_wrapper(first_claim_read_fails):
        assert_problem(post("k1", label="unread"), 503, "store-unavailable")
    assert len(views.REMOTE_CALLS) == 1
    assert row("k1").status == "in_progress" and names("k1") == ["create"]
    retry = post("k1", label="unread")
    assert retry.status_code == 201, retry.content
    assert len(views.REMOTE_CALLS) == 2 and len({call[0] for call in views.REMOTE_CALLS}) == 1


@pytest.mark.parametrize("url", [URL, REMOTE_FIRST])
def test_a_key_whose_remote_call_is_unrecorded_outlives_its_ttl_and_charges_once(
    strategy: str, url: str, admin_client: Client
) -> None:
    """The remote step was called and the attempt crashed before its result was recorded.
    Days later, the key's TTL over, the purge runs, then the client retries: a purge that
    deleted the key made the retry a new request, which called the provider again with the
    same downstream key after the provider had forgotten it (a second charge). The key is
    kept, and the retry is the 409 remote-outcome-unknown, the provider called once."""
    views.FAIL_ONCE["late"] = "after-call"
    assert post("k1", url, label="late").status_code == 500
    assert len(views.REMOTE_CALLS) == 1
    first_claimed("k1", FORGOTTEN + timedelta(days=1))
    IdempotencyKey.objects.filter(key="k1").update(expires_at=Now() - timedelta(days=1))
    purge_every_way(admin_client)
    assert_problem(post("k1", url, label="late"), 409, "remote-outcome-unknown")
    assert len(views.REMOTE_CALLS) == 1, "the provider was called again"
    assert row("k1").status == "in_progress"


@pytest.mark.parametrize("url", [URL, REMOTE_FIRST])
def test_the_admin_shows_the_downstream_key_of_a_call_to_reconcile(
    strategy: str, url: str, admin_client: Client
) -> None:
    """A key refused with remote-outcome-unknown is reconciled by looking its remote call up
    at the other service: the key's page names the step called without a recorded result
    and the downstream key it was called with (the one the provider saw), and, once
    recorded, each remote step's downstream key beside its result."""
    views.FAIL_ONCE["look"] = "after-call"
    assert post("k1", url, label="look").status_code == 500
    sent = views.REMOTE_CALLS[0][0]
    change = reverse("admin:django_idempotency_idempotencykey_change", args=[row("k1").pk])
    page = admin_client.get(change).content.decode()
    assert "<strong>call</strong>: called by an earlier attempt, its result not recorded" in page
    assert f"(downstream key: <code>{sent}</code>)" in page
    assert post("k1", url, label="look").status_code == 201  # within the lifetime: called again
    page = admin_client.get(change).content.decode()
    assert "result not recorded" not in page
    assert page.count(f"(downstream key: <code>{sent}</code>)") == 1


def forget_in_admin(client: Client, *keys: str, confirm: bool = False) -> str:
    """The admin's action that deletes keys in progress with steps: its confirmation page,
    or (``confirm``) the page after it."""
    data = {
        "action": "forget_unfinished_keys",
        "_selected_action": [str(row(key).pk) for key in keys],
        **({"post": "yes"} if confirm else {}),
    }
    url = reverse("admin:django_idempotency_idempotencykey_changelist")
    return admin_page(client.post(url, data, follow=True))


def admin_page(response: Any) -> str:
    return str(response.content.decode())


def test_a_reconciled_key_is_deleted_in_the_admin_and_its_retry_is_a_new_request(
    strategy: str, admin_client: Client
) -> None:
    """A key refused with remote-outcome-unknown, reconciled by hand: the admin's action
    asks first (the key's steps and the downstream key to look up, what a retry does then),
    leaves a key whose lease is live or that has no steps, deletes the key and records it in
    the audit trail. The retry after it is a new request, which calls again."""
    views.FAIL_ONCE["settle"] = "after-call"
    assert post("k1", label="settle").status_code == 500
    first_claimed("k1", FORGOTTEN)
    assert_problem(post("k1", label="settle"), 409, "remote-outcome-unknown")
    sent = views.REMOTE_CALLS[0][0]
    StaleKeyFactory(key="bare")  # in progress, no steps: not this action's
    page = forget_in_admin(admin_client, "k1", "bare")
    assert "<h1>Delete this key in progress with steps?</h1>" in page
    assert f"<code>{sent}</code>" in page and "result not recorded" in page
    assert "A retry with a deleted key is a new request" in page
    assert "1 selected key is not in progress with steps under a lapsed lease" in page
    assert row("k1").status == "in_progress"  # nothing yet
    # A key whose lease is live again (a request resumed it) is left alone.
    IdempotencyKey.objects.filter(key="k1").update(locked_at=Now())
    assert "Deleted 0 keys" in forget_in_admin(admin_client, "k1", confirm=True)
    IdempotencyKey.objects.filter(key="k1").update(locked_at=Now() - timedelta(hours=1))
    assert "Deleted 1 key in progress with steps." in forget_in_admin(
        admin_client, "k1", confirm=True
    )
    assert not IdempotencyKey.objects.filter(key="k1").exists()
    assert IdempotencyKey.objects.filter(key="bare").exists()
    entry = LogEntry.objects.get(object_repr__endswith="/ k1")
    assert "reconciled by hand" in entry.get_change_message()
    retry = post("k1", label="settle")
    assert retry.status_code == 201, retry.content
    assert len(views.REMOTE_CALLS) == 2
