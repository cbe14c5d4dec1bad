"""Keys on one database, the views' writes on another (a ``DATABASE_ROUTERS`` router).

The view's transaction is opened on ``IDEMPOTENCY["DATABASE"]`` only, so a write routed to
another database commits on its own: a view that charges and then fails leaves the charge
behind with its key released (a retry charges again), and a response can be stored for a
charge whose own COMMIT fails afterwards. Here: the system check that says so (E030), the
setting that declares a split on purpose (``UNPROTECTED_DATABASES``), and the refusal, at
run time, of every write a claimed view sends to another database, before it executes:
a ``503 database-misconfigured``, the key given back, nothing stored.

Two layouts, on real databases: the keys on a second PostgreSQL database (``keys``) with
the views' data on ``default``; and the keys on ``default`` with the views' data routed to
the ``sqlite`` alias (the refusal on a SQLite connection, whose transactions begin with a
``BEGIN`` statement).
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections, router, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.checks.routing import SHOWN_MODELS, check_database_routing
from django_idempotency.checks.routing import _routed_writes as routed_writes
from django_idempotency.checks.settings import check_settings
from django_idempotency.conf import conf
from django_idempotency.decorators import idempotency_opt_in, idempotent
from django_idempotency.drf import idempotent_api_view
from django_idempotency.mixins import IdempotencyMixin
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.writeguard import writes
from example_project.payments.models import Charge

from ..support.api import api_client, replayed
from ..support.assertions import assert_problem
from ..support.factories import UserFactory
from ..support.threads import run_at_once
from ..testapp.models import SideEffect

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "keys", "sqlite"]),
    pytest.mark.urls(__name__),
]

SLUG = "database-misconfigured"
ROUTERS = "tests.support.routers."


@dataclass(frozen=True)
class Layout:
    """Where the keys live, where the router sends the views' writes, and the router
    of the fixed configuration (the views' models on the keys' database)."""

    keys: str
    other: str
    routers: tuple[str, ...]
    fixed: tuple[str, ...]


LAYOUTS = [
    pytest.param(
        Layout("keys", "default", (ROUTERS + "KeysApart",), (ROUTERS + "EverythingOnKeys",)),
        marks=pytest.mark.postgres,
        id="postgres-keys-apart",
    ),
    pytest.param(Layout("default", "sqlite", (ROUTERS + "TestAppOnSqlite",), ()), id="sqlite"),
]


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest, settings: Any) -> Layout:
    """The misconfigured deployment: keys on ``layout.keys``, the views' writes routed to
    ``layout.other``."""
    value: Layout = request.param
    settings.DATABASE_ROUTERS = list(value.routers)
    settings.IDEMPOTENCY = {"DATABASE": value.keys}
    return value


def fix(layout: Layout, settings: Any) -> None:
    """Route the views' models to the keys' database, as the check's hint says."""
    settings.DATABASE_ROUTERS = list(layout.fixed)


def committed(alias: str) -> int:
    """``SideEffect`` rows committed on ``alias`` (the test runs in autocommit)."""
    return SideEffect.objects.using(alias).count()


def stored(layout: Layout, key: str) -> bool:
    return IdempotencyKey.objects.using(layout.keys).filter(key=key).exists()


# -- the views --------------------------------------------------------------------------------


def _charge(label: str, payload: dict[str, Any]) -> None:
    SideEffect.objects.create(label=label)  # wherever the router sends it
    if payload.get("raise"):
        raise RuntimeError("the view failed after charging")


class ChargeView(IdempotencyMixin, APIView):
    def post(self, request: Request) -> Response:
        _charge("drf", dict(request.data))
        return Response({"charged": True}, status=201)


class SwallowingView(IdempotencyMixin, APIView):
    """Catches whatever its write raises and answers 201 all the same."""

    def post(self, request: Request) -> Response:
        with contextlib.suppress(Exception):
            SideEffect.objects.create(label="swallowed")
        return Response({"charged": "maybe"}, status=201)


class RawSqlView(IdempotencyMixin, APIView):
    """A write hidden in a common table expression, through a raw cursor."""

    def post(self, request: Request) -> Response:
        alias = router.db_for_write(SideEffect)
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "WITH made AS (INSERT INTO testapp_sideeffect (label, created_at) "
                "VALUES (%s, %s) RETURNING id) SELECT id FROM made",
                ["raw", timezone.now()],
            )
        return Response({"charged": True}, status=201)


class ReadingView(IdempotencyMixin, APIView):
    """Reads the other database (in a transaction and a savepoint there, with FOR UPDATE)
    and writes on the keys' database only."""

    def post(self, request: Request) -> Response:
        other = router.db_for_read(SideEffect)
        seen = SideEffect.objects.count()
        with transaction.atomic(using=other), transaction.atomic(using=other):
            locked = len(SideEffect.objects.select_for_update().filter(label="nothing"))
        SideEffect.objects.using(conf.DATABASE).create(label="read")
        return Response({"seen": seen, "locked": locked}, status=201)


@csrf_exempt
@idempotent
def charge_function(request: HttpRequest) -> HttpResponse:
    _charge("fn", json.loads(request.body or b"{}"))
    return JsonResponse({"charged": True}, status=201)


@csrf_exempt
@idempotent
async def charge_async(request: HttpRequest) -> HttpResponse:
    await SideEffect.objects.acreate(label="async")
    return JsonResponse({"charged": True}, status=201)


@idempotent_api_view(["POST"])
def charge_api_view(request: Request) -> Response:
    _charge("api", dict(request.data))
    return Response({"charged": True}, status=201)


@csrf_exempt
@idempotency_opt_in
def charge_middleware(request: HttpRequest) -> HttpResponse:
    _charge("mw", json.loads(request.body or b"{}"))
    return JsonResponse({"charged": True}, status=201)


urlpatterns = [
    path("drf/", ChargeView.as_view()),
    path("swallow/", SwallowingView.as_view()),
    path("raw/", RawSqlView.as_view()),
    path("read/", ReadingView.as_view()),
    path("fn/", charge_function),
    path("async/", charge_async),
    path("api/", charge_api_view),
    path("mw/", charge_middleware),
]

#: Every entry point: (path, whether it takes DRF's authenticated client).
ENTRY_POINTS = [
    pytest.param("/drf/", id="mixin"),
    pytest.param("/api/", id="idempotent_api_view"),
    pytest.param("/fn/", id="idempotent"),
    pytest.param("/async/", id="idempotent-async"),
    pytest.param("/mw/", id="middleware"),
]


@pytest.fixture
def with_middleware(settings: Any) -> None:
    middleware = "django_idempotency.middleware.IdempotencyMiddleware"
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, middleware]


def post(url: str, key: str, body: dict[str, Any] | None = None, user: Any = None) -> Any:
    client: Any = api_client(user) if user is not None else Client()
    return client.post(
        url, json.dumps(body or {}), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


# -- (a) the system check ---------------------------------------------------------------------


def ids(messages: list[Any]) -> list[str]:
    return [m.id or "" for m in messages]


def test_the_check_reports_writes_routed_away_from_the_keys(layout: Layout, settings: Any) -> None:
    found = [m for m in check_database_routing() if m.id == "django_idempotency.E030"]
    assert len(found) == 1, ids(check_database_routing())
    error = found[0]
    assert isinstance(error, Error)
    assert repr(layout.other) in error.msg and repr(layout.keys) in error.msg
    # The message names the project's first models (at most SHOWN_MODELS) and counts the rest.
    routed = routed_writes()[0][layout.other]
    assert "testapp.SideEffect" in routed
    shown = [label for label in routed if label in error.msg]
    assert len(shown) == min(len(routed), SHOWN_MODELS)
    more = len(routed) - SHOWN_MODELS
    assert (f"and {more} more" in error.msg) is (more > 0)
    assert "UNPROTECTED_DATABASES" in (error.hint or "")
    with pytest.raises(SystemCheckError, match="E030"):
        call_command("check")
    # A split declared on purpose is quiet, for the check and for `manage.py check`.
    settings.IDEMPOTENCY = {"DATABASE": layout.keys, "UNPROTECTED_DATABASES": [layout.other]}
    assert "django_idempotency.E030" not in ids(check_database_routing())
    assert check_settings() == []
    call_command("check")


def test_the_fixed_routing_is_quiet(layout: Layout, settings: Any) -> None:
    fix(layout, settings)
    assert check_database_routing() == []


@pytest.mark.parametrize(
    ("value", "word"),
    [(["nowhere"], "nowhere"), ("default", "list"), ([1], "list")],
)
def test_unprotected_databases_must_name_aliases(settings: Any, value: Any, word: str) -> None:
    settings.IDEMPOTENCY = {"UNPROTECTED_DATABASES": value}
    found = [m for m in check_settings() if m.id == "django_idempotency.E031"]
    assert len(found) == 1 and isinstance(found[0], Error) and found[0].hint
    assert word in found[0].msg


def test_the_keys_database_cannot_be_unprotected(settings: Any) -> None:
    settings.IDEMPOTENCY = {"UNPROTECTED_DATABASES": ["default"]}
    found = [m for m in check_settings() if m.id == "django_idempotency.E032"]
    assert len(found) == 1 and found[0].hint


def test_atomic_requests_on_an_unprotected_database_is_a_warning(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DATABASE_ROUTERS = [ROUTERS + "TestAppOnSqlite"]
    settings.IDEMPOTENCY = {"UNPROTECTED_DATABASES": ["sqlite"]}
    assert check_database_routing() == []
    monkeypatch.setitem(connections["sqlite"].settings_dict, "ATOMIC_REQUESTS", True)
    found = [m for m in check_database_routing() if m.id == "django_idempotency.W031"]
    assert len(found) == 1 and isinstance(found[0], Warning) and found[0].hint
    assert "'sqlite'" in found[0].msg


def test_the_librarys_models_routed_elsewhere_is_a_warning(settings: Any) -> None:
    settings.DATABASE_ROUTERS = [ROUTERS + "KeysApart"]  # keys' models on "keys"
    messages = check_database_routing()  # IDEMPOTENCY["DATABASE"] is "default"
    found = [m for m in messages if m.id == "django_idempotency.W030"]
    assert len(found) == 1 and isinstance(found[0], Warning) and found[0].hint
    assert "IdempotencyKey" in found[0].msg and "'keys'" in found[0].msg
    assert "django_idempotency.E030" not in ids(messages)


# -- (b) the write is refused, the key given back ---------------------------------------------


@pytest.mark.usefixtures("with_middleware")
@pytest.mark.parametrize("url", ENTRY_POINTS)
def test_a_write_on_another_database_is_refused_and_the_key_released(
    layout: Layout, settings: Any, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    user = UserFactory() if url in ("/drf/", "/api/") else None
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        response = post(url, "pay-1", {"raise": True}, user)
    problem = assert_problem(response, 503, SLUG)
    assert layout.other not in json.dumps(problem)  # nothing of the deployment to the client
    assert committed(layout.other) == 0
    assert not stored(layout, "pay-1")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and repr(layout.other) in errors[0].getMessage()
    assert "testapp_sideeffect" in errors[0].getMessage()
    # The retry is refused the same way while the deployment is wrong: never charged.
    assert_problem(post(url, "pay-1", {"raise": True}, user), 503, SLUG)
    assert committed(layout.other) == 0
    # Once the routing is fixed, the same key runs the view, once.
    fix(layout, settings)
    first = post(url, "pay-1", {}, user)
    assert first.status_code == 201 and not replayed(first)
    again = post(url, "pay-1", {}, user)
    assert again.status_code == 201 and replayed(again)
    assert committed(layout.keys) == 1
    assert committed(layout.other) == 0


@pytest.mark.usefixtures("with_middleware")
@pytest.mark.parametrize("url", ["/async/", "/mw/"])
def test_on_an_async_stack_the_write_is_refused_too(
    layout: Layout, settings: Any, url: str
) -> None:
    """Django's ASGI handler: the middleware's async ``process_view`` and the async view,
    whose ORM calls run through ``sync_to_async`` on the session's thread."""
    client = AsyncClient()
    headers = {"Idempotency-Key": "pay-1"}

    def send() -> Any:
        return async_to_sync(client.post)(url, "{}", "application/json", headers=headers)

    assert_problem(send(), 503, SLUG)
    assert committed(layout.other) == 0
    assert not stored(layout, "pay-1")
    fix(layout, settings)
    assert send().status_code == 201
    assert replayed(send())
    assert committed(layout.keys) == 1


def test_a_view_that_swallows_the_refusal_is_not_stored(layout: Layout) -> None:
    user = UserFactory()
    assert_problem(post("/swallow/", "k", None, user), 503, SLUG)
    assert committed(layout.other) == 0
    assert not stored(layout, "k")


def test_a_write_in_a_common_table_expression_is_refused(layout: Layout) -> None:
    user = UserFactory()
    assert_problem(post("/raw/", "k", None, user), 503, SLUG)
    assert committed(layout.other) == 0
    assert not stored(layout, "k")


# -- (c) ATOMIC_REQUESTS on the other database --------------------------------------------------


class DeferredChargeView(IdempotencyMixin, APIView):
    """A charge whose foreign key PostgreSQL checks at COMMIT (Django's FKs are
    DEFERRABLE INITIALLY DEFERRED): the INSERT passes, the COMMIT of ``default`` fails."""

    def post(self, request: Request) -> Response:
        Charge.objects.create(user_id=10**12, amount=500, currency="eur", psp_reference="x")
        return Response({"charged": True}, status=201)


@pytest.mark.postgres
def test_atomic_requests_on_the_other_database_cannot_replay_a_charge_that_does_not_exist(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DATABASE_ROUTERS = [ROUTERS + "KeysApart"]
    settings.IDEMPOTENCY = {"DATABASE": "keys"}
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    # Built now, as a project with these settings builds it: exempt from ATOMIC_REQUESTS on
    # the keys' database only, so Django wraps it in a transaction on "default".
    view = DeferredChargeView.as_view()
    assert view._non_atomic_requests == {"keys"}
    user = UserFactory()
    urls = ModuleType("deferred_charge_urls")
    urls.urlpatterns = [path("c/", view)]  # type: ignore[attr-defined]
    with override_settings(ROOT_URLCONF=urls):
        for _attempt in range(2):
            response = post("/c/", "pay-1", None, user)
            assert_problem(response, 503, SLUG)
            assert not replayed(response)
    assert Charge.objects.using("default").count() == 0
    assert not IdempotencyKey.objects.using("keys").exists()


# -- (d) reads, (e) a declared split ---------------------------------------------------------


def test_reads_on_the_other_database_are_let_through(layout: Layout) -> None:
    SideEffect.objects.using(layout.other).create(label="earlier")
    user = UserFactory()
    first = post("/read/", "k", None, user)
    assert first.status_code == 201, first.content
    assert first.json() == {"seen": 1, "locked": 0}
    again = post("/read/", "k", None, user)
    assert again.status_code == 201 and replayed(again)
    assert SideEffect.objects.using(layout.keys).filter(label="read").count() == 1


def test_a_declared_split_lets_writes_through_outside_the_protection(
    layout: Layout, settings: Any
) -> None:
    settings.IDEMPOTENCY = {"DATABASE": layout.keys, "UNPROTECTED_DATABASES": [layout.other]}
    user = UserFactory()
    first = post("/drf/", "k", None, user)
    assert first.status_code == 201 and not replayed(first)
    assert replayed(post("/drf/", "k", None, user))
    assert committed(layout.other) == 1
    # Outside the protection, as documented: the write of a view that then fails is not
    # rolled back with the key, and the retry writes again.
    with pytest.raises(RuntimeError):
        post("/drf/", "k2", {"raise": True}, user)
    with pytest.raises(RuntimeError):
        post("/drf/", "k2", {"raise": True}, user)
    assert committed(layout.other) == 3


# -- (f) a real race under the misconfiguration -----------------------------------------------


def test_racing_threads_on_one_key_never_write_across(layout: Layout, settings: Any) -> None:
    user = UserFactory()

    def send(_: int) -> int:
        return int(post("/drf/", "race", None, user).status_code)

    statuses = run_at_once(8, send)
    assert set(statuses) <= {503, 409}, statuses
    assert 503 in statuses
    assert committed(layout.other) == 0
    assert not stored(layout, "race")
    fix(layout, settings)
    statuses = run_at_once(8, send)
    assert statuses.count(201) >= 1 and set(statuses) <= {201, 409}, statuses
    assert committed(layout.keys) == 1


# -- the statements let through ---------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT "testapp_sideeffect"."id" FROM "testapp_sideeffect"',
        "  select 1",
        "(SELECT 1) UNION (SELECT 2)",
        "SELECT * FROM t WHERE label = 'INSERT INTO x' FOR UPDATE",
        'SELECT "insert", "delete" FROM "update"',
        "-- a comment\nSELECT 1",
        "/* INSERT */ SELECT 1",
        "WITH x AS (SELECT 1) SELECT * FROM x",
        "VALUES (1)",
        'SAVEPOINT "s1_x1"',
        'RELEASE SAVEPOINT "s1_x1"',
        'ROLLBACK TO SAVEPOINT "s1_x1"',
        "BEGIN",
        "SHOW TRANSACTION ISOLATION LEVEL",
        "SET LOCAL statement_timeout = 1000",
        "EXPLAIN SELECT 1",
        "PRAGMA table_info(testapp_sideeffect)",
        "SELECT $$INSERT$$, $tag$DELETE$tag$",
        "SELECT 1;",
    ],
)
def test_reads_and_transaction_control_do_not_write(sql: str) -> None:
    assert not writes(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t VALUES (1)",
        " update t set a = 1",
        "DELETE FROM t",
        "MERGE INTO t USING s ON true WHEN MATCHED THEN DELETE",
        "COPY t FROM STDIN",
        "CREATE TABLE t (a int)",
        "DROP TABLE t",
        "TRUNCATE t",
        "ALTER TABLE t ADD b int",
        "WITH x AS (INSERT INTO t VALUES (1) RETURNING a) SELECT * FROM x",
        "WITH x AS (SELECT 1) DELETE FROM t",
        "SELECT * INTO t2 FROM t",
        "EXPLAIN ANALYZE DELETE FROM t",
        "SELECT 1; DELETE FROM t",
        "/* SELECT */ INSERT INTO t VALUES (1)",
        "(INSERT INTO t VALUES (1))",
        "REPLACE INTO t VALUES (1)",
        "CALL charge()",
        "DO $$BEGIN DELETE FROM t; END$$",
        "PRAGMA journal_mode = DELETE",
        "",
    ],
)
def test_writes_and_anything_unknown_are_writes(sql: str) -> None:
    assert writes(sql)
