"""The completer (docs/steps.md, "The completer") in-process, on the keys' default database
(PostgreSQL when it answers) under ``db`` and ``advisory_lock``: a request of a
``completer=True`` view whose step failed and whose client never came back is sent to its
view again as its user and finished from its recovery point; its client's retry is then
replayed. Runs are bounded and dead-lettered; a request whose scope or user the completer
cannot reproduce is never run under another key. The crash tests with a killed worker are
in ``tests/system/test_steps_crash.py``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, connections
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CollectorRegistry
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import completer, metrics, signals
from django_idempotency.completer import complete_requests
from django_idempotency.decorators import idempotency_opt_in, idempotent
from django_idempotency.errors import InvalidConfiguration
from django_idempotency.mixins import IdempotencyMixin
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.replay import REPLAYED_HEADER
from django_idempotency.protocol.resend import rebuild
from django_idempotency.store.clock import DatabaseNow
from django_idempotency.store.sql.deadline import watchdog

from .support.partitions import SMALL, partitioned_table
from .support.proxy import through_proxy
from .support.threads import in_background, run_at_once
from .testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

#: Where the next runs of the view fail: a step's name, for as many runs as listed.
FAIL: list[str] = []


def _view(request: HttpRequest) -> HttpResponse:
    payload = json.loads(request.body)
    steps = request.idempotency.steps  # type: ignore[attr-defined]

    def effect(name: str) -> int:
        if FAIL and FAIL[0] == name:
            FAIL.pop(0)
            raise RuntimeError(f"failed in {name}")
        return SideEffect.objects.create(label=f"{payload['label']}:{name}").pk

    created = steps.local("create", effect, "create")
    answer = steps.remote("call", lambda key: f"ref-{key[:8]}")
    steps.local("record", effect, "record")
    user = request.user.pk if request.user.is_authenticated else None
    return JsonResponse({"created": created, "answer": answer, "user": user}, status=201)


class SteppedView(IdempotencyMixin, APIView):
    permission_classes = [IsAuthenticated]
    idempotency_steps = True
    idempotency_completer = True

    def post(self, request: Request) -> Response:
        answer = _view(request)
        return Response(json.loads(answer.content), status=answer.status_code)


#: The downstream keys the remote-first view's provider was called with.
CALLS: list[str] = []


def _remote_first(request: HttpRequest) -> HttpResponse:
    """A view whose first step is the provider's call: the request is kept before it."""
    steps = request.idempotency.steps  # type: ignore[attr-defined]

    def provider(key: str) -> str:
        CALLS.append(key)
        return f"ref-{key[:8]}"

    answer = steps.remote("call", provider)
    if FAIL and FAIL[0] == "after-call":
        FAIL.pop(0)
        raise RuntimeError("failed after the provider's call")
    created = steps.local("record", lambda: SideEffect.objects.create(label="remote:record").pk)
    return JsonResponse({"answer": answer, "created": created}, status=201)


urlpatterns = [
    path("c/remote/", csrf_exempt(idempotent(steps=True, completer=True)(_remote_first))),
    path("c/", csrf_exempt(idempotent(steps=True, completer=True)(_view))),
    path("c/drf/", SteppedView.as_view()),
    path(
        "c/tenant/",
        csrf_exempt(
            idempotent(
                steps=True,
                completer=True,
                scope=lambda request: "tenant:" + request.headers.get("X-Tenant", "none"),
            )(_view)
        ),
    ),
]


@pytest.fixture(autouse=True, params=["db", "advisory_lock"])
def strategy(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    if request.param == "advisory_lock" and connection.vendor != "postgresql":
        pytest.skip("advisory_lock runs on PostgreSQL")
    settings.ROOT_URLCONF = __name__
    settings.IDEMPOTENCY = {"STRATEGY": request.param, "COMPLETER_AFTER": 0}
    FAIL.clear()
    yield str(request.param)
    FAIL.clear()


@pytest.fixture
def client() -> Client:
    user = get_user_model().objects.create_user("payer", password="x")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    client.user = user  # type: ignore[attr-defined]
    return client


def post(client: Client, key: str, label: str, url: str = "/c/", **headers: str) -> Any:
    body = json.dumps({"label": label})
    return client.post(
        url, body, content_type="application/json", headers={"Idempotency-Key": key, **headers}
    )


def effects(label: str) -> dict[str, int]:
    rows = SideEffect.objects.filter(label__startswith=f"{label}:")
    return {name: rows.filter(label=f"{label}:{name}").count() for name in ("create", "record")}


def row(key: str) -> IdempotencyKey:
    return IdempotencyKey.objects.get(key=key)


def kept(key: str) -> dict[str, Any]:
    """The key's ``steps`` column."""
    steps = row(key).steps
    assert isinstance(steps, dict)
    return steps


@pytest.mark.parametrize("url", ["/c/", "/c/drf/"])
def test_a_request_whose_client_never_came_back_is_finished_and_then_replayed(
    client: Client, url: str
) -> None:
    FAIL.append("record")
    assert post(client, "k1", "a", url).status_code == 500  # the step failed, the key kept
    assert row("k1").status == IdempotencyKey.Status.IN_PROGRESS
    assert "request" in kept("k1")  # kept with the first step's commit

    report = complete_requests()

    assert report["completed"] == 1
    assert row("k1").status == IdempotencyKey.Status.COMPLETED
    assert effects("a") == {"create": 1, "record": 1}
    retry = post(client, "k1", "a", url)
    assert retry.status_code == 201 and retry.headers[REPLAYED_HEADER] == "true"
    answer = json.loads(retry.content)
    assert answer["user"] == client.user.pk  # type: ignore[attr-defined]
    assert complete_requests()["completed"] == 0  # nothing left to finish
    assert effects("a") == {"create": 1, "record": 1}


def test_runs_are_bounded_and_a_dead_lettered_key_is_left_to_its_client(
    client: Client, settings: Any
) -> None:
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "COMPLETER_ATTEMPTS": 2}
    gave_up: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        gave_up.append(kwargs)

    signals.request_dead_lettered.connect(receiver)
    try:
        FAIL.extend(["record"] * 3)
        assert post(client, "k2", "b").status_code == 500
        outcomes = [complete_requests().counts for _ in range(4)]
    finally:
        signals.request_dead_lettered.disconnect(receiver)
    assert [o["failed"] for o in outcomes] == [1, 1, 0, 0]
    assert [o["dead_lettered"] for o in outcomes] == [0, 0, 1, 0]
    assert gave_up == [
        {
            "signal": signals.request_dead_lettered,
            "scope": row("k2").scope,
            "key": "k2",
            "attempts": 2,
            "reason": "no attempts left",
        }
    ]
    assert kept("k2")["completer"]["dead"] is True
    assert effects("b") == {"create": 1, "record": 0}
    retry = post(client, "k2", "b")  # the client's retry still resumes it
    assert retry.status_code == 201 and REPLAYED_HEADER not in retry.headers
    assert effects("b") == {"create": 1, "record": 1}


def test_a_scope_the_kept_request_does_not_reproduce_is_never_run_under_another_key(
    client: Client,
) -> None:
    FAIL.append("record")
    assert post(client, "k3", "c", "/c/tenant/", **{"X-Tenant": "acme"}).status_code == 500

    report = complete_requests()

    assert report["dead_lettered"] == 1
    assert "scope" in kept("k3")["completer"]["reason"]
    assert IdempotencyKey.objects.count() == 1  # no key claimed under the scope "tenant:none"
    assert effects("c") == {"create": 1, "record": 0}


def test_a_request_whose_user_was_deleted_is_dead_lettered(client: Client) -> None:
    FAIL.append("record")
    assert post(client, "k4", "d").status_code == 500
    client.user.delete()  # type: ignore[attr-defined]

    assert complete_requests()["dead_lettered"] == 1
    assert "no longer exists" in kept("k4")["completer"]["reason"]
    assert effects("d") == {"create": 1, "record": 0}


def test_the_completer_and_client_retries_racing_run_each_step_once(client: Client) -> None:
    FAIL.append("record")
    assert post(client, "k5", "e").status_code == 500

    user = client.user  # type: ignore[attr-defined]

    def work(index: int) -> Any:
        if index == 0:
            return complete_requests().counts
        own = Client(raise_request_exception=False)
        own.force_login(user)
        return post(own, "k5", "e").status_code

    results = run_at_once(4, work)

    assert effects("e") == {"create": 1, "record": 1}
    assert row("k5").status == IdempotencyKey.Status.COMPLETED
    assert set(results[1:]) <= {201, 409}


def test_completer_needs_steps() -> None:
    with pytest.raises(InvalidConfiguration, match="E092"):
        idempotent(completer=True)(_view)


def test_a_view_the_middleware_protects_cannot_have_the_completer() -> None:
    with pytest.raises(TypeError, match="without the project's middleware"):
        idempotency_opt_in(steps=True, completer=True)(_view)


def test_each_run_is_counted_by_the_metrics(client: Client) -> None:
    registry = CollectorRegistry()
    metrics.install(registry)
    try:
        FAIL.append("record")
        assert post(client, "k6", "f").status_code == 500
        complete_requests()
        counted = registry.get_sample_value(
            "django_idempotency_completer_runs_total", {"outcome": "completed"}
        )
    finally:
        metrics.uninstall()
    assert counted == 1


def _unprotected(request: HttpRequest) -> HttpResponse:
    SideEffect.objects.create(label="unprotected")
    return JsonResponse({}, status=201)


class Redeployed:
    """A URLconf in which the path of the kept request now serves a view without the
    completer (nor any protection)."""

    urlpatterns = [path("c/", csrf_exempt(_unprotected))]


def test_a_path_whose_view_no_longer_declares_the_completer_is_not_run(
    client: Client, settings: Any
) -> None:
    FAIL.append("record")
    assert post(client, "k7", "g").status_code == 500
    settings.ROOT_URLCONF = Redeployed

    assert complete_requests()["dead_lettered"] == 1
    assert "does not declare" in kept("k7")["completer"]["reason"]
    assert not SideEffect.objects.filter(label="unprotected").exists()


def test_a_request_whose_first_step_is_remote_is_kept_before_the_call(client: Client) -> None:
    """A charge made at the provider is never left without the request that can finish it:
    the request is committed before the first remote call, whose result the completer's
    run then gets again with the same downstream key."""
    CALLS.clear()
    FAIL.append("after-call")
    assert post(client, "k8", "remote", "/c/remote/").status_code == 500
    assert "request" in kept("k8") and kept("k8")["done"] == []

    assert complete_requests()["completed"] == 1
    assert len(CALLS) == 2 and CALLS[0] == CALLS[1]  # the same key: the provider dedups
    assert SideEffect.objects.filter(label="remote:record").count() == 1


class Gone:
    """A URLconf in which the kept request's path no longer resolves."""

    urlpatterns: list[Any] = []


def test_a_path_that_no_longer_resolves_is_dead_lettered(client: Client, settings: Any) -> None:
    FAIL.append("record")
    assert post(client, "k9", "h").status_code == 500
    settings.ROOT_URLCONF = Gone

    assert complete_requests()["dead_lettered"] == 1
    assert "no longer resolves" in kept("k9")["completer"]["reason"]


@pytest.mark.parametrize("silent_at", ["query", "count"])
def test_a_database_that_falls_silent_ends_the_run_instead_of_hanging_it(
    client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch, silent_at: str
) -> None:
    """``DATABASE_TIMEOUT`` bounds the completer's own statements: a database silent at
    the query for due keys, or at a run's count, ends the run with the driver's error and
    runs no view; once it answers again, the next run finishes the key, each step once."""
    if connection.vendor != "postgresql":
        pytest.skip("DATABASE_TIMEOUT bounds statements on PostgreSQL")
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "DATABASE_TIMEOUT": 1}
    FAIL.append("record")
    assert post(client, "k10", "s").status_code == 500
    listed = completer.due_keys
    with through_proxy("default") as proxy:

        def due_keys(alias: str, limit: int) -> list[completer.Due]:
            connections[alias].ensure_connection()  # the statement, not connecting, is cut
            if silent_at == "query":
                proxy.silence()
            found = listed(alias, limit)
            proxy.silence()
            return found

        monkeypatch.setattr(completer, "due_keys", due_keys)
        cut = watchdog.cut
        run = in_background(complete_requests)
        with pytest.raises(DatabaseError):
            run.result(timeout=60)  # DATABASE_TIMEOUT is 1 s: 60 only tells a hang
        assert watchdog.cut == cut + 1
    monkeypatch.setattr(completer, "due_keys", listed)
    assert effects("s") == {"create": 1, "record": 0}
    assert complete_requests()["completed"] == 1
    assert effects("s") == {"create": 1, "record": 1}


@pytest.mark.parametrize("url", ["/c/", "/c/drf/"])
def test_a_key_deleted_during_its_run_is_not_run_again_from_its_first_step(
    client: Client, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """The completer only ever resumes: a key may be deleted between the run's count and its
    request's claim (the purge keeps a key in progress with steps, whatever its TTL, but
    someone who reconciled it may delete it), and the request sent again must then not claim
    the key afresh and run the steps that had committed (a second charge) for a client who
    is not there. It is given back unclaimed, and the run counts as taken."""
    FAIL.append("record")
    assert post(client, "k11", "p", url).status_code == 500
    ended = ExpressionWrapper(DatabaseNow() - Value(timedelta(seconds=1)), DateTimeField())
    IdempotencyKey.objects.filter(key="k11").update(expires_at=ended)
    purged: list[int] = []

    def deleted_first(*args: Any) -> HttpRequest:
        purged.append(IdempotencyKey.objects.delete_expired())  # its TTL over: kept
        IdempotencyKey.objects.filter(key="k11").delete()  # reconciled by hand
        return rebuild(*args)

    monkeypatch.setattr(completer, "rebuild", deleted_first)
    report = complete_requests()

    assert purged == [0]
    assert effects("p") == {"create": 1, "record": 0}
    assert not IdempotencyKey.objects.filter(key="k11").exists()
    assert report["taken"] == 1 and report["completed"] == report["failed"] == 0


def test_on_a_partitioned_table_a_run_that_finished_its_key_counts_as_completed(
    client: Client, settings: Any, strategy: str
) -> None:
    """A takeover on a table partitioned by expiry inserts the key anew under another id:
    the completer reads the outcome of its run by the key, not by the id it had read."""
    # Minute partitions an hour ahead: the key's TTL falls in one however slow the run.
    wide = {**SMALL, **settings.IDEMPOTENCY, "PARTITION_INTERVAL": 60, "PARTITION_AHEAD": 3600}
    with partitioned_table({**wide, "TTL": 30}, ahead=3600):
        FAIL.append("record")
        assert post(client, "k12", "q").status_code == 500
        first = row("k12").pk

        report = complete_requests()

        if strategy == "db":
            assert row("k12").pk != first  # taken over: deleted and inserted anew
        assert row("k12").status == IdempotencyKey.Status.COMPLETED
        assert effects("q") == {"create": 1, "record": 1}
        assert report["completed"] == 1 and report["failed"] == 0
