"""The protocol (django_idempotency.protocol.engine): claim, run, store or release, answer.

Most tests call :func:`engine.handle` with a plain callable; the concurrency ones go
through real requests on threads against ``tests.support.gates``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import connections
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.test import Client, RequestFactory, override_settings
from django.utils import timezone

from django_idempotency import signals
from django_idempotency.conf import conf
from django_idempotency.errors import IdempotencyError
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.engine import handle
from django_idempotency.protocol.keys import downstream_key
from django_idempotency.protocol.options import Options
from django_idempotency.protocol.problems import problem_response
from django_idempotency.protocol.replay import REPLAYED_HEADER
from django_idempotency.store.records import ClaimState

from ..support.api import race_held
from ..support.assertions import assert_problem
from ..support.gates import Background
from ..support.mariadb import with_mariadb
from ..support.waiting import wait_until
from ..testapp import holds
from ..testapp.models import SideEffect

pytestmark = pytest.mark.django_db

rf = RequestFactory()


def request(
    key: str | None = "k1", body: object = None, path: str = "/pay/", **extra: Any
) -> HttpRequest:
    headers: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    req = rf.post(
        path,
        json.dumps(body or {"amount": 100}),
        content_type="application/json",
        **headers,
        **extra,
    )
    req.user = AnonymousUser()
    return req


def view(
    status: int = 201, body: bytes = b'{"id": 1}', **headers: str
) -> Callable[[], HttpResponse]:
    def run() -> HttpResponse:
        SideEffect.objects.create(label="engine")
        response = HttpResponse(body, status=status, content_type="application/json")
        for name, value in headers.items():
            response[name.replace("_", "-")] = value
        return response

    return run


def locked_at(key: str) -> datetime:
    """The lease time of a running claim."""
    value = IdempotencyKey.objects.get(key=key).locked_at
    assert value is not None
    return value


@pytest.fixture
def recorded() -> Iterator[list[str]]:
    """The names of the engine's outcome signals, in the order they were sent (not
    ``claim_timed``, the timing every claim sends while it has a receiver)."""
    names = [
        n
        for n in dir(signals)
        if isinstance(getattr(signals, n), type(signals.key_claimed)) and n != "claim_timed"
    ]
    sent: list[str] = []
    receivers = []
    for name in names:

        def receiver(sender: Any, _name: str = name, **kwargs: Any) -> None:
            assert {"request", "scope", "key", "strategy"} <= set(kwargs)
            sent.append(_name)

        getattr(signals, name).connect(receiver, weak=False)
        receivers.append((name, receiver))
    yield sent
    for name, receiver in receivers:
        getattr(signals, name).disconnect(receiver)


# -- the protocol through handle() ----------------------------------------------------------


def test_claim_store_replay(recorded: list[str]) -> None:
    first = handle(request(), view(Location="/pay/1/"))
    assert first.status_code == 201 and REPLAYED_HEADER not in first
    second = handle(request(), view())
    assert second.status_code == 201
    assert isinstance(second, HttpResponse) and second.content == b'{"id": 1}'
    assert second[REPLAYED_HEADER] == "true"
    assert second["Location"] == "/pay/1/"
    assert second["Content-Type"] == "application/json"
    assert SideEffect.objects.count() == 1
    assert recorded == ["key_claimed", "response_stored", "response_replayed"]


def test_no_key_and_not_required_runs_the_view_without_a_record() -> None:
    assert handle(request(key=None), view()).status_code == 201
    assert handle(request(key=None), view()).status_code == 201
    assert SideEffect.objects.count() == 2
    assert not IdempotencyKey.objects.exists()


def test_required_key_is_a_missing_key_problem() -> None:
    response = handle(request(key=None), view(), options=Options(required=True))
    assert_problem(response, 400, "missing-key")
    assert SideEffect.objects.count() == 0


@override_settings(IDEMPOTENCY={"REQUIRED": True})
def test_required_from_settings() -> None:
    assert_problem(handle(request(key=None), view()), 400, "missing-key")
    assert handle(request(key=None), view(), options=Options(required=False)).status_code == 201


@pytest.mark.parametrize("key", ["", "a b", "x" * 256, '"open', "clé"])
def test_bad_key_is_an_invalid_key_problem(key: str) -> None:
    assert_problem(handle(request(key=key), view()), 400, "invalid-key")
    assert SideEffect.objects.count() == 0


def test_mismatch_and_conflict(recorded: list[str]) -> None:
    IdempotencyKey.objects.claim(
        "anonymous", "busy", _print(request(key="busy")), ttl=60, lock_timeout=60
    )
    conflict = handle(request(key="busy"), view())
    assert_problem(conflict, 409, "request-in-progress")
    assert conflict["Retry-After"] == "1"
    assert_problem(handle(request(key="busy", body={"amount": 5}), view()), 422, "key-reused")
    assert SideEffect.objects.count() == 0
    assert recorded == ["request_conflict", "key_mismatch"]


@override_settings(IDEMPOTENCY={"RETRY_AFTER": 7})
def test_retry_after_setting() -> None:
    IdempotencyKey.objects.claim(
        "anonymous", "busy", _print(request(key="busy")), ttl=60, lock_timeout=60
    )
    assert handle(request(key="busy"), view())["Retry-After"] == "7"


def _print(req: HttpRequest) -> str:
    from django_idempotency.protocol.fingerprint import fingerprint

    return fingerprint(req)


def test_methods_not_listed_pass_through() -> None:
    for method in ("get", "put", "delete"):
        req = getattr(rf, method)("/pay/", HTTP_IDEMPOTENCY_KEY="k")
        req.user = AnonymousUser()
        response = handle(req, view(status=200))
        assert response.status_code == 200 and REPLAYED_HEADER not in response
    assert SideEffect.objects.count() == 3
    assert not IdempotencyKey.objects.exists()
    req = rf.put("/pay/", HTTP_IDEMPOTENCY_KEY="k")
    req.user = AnonymousUser()
    handle(req, view(), options=Options(methods=frozenset({"PUT"})))
    assert IdempotencyKey.objects.count() == 1


@override_settings(IDEMPOTENCY={"HEADER": "X-Request-Key", "METHODS": ["PUT"]})
def test_custom_header_and_methods() -> None:
    assert handle(request(key="k"), view()).status_code == 201  # POST not listed now
    req = rf.put("/pay/", b"{}", content_type="application/json", HTTP_X_REQUEST_KEY="k")
    req.user = AnonymousUser()
    handle(req, view())
    req = rf.put("/pay/", b"{}", content_type="application/json", HTTP_X_REQUEST_KEY="k")
    req.user = AnonymousUser()
    assert handle(req, view())[REPLAYED_HEADER] == "true"
    assert SideEffect.objects.count() == 2


@pytest.mark.parametrize("atomic", [True, False])
def test_server_error_releases_the_key(atomic: bool, recorded: list[str]) -> None:
    with override_settings(IDEMPOTENCY={"ATOMIC": atomic}):
        assert handle(request(), view(status=503)).status_code == 503
        assert not IdempotencyKey.objects.exists()
        assert SideEffect.objects.count() == (0 if atomic else 1)
        retry = handle(request(), view(status=201))
        assert retry.status_code == 201 and REPLAYED_HEADER not in retry
    assert SideEffect.objects.count() == (1 if atomic else 2)
    assert recorded[:2] == ["key_claimed", "key_released"]


@override_settings(IDEMPOTENCY={"STORE_SERVER_ERRORS": True})
def test_server_errors_stored_when_configured() -> None:
    assert handle(request(), view(status=502, body=b"down")).status_code == 502
    replay = handle(request(), view(status=201))
    assert isinstance(replay, HttpResponse)
    assert replay.status_code == 502 and replay.content == b"down"
    assert replay[REPLAYED_HEADER] == "true"
    assert SideEffect.objects.count() == 1


@pytest.mark.parametrize("atomic", [True, False])
def test_exception_in_the_view_releases_the_key_and_rolls_back(atomic: bool) -> None:
    def failing() -> HttpResponse:
        SideEffect.objects.create(label="failing")
        raise RuntimeError("boom")

    with override_settings(IDEMPOTENCY={"ATOMIC": atomic}), pytest.raises(RuntimeError):
        handle(request(), failing)
    assert not IdempotencyKey.objects.exists()
    assert SideEffect.objects.count() == (0 if atomic else 1)
    assert handle(request(), view()).status_code == 201


def test_stored_headers_are_allow_listed() -> None:
    handle(
        request(),
        view(
            Set_Cookie="session=secret",
            Authorization="Bearer x",
            X_Private="no",
            Location="/pay/1/",
            ETag='"v1"',
            Cache_Control="no-store",
        ),
    )
    stored = IdempotencyKey.objects.get().response_headers
    assert {k.lower() for k in stored} == {"content-type", "location", "etag", "cache-control"}
    replay = handle(request(), view())
    assert "Set-Cookie" not in replay and "Authorization" not in replay
    assert "X-Private" not in replay
    assert replay["Location"] == "/pay/1/" and replay["ETag"] == '"v1"'


@override_settings(IDEMPOTENCY={"STORED_HEADERS": ["Content-Type", "Set-Cookie", "X-Kept"]})
def test_never_stored_headers_win_over_the_allow_list() -> None:
    handle(request(), view(Set_Cookie="a=b", X_Kept="yes"))
    stored = IdempotencyKey.objects.get().response_headers
    assert {k.lower() for k in stored} == {"content-type", "x-kept"}


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"STORED_HEADERS": ["Content-Type", ":not-stored"]})
def test_a_view_cannot_forge_the_not_stored_marker() -> None:
    """A pseudo-header is never stored, even allow-listed: a view that sets one does not
    turn its own stored response into a response-not-stored record."""

    def forging() -> HttpResponse:
        response = HttpResponse(b'{"ok": 1}', status=201, content_type="application/json")
        response[":not-stored"] = "forged"
        return response

    handle(request(), forging)
    assert ":not-stored" not in IdempotencyKey.objects.get().response_headers
    replay = handle(request(), forging)
    assert isinstance(replay, HttpResponse)
    assert replay.status_code == 201 and replay.content == b'{"ok": 1}'


def test_replay_without_a_stored_content_type_has_none() -> None:
    def no_type() -> HttpResponse:
        response = HttpResponse(b"", status=204)
        del response["Content-Type"]
        return response

    handle(request(), no_type)
    replay = handle(request(), no_type)
    assert replay.status_code == 204 and "Content-Type" not in replay


@override_settings(IDEMPOTENCY={"MAX_STORED_BODY_SIZE": 10})
def test_response_too_large_to_store_completes_the_key_without_it() -> None:
    response = handle(request(), view(body=b"x" * 11))
    assert isinstance(response, HttpResponse)
    assert response.status_code == 201 and response.content == b"x" * 11
    assert SideEffect.objects.count() == 1  # the writes the client was told of committed
    row = IdempotencyKey.objects.get()
    assert row.status == "completed" and row.response_status == 201
    assert row.response_body is not None and bytes(row.response_body) == b""
    retry = handle(request(), view(body=b"x" * 11))
    assert isinstance(retry, HttpResponse)
    assert_problem(retry, 409, "response-not-stored")
    assert json.loads(retry.content)["original_status"] == 201
    assert SideEffect.objects.count() == 1  # the retry did not run the view


def test_streaming_response_completes_the_key_without_it() -> None:
    def streaming() -> StreamingHttpResponse:
        SideEffect.objects.create(label="streamed")
        return StreamingHttpResponse(iter([b"a", b"b"]))

    response = handle(request(), streaming)
    assert b"".join(response) == b"ab"
    assert IdempotencyKey.objects.get().status == "completed"
    assert_problem(handle(request(), streaming), 409, "response-not-stored")
    assert SideEffect.objects.count() == 1


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=20)
def test_body_over_the_upload_limit_is_413() -> None:
    assert_problem(handle(request(body={"note": "x" * 50}), view()), 413, "request-too-large")
    assert SideEffect.objects.count() == 0


def test_scope_function_and_scopes_are_separate() -> None:
    handle(request(), view(body=b"alice"), scope=lambda r: "tenant:a")
    other = handle(request(), view(body=b"bob"), scope=lambda r: "tenant:b")
    assert isinstance(other, HttpResponse)
    assert other.content == b"bob" and REPLAYED_HEADER not in other
    again = handle(request(), view(), scope=lambda r: "tenant:a")
    assert isinstance(again, HttpResponse) and again.content == b"alice"
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {"tenant:a", "tenant:b"}


def tenant_scope(request: HttpRequest) -> str:
    return "tenant:" + request.headers.get("X-Tenant", "none")


@override_settings(IDEMPOTENCY={"SCOPE_FUNCTION": "tests.protocol.test_engine.tenant_scope"})
def test_scope_function_setting() -> None:
    handle(request(HTTP_X_TENANT="t1"), view())
    assert IdempotencyKey.objects.get().scope == "tenant:t1"


def test_long_scopes_are_hashed_into_the_column() -> None:
    handle(request(), view(), scope=lambda r: "s" * 1000)
    scope = IdempotencyKey.objects.get().scope
    assert scope.startswith("sha256:")
    assert handle(request(), view(), scope=lambda r: "s" * 1000)[REPLAYED_HEADER] == "true"


def test_request_idempotency_and_downstream_key() -> None:
    seen: list[Any] = []

    def looking(req: HttpRequest) -> Callable[[], HttpResponse]:
        def run() -> HttpResponse:
            seen.append(req.idempotency)  # type: ignore[attr-defined]
            return HttpResponse(req.idempotency.downstream_key("psp"), status=500)  # type: ignore[attr-defined]

        return run

    first = request()
    handle(first, looking(first))
    retry = request()
    handle(retry, looking(retry))  # 500 released the key: the view ran again
    assert len(seen) == 2
    assert seen[0].key == "k1" and seen[0].scope == "anonymous"
    assert seen[0].downstream_key("psp") == seen[1].downstream_key("psp")
    assert seen[0].downstream_key("psp") == downstream_key(
        conf.DOWNSTREAM_KEY_SECRET, "anonymous", "k1", "psp"
    )
    assert seen[0].downstream_key("psp") != seen[0].downstream_key("email")


# -- real requests on threads ---------------------------------------------------------------


@pytest.mark.urls("tests.support.gates")
@pytest.mark.django_db(transaction=True)
def test_fencing_takeover_while_the_view_runs_rolls_it_back(gate: Any, recorded: list[str]) -> None:
    response = Client().post(
        "/stolen/", {"a": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="fenced"
    )
    assert_problem(response, 409, "lease-lost")
    (theft,) = gate.thefts
    assert theft.state is ClaimState.CLAIMED and theft.taken_over
    assert SideEffect.objects.count() == 0  # the view's own write was rolled back
    row = IdempotencyKey.objects.get(key="fenced")
    assert row.claim_token == theft.token and row.status == "in_progress"
    assert recorded == ["key_claimed", "lease_lost"]


#: The heartbeat test's lease, in seconds.
HEARTBEAT_LEASE = 4


@pytest.mark.urls("tests.support.gates")
@pytest.mark.django_db(transaction=True)
@override_settings(IDEMPOTENCY={"HEARTBEAT_INTERVAL": 0.05, "LOCK_TIMEOUT": HEARTBEAT_LEASE})
def test_heartbeat_renews_the_lease_while_a_slow_view_runs(gate: Any) -> None:
    """The renewals come every 0.05 s; the lease is several seconds long so that a renewer
    starved of the CPU for a second on a loaded machine still renews in time (the promise
    holds for pauses shorter than the lease)."""
    slow = Background("/gated/", "slow")
    assert gate.entered.wait(timeout=30)
    first = locked_at("slow")
    wait_until(lambda: locked_at("slow") > first)
    # past LOCK_TIMEOUT since the claim, the lease is still live: no takeover
    claimed_at = IdempotencyKey.objects.get(key="slow").created_at
    lease = timedelta(seconds=HEARTBEAT_LEASE)
    wait_until(lambda: timezone.now() - claimed_at > lease * 1.2, timeout=HEARTBEAT_LEASE * 5)
    renewed = locked_at("slow")
    assert timezone.now() - renewed < lease
    duplicate = Client().post(
        "/gated/", {"amount": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="slow"
    )
    assert_problem(duplicate, 409, "request-in-progress")
    gate.opened.set()
    assert slow.result().status_code == 201
    assert SideEffect.objects.count() == 1
    assert IdempotencyKey.objects.get(key="slow").status == "completed"


@pytest.mark.urls("tests.support.gates")
@pytest.mark.django_db(transaction=True)
def test_duplicate_while_in_progress_gets_409_then_the_replay(gate: Any) -> None:
    first = Background("/gated/", "dup")
    assert gate.entered.wait(timeout=30)
    conflict = Client().post(
        "/gated/", {"amount": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="dup"
    )
    assert_problem(conflict, 409, "request-in-progress")
    assert int(conflict["Retry-After"]) >= 1
    gate.opened.set()
    original = first.result()
    replay = Client().post(
        "/gated/", {"amount": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="dup"
    )
    assert replay.status_code == original.status_code == 201
    assert replay.content == original.content
    assert replay[REPLAYED_HEADER] == "true"
    assert json.loads(replay.content)["psp"] == json.loads(original.content)["psp"]
    assert SideEffect.objects.count() == 1


@pytest.mark.urls("tests.support.gates")
@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_different_keys_all_succeed(gate: Any) -> None:
    """Each claim commits while the other request's view is open (on SQLite too)."""
    first = Background("/gated/", "one")
    assert gate.entered.wait(timeout=30)
    gate.entered.clear()
    second = Background("/gated/", "two")
    assert gate.entered.wait(timeout=30)
    wait_until(lambda: IdempotencyKey.objects.filter(key__in=["one", "two"]).count() == 2)
    gate.opened.set()
    assert first.result().status_code == 201
    assert second.result().status_code == 201
    assert SideEffect.objects.count() == 2
    assert set(IdempotencyKey.objects.values_list("status", flat=True)) == {"completed"}


def _error_classes() -> list[type[IdempotencyError]]:
    found: list[type[IdempotencyError]] = []
    pending = [IdempotencyError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("error_class", _error_classes(), ids=lambda cls: cls.__name__)
def test_every_error_is_an_rfc9457_problem(error_class: type[IdempotencyError]) -> None:
    error = error_class(retry_after=3)
    response = problem_response(error)
    payload = assert_problem(response, error_class.status, error_class.slug)
    assert payload["title"] == error_class.title
    assert payload["detail"] == error_class.default_detail
    assert payload["type"].startswith("https://")
    assert response["Retry-After"] == "3"
    assert 400 <= error_class.status <= 599
    assert problem_response(error_class("custom")).content.count(b"custom") == 1


@pytest.mark.django_db(transaction=True)
def test_a_failing_signal_receiver_after_the_claim_leaves_nothing_open() -> None:
    """An exception raised after the session was entered (a signal receiver, a metrics
    hook) must still end the session: roll back its transaction and release the key."""

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver failed")

    signals.key_claimed.connect(broken, weak=False)
    try:
        with pytest.raises(RuntimeError, match="receiver failed") as info:
            handle(request(), view())
        # Checked while the traceback is alive, as an error reporter would keep it: the
        # cleanup must not wait for the garbage collector to close the session.
        assert info.value.__traceback__ is not None
        assert not connections["default"].in_atomic_block
        assert not IdempotencyKey.objects.exists()
    finally:
        signals.key_claimed.disconnect(broken)
    assert SideEffect.objects.count() == 0
    assert handle(request(), view()).status_code == 201


@pytest.fixture
def unreachable_alias(tmp_path: Any) -> Iterator[str]:
    """The ``sqlite`` alias pointed at a database file that cannot be opened."""
    connection = connections["sqlite"]
    name = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = str(tmp_path / "missing" / "db.sqlite3")
    try:
        yield "sqlite"
    finally:
        connection.close()
        connection.settings_dict["NAME"] = name


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_store_unavailable_is_503_and_the_view_does_not_run(unreachable_alias: str) -> None:
    with override_settings(IDEMPOTENCY={"DATABASE": unreachable_alias}):
        response = handle(request(), view())
    assert_problem(response, 503, "store-unavailable")
    assert SideEffect.objects.count() == 0


@pytest.mark.urls("tests.support.gates")
@pytest.mark.django_db(transaction=True)
def test_heartbeat_follows_a_views_own_lock_timeout(gate: Any) -> None:
    """``@idempotent(lock_timeout=0.3)`` with the global LOCK_TIMEOUT of 60 s: the lease
    must be renewed within the view's 0.3 s, not every 20 s (a third of the global one),
    or a retry would take over a request that is still running."""
    assert conf.HEARTBEAT_INTERVAL == 20
    running = Background("/gated-short-lock/", "short")
    assert gate.entered.wait(timeout=30)
    first = locked_at("short")
    wait_until(lambda: locked_at("short") > first, timeout=60)  # renewed at all: not a race
    gate.opened.set()
    assert running.result().status_code == 201


@pytest.mark.django_db(transaction=True)
def test_sixteen_concurrent_requests_run_the_view_once() -> None:
    """Real threads, each with its own connection, released together on one key."""

    def send(_: int, body: dict[str, Any]) -> tuple[int, bool]:
        response = Client().post(
            "/t/fn/",
            {"amount": 1, **body},
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="race",
        )
        return response.status_code, response.has_header(REPLAYED_HEADER)

    answers = race_held(16, send, uuid.uuid4().hex)  # the others come while the first runs
    assert len(answers) == 16
    assert SideEffect.objects.count() == 1
    assert answers.count((201, False)) == 1, answers
    # every other request got the replay or was told to retry; none ran the view
    others = list(answers)
    others.remove((201, False))
    assert set(others) <= {(201, True), (409, False)}, answers


@pytest.mark.mariadb
@pytest.mark.urls("tests.support.faults")
@pytest.mark.django_db(databases=with_mariadb("default"), transaction=True)
def test_sixteen_concurrent_requests_run_the_view_once_on_mariadb(settings: Any) -> None:
    """The same race with the keys, and the view's write, on MariaDB (the ``db`` strategy's
    ON DUPLICATE KEY claim): one execution, every other request replayed or told to retry."""
    from ..support import faults

    settings.IDEMPOTENCY = {"DATABASE": "mariadb"}
    faults.reset()
    hold = uuid.uuid4().hex
    faults.interference.append(lambda key: holds.wait(hold))  # until the others are answered
    faults.plan.extend(["interfere"] * 16)

    def send(_: int, _body: dict[str, Any]) -> tuple[int, bool]:
        try:
            response = Client().post(
                "/fault/fn/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="race"
            )
            return response.status_code, response.has_header(REPLAYED_HEADER)
        finally:
            connections.close_all()

    try:
        answers = race_held(16, send, hold)
    finally:
        faults.reset()
    assert SideEffect.objects.using("mariadb").filter(label="race").count() == 1
    assert answers.count((201, False)) == 1, answers
    others = list(answers)
    others.remove((201, False))
    assert set(others) <= {(201, True), (409, False)}, answers
