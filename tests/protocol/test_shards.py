"""Keys follow the data across shards (``KEY_DATABASES``, ``DATABASE_ROUTING``).

A project shards its data by tenant over two real PostgreSQL databases (``default`` for
tenant ``a``, ``keys`` for tenant ``b``; tests/testapp/tenants.py): a tenant middleware
sets the request's tenant, a tenant router sends the models there, and each request's key
is kept on its tenant's database, chosen by the router (``"router"``) or by a callable.
Here: where each key lands, that the completion commits in the view's own transaction on
each shard (a failed view leaves nothing there), a thread race per tenant, the refusal of a
write to another tenant's shard and of a chosen alias that holds no keys, the waiters of a
key on the second shard, the strategies db, advisory_lock and hybrid, and purge, drain and
the admin across both databases.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib import admin
from django.core.management import call_command
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import tasks
from django_idempotency.decorators import idempotent
from django_idempotency.mixins import IdempotencyMixin
from django_idempotency.models import IdempotencyKey, IdempotencyOutbox
from django_idempotency.protocol import shards
from django_idempotency.protocol.keys import key_digest
from django_idempotency.protocol.replay import REPLAYED_HEADER
from django_idempotency.store.status import COMPLETED
from django_idempotency.strategies import waiting
from tests.testapp.models import SideEffect
from tests.testapp.tenants import TENANTS, tenant, tenant_of, tenant_scope

from ..support.assertions import assert_problem
from ..support.factories import (
    CompletedKeyFactory,
    ExpiredKeyFactory,
    IdempotencyOutboxFactory,
    StaleKeyFactory,
)
from ..support.threads import run_at_once
from ..support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "keys", "sqlite"]),
    pytest.mark.urls(__name__),
]

SHARDS = ["default", "keys"]
CALLABLE = "tests.testapp.tenants.tenant_database"
ROUTINGS = [pytest.param(shards.ROUTER, id="router"), pytest.param(CALLABLE, id="callable")]


# -- the views --------------------------------------------------------------------------------


def _charge(request: HttpRequest, body: bytes) -> HttpResponse:
    payload = json.loads(body or b"{}")
    if payload.get("hold"):
        HELD.entered.set()
        HELD.go.wait(10)
    SideEffect.objects.create(label=f"charge:{tenant_of(request)}")  # the tenant's shard
    if payload.get("to"):
        SideEffect.objects.using(payload["to"]).create(label="elsewhere")
    if payload.get("fail"):
        raise RuntimeError("the view failed after charging")
    return JsonResponse({"tenant": tenant_of(request)}, status=201)


@csrf_exempt
@idempotent(scope=tenant_scope)
def charge(request: HttpRequest) -> HttpResponse:
    return _charge(request, request.body)


@csrf_exempt
@idempotent(scope=lambda request: "shared")
def shared_scope_charge(request: HttpRequest) -> HttpResponse:
    return _charge(request, request.body)


@csrf_exempt
@idempotent(scope=tenant_scope)
async def acharge(request: HttpRequest) -> HttpResponse:
    await SideEffect.objects.acreate(label=f"async:{tenant_of(request)}")
    return JsonResponse({"tenant": tenant_of(request)}, status=201)


class ChargeView(IdempotencyMixin, APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def get_idempotency_scope(self, request: Request) -> str:
        return tenant_scope(request)

    def post(self, request: Request) -> Response:
        SideEffect.objects.create(label=f"drf:{tenant_of(request)}")
        return Response({"tenant": tenant_of(request)}, status=201)


urlpatterns = [
    path("charge/", charge),
    path("shared/", shared_scope_charge),
    path("drf/", ChargeView.as_view()),
    path("async/", acharge),
    path("admin/", admin.site.urls),
]


class Held:
    """A view that waits for ``go`` after setting ``entered``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()


HELD = Held()


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture
def sharded(settings: Any) -> Callable[..., dict[str, Any]]:
    """``sharded(routing, **more)``: tenants sharded over ``default`` and ``keys``, the keys
    chosen per request by ``routing``."""
    settings.DATABASE_ROUTERS = ["tests.testapp.tenants.TenantRouter"]
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.testapp.tenants.TenantMiddleware"]

    def apply(routing: str, **more: Any) -> dict[str, Any]:
        value = {"KEY_DATABASES": SHARDS, "DATABASE_ROUTING": routing, **more}
        settings.IDEMPOTENCY = value
        return value

    return apply


@pytest.fixture(params=ROUTINGS)
def routing(request: pytest.FixtureRequest, sharded: Callable[..., Any]) -> str:
    value = str(request.param)
    sharded(value)
    return value


@pytest.fixture(autouse=True)
def fresh_hold() -> Iterator[None]:
    global HELD
    HELD = Held()
    yield
    HELD.go.set()


def post(
    tenant_name: str, key: str, url: str = "/charge/", client: Client | None = None, **body: Any
) -> Any:
    return (client or Client()).post(
        url,
        json.dumps(body),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
        HTTP_X_TENANT=tenant_name,
    )


def effects(alias: str) -> list[str]:
    return sorted(SideEffect.objects.using(alias).values_list("label", flat=True))


def keys_on(alias: str, **where: Any) -> list[tuple[str, str]]:
    rows = IdempotencyKey.objects.using(alias).filter(**where)
    return sorted(rows.values_list("scope", "key"))


# -- where each key lives ---------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
@pytest.mark.parametrize("url", ["/charge/", "/drf/"])
def test_each_tenants_key_and_writes_are_on_its_own_shard(
    routing: str, sharded: Callable[..., Any], strategy: str, url: str
) -> None:
    sharded(routing, STRATEGY=strategy)
    for name in ("a", "b"):
        first = post(name, "order-1", url)
        assert first.status_code == 201, first.content
        assert first.json() == {"tenant": name}
        again = post(name, "order-1", url)
        assert again.status_code == 201
        assert again[REPLAYED_HEADER] == "true"
    label = "charge" if url == "/charge/" else "drf"
    assert effects("default") == [f"{label}:a"]
    assert effects("keys") == [f"{label}:b"]
    assert keys_on("default", status=COMPLETED) == [("tenant:a", "order-1")]
    assert keys_on("keys", status=COMPLETED) == [("tenant:b", "order-1")]


def test_an_async_view_keeps_each_key_on_its_tenants_shard(routing: str) -> None:
    client = AsyncClient()
    for name in ("a", "b", "b"):
        answer = async_to_sync(client.post)(
            "/async/",
            "{}",
            content_type="application/json",
            headers={"Idempotency-Key": "async-1", "X-Tenant": name},
        )
        assert answer.status_code == 201
    assert effects("default") == ["async:a"] and effects("keys") == ["async:b"]
    assert keys_on("keys", status=COMPLETED) == [("tenant:b", "async-1")]


@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
def test_a_view_that_fails_leaves_no_key_and_no_write_on_its_shard(
    routing: str, sharded: Callable[..., Any], strategy: str
) -> None:
    sharded(routing, STRATEGY=strategy)
    client = Client(raise_request_exception=False)
    failed = post("b", "order-2", client=client, fail=True)
    assert failed.status_code == 500
    assert effects("keys") == [] and keys_on("keys") == []
    assert effects("default") == [] and keys_on("default") == []
    retried = post("b", "order-2")
    assert retried.status_code == 201
    assert effects("keys") == ["charge:b"]


def test_the_same_scope_and_key_on_two_shards_are_two_records(routing: str) -> None:
    """A key is identified by (scope, key) on its database: two shards keep two records,
    each run once."""
    for name in ("a", "b", "a", "b"):
        assert post(name, "same", "/shared/").status_code == 201
    assert effects("default") == ["charge:a"]
    assert effects("keys") == ["charge:b"]
    assert keys_on("default") == keys_on("keys") == [("shared", "same")]


@pytest.mark.redis
@pytest.mark.usefixtures("forget_queued_drains")
@pytest.mark.parametrize(
    ("strategy", "more"),
    [("redis", {}), ("hybrid", {}), ("hybrid", {"HYBRID_DB_CHECK": "always"})],
    ids=["redis", "hybrid", "hybrid-db-check"],
)
def test_the_same_scope_and_key_on_two_shards_are_two_records_in_redis_too(
    sharded: Callable[..., Any],
    redis_settings: Any,
    shared_redis_url: str,
    strategy: str,
    more: dict[str, Any],
) -> None:
    """Redis is shared by every shard, but a record there is named after the key's
    database too: the same scope and key on two shards (a user id that repeats across
    tenants' user tables) never replays one tenant's answer to the other."""
    value = sharded(shards.ROUTER)
    redis_settings(shared_redis_url, STRATEGY=strategy, **more, **value)
    answers = {name: [post(name, "same", "/shared/") for _ in range(2)] for name in "ab"}
    for name, (first, retry) in answers.items():
        assert first.status_code == 201 and first.json() == {"tenant": name}
        assert retry[REPLAYED_HEADER] == "true" and retry.json() == {"tenant": name}
    assert effects("default") == ["charge:a"]
    assert effects("keys") == ["charge:b"]


@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
def test_racing_threads_run_each_tenants_view_once(
    sharded: Callable[..., Any], strategy: str
) -> None:
    sharded(shards.ROUTER, STRATEGY=strategy)
    threads = 8
    answers = run_at_once(threads, lambda i: post("ab"[i % 2], "race").status_code)
    assert effects("default") == ["charge:a"]
    assert effects("keys") == ["charge:b"]
    assert answers.count(201) >= 2
    assert set(answers) <= {201, 409}


# -- what is refused --------------------------------------------------------------------------


def test_a_write_to_another_tenants_shard_is_refused(
    routing: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        answer = post("a", "cross", to="keys")
    assert_problem(answer, 503, "database-misconfigured")
    assert "'keys'" in caplog.text and "'default'" in caplog.text
    assert effects("default") == [] and effects("keys") == []
    assert keys_on("default", status=COMPLETED) == []
    assert post("a", "cross").status_code == 201  # the key was given back


def test_an_alias_that_holds_no_keys_is_a_503_before_the_claim(
    sharded: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    sharded(CALLABLE)
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        answer = post("nobody", "k")
    assert_problem(answer, 503, "database-misconfigured")
    assert "'sqlite'" in caplog.text and "KEY_DATABASES" in caplog.text
    for alias in (*SHARDS, "sqlite"):
        assert IdempotencyKey.objects.using(alias).count() == 0
        assert SideEffect.objects.using(alias).count() == 0


def test_without_routing_every_key_is_on_database(settings: Any) -> None:
    settings.IDEMPOTENCY = {"DATABASE": "keys"}
    assert shards.key_database(HttpRequest()) == "keys"


def test_a_decorated_view_is_exempt_from_atomic_requests_on_every_shard(
    sharded: Callable[..., Any],
) -> None:
    sharded(shards.ROUTER)

    @idempotent
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    assert getattr(view, "_non_atomic_requests", None) == set(SHARDS)
    assert getattr(ChargeView.as_view(), "_non_atomic_requests", None) == set(SHARDS)


# -- waiters ----------------------------------------------------------------------------------


def test_a_waiter_on_the_second_shard_is_woken_with_its_replay(
    sharded: Callable[..., Any],
) -> None:
    """The poll interval is longer than the wait: only ``keys``' NOTIFY can wake it in
    time to replay (the poll would come after the wait ran out, into a 409)."""
    sharded(shards.ROUTER, WAIT=120, WAIT_POLL_INTERVAL=600)
    answers: dict[str, Any] = {}

    def first() -> None:
        answers["first"] = post("b", "wait", hold=True)
        connections.close_all()

    def second() -> None:
        answers["second"] = post("b", "wait", hold=True)
        connections.close_all()

    owner = threading.Thread(target=first)
    owner.start()
    assert HELD.entered.wait(60)
    waiter = threading.Thread(target=second)
    waiter.start()
    # It found the key in progress, subscribed before that claim: only a wake-up (or the
    # poll, past the wait) makes it claim again.
    wait_until(lambda: waiting.slots.taken >= 1, timeout=60)
    HELD.go.set()
    owner.join(60)
    waiter.join(180)
    assert not owner.is_alive() and not waiter.is_alive()
    assert answers["first"].status_code == answers["second"].status_code == 201
    assert answers["second"][REPLAYED_HEADER] == "true"
    assert effects("keys") == ["charge:b"]


def test_the_second_shards_listener_hears_its_notifications(sharded: Callable[..., Any]) -> None:
    """With only ``keys``' listener running, a completion's NOTIFY on ``keys`` wakes the key's
    waiters (those of every process), and the same NOTIFY on ``default`` does not:
    notifications do not cross databases, so each key database has its own listener."""
    sharded(shards.ROUTER)
    waiting.reset_listeners()
    listener = waiting.postgres_listener("keys")
    assert listener.ensure(5)
    digest = key_digest("tenant:b", "notified")
    with waiting.hub.subscribe(digest) as woken:
        with transaction.atomic(using="default"):
            waiting.notify_database("default", "tenant:b", "notified")
        assert not woken.wait(0.5)
        with transaction.atomic(using="keys"):
            waiting.notify_database("keys", "tenant:b", "notified")
        assert woken.wait(3)


# -- purge, drain, admin ----------------------------------------------------------------------


def test_purge_covers_every_key_database(sharded: Callable[..., Any]) -> None:
    sharded(shards.ROUTER)
    for alias in SHARDS:
        ExpiredKeyFactory.create_batch(2, _using=alias)
        CompletedKeyFactory(_using=alias)
    out = io.StringIO()
    call_command("purge_idempotency_keys", stdout=out)
    for alias in SHARDS:
        assert f"from database {alias!r}" in out.getvalue()
        assert IdempotencyKey.objects.using(alias).count() == 1
    ExpiredKeyFactory.create_batch(3, _using="keys")
    ExpiredKeyFactory.create_batch(1, _using="default")
    call_command("purge_idempotency_keys", "--database", "keys", stdout=io.StringIO())
    assert IdempotencyKey.objects.using("keys").count() == 1
    assert IdempotencyKey.objects.using("default").count() == 2
    assert tasks.purge_expired_keys() == 1
    assert IdempotencyKey.objects.using("default").count() == 1


def test_the_drain_covers_every_key_database(sharded: Callable[..., Any]) -> None:
    sharded(shards.ROUTER)
    for alias, count in (("default", 2), ("keys", 3)):
        IdempotencyOutboxFactory.create_batch(count, _using=alias)
    out = io.StringIO()
    call_command("drain_idempotency_outbox", stdout=out)
    assert "Drained 2 idempotency outbox rows" in out.getvalue()
    assert "Drained 3 idempotency outbox rows" in out.getvalue()
    for alias, count in (("default", 2), ("keys", 3)):
        assert IdempotencyOutbox.objects.using(alias).count() == 0
        assert IdempotencyKey.objects.using(alias).count() == count
    IdempotencyOutboxFactory.create_batch(2, _using="keys")
    IdempotencyOutboxFactory.create_batch(1, _using="default")
    result = tasks.drain_outbox()
    assert result["drained"] == 3
    IdempotencyOutboxFactory.create_batch(1, _using="keys")
    IdempotencyOutboxFactory.create_batch(1, _using="default")
    call_command("drain_idempotency_outbox", "--database", "keys", stdout=io.StringIO())
    assert IdempotencyOutbox.objects.using("keys").count() == 0
    assert IdempotencyOutbox.objects.using("default").count() == 1


def test_the_admin_lists_and_acts_on_each_key_database(
    sharded: Callable[..., Any], admin_client: Client
) -> None:
    sharded(shards.ROUTER)
    on_a = CompletedKeyFactory(_using="default", key="key-of-a")
    on_b = ExpiredKeyFactory(_using="keys", key="key-of-b")
    changelist = reverse("admin:django_idempotency_idempotencykey_changelist")
    first = admin_client.get(changelist).content.decode()
    assert "key-of-a" in first and "key-of-b" not in first
    assert "?database=keys" in first  # the filter offers the other shard
    second = admin_client.get(changelist, {"database": "keys"}).content.decode()
    assert "key-of-b" in second and "key-of-a" not in second
    change = reverse("admin:django_idempotency_idempotencykey_change", args=[on_b.pk])
    page = admin_client.get(change, {"_changelist_filters": "database=keys"})
    assert page.status_code == 200 and "key-of-b" in page.content.decode()
    purged = admin_client.post(
        changelist + "?database=keys",
        {"action": "purge_expired_keys", "_selected_action": [str(on_b.pk)]},
        follow=True,
    )
    assert "Purged 1 expired key." in purged.content.decode()
    assert not IdempotencyKey.objects.using("keys").exists()
    assert IdempotencyKey.objects.using("default").filter(pk=on_a.pk).exists()
    stuck = StaleKeyFactory(_using="keys", key="stuck-of-b")
    confirm = admin_client.post(
        changelist + "?database=keys",
        {"action": "release_stuck_keys", "_selected_action": [str(stuck.pk)]},
    )
    assert "stuck-of-b" in confirm.content.decode()  # the confirmation found it on keys
    released = admin_client.post(
        changelist + "?database=keys",
        {"action": "release_stuck_keys", "_selected_action": [str(stuck.pk)], "post": "yes"},
        follow=True,
    )
    assert "Released 1 in-progress key." in released.content.decode()
    assert not IdempotencyKey.objects.using("keys").exists()
    IdempotencyOutboxFactory(_using="keys", key="pending-of-b")
    outbox = reverse("admin:django_idempotency_idempotencyoutbox_changelist")
    assert "pending-of-b" not in admin_client.get(outbox).content.decode()
    assert "pending-of-b" in admin_client.get(outbox, {"database": "keys"}).content.decode()


# -- hybrid -----------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.usefixtures("forget_queued_drains")
def test_hybrid_puts_each_outbox_row_on_its_shard(
    sharded: Callable[..., Any], redis_settings: Any, shared_redis_url: str
) -> None:
    value = sharded(shards.ROUTER)
    redis_settings(shared_redis_url, STRATEGY="hybrid", HYBRID_DB_CHECK="always", **value)
    for name in ("a", "b"):
        assert post(name, "hot").status_code == 201
        assert post(name, "hot")[REPLAYED_HEADER] == "true"
    assert effects("default") == ["charge:a"] and effects("keys") == ["charge:b"]
    for alias, scope in (("default", "tenant:a"), ("keys", "tenant:b")):
        rows = IdempotencyOutbox.objects.using(alias).values_list("scope", flat=True)
        assert list(rows) == [scope]
    tasks.drain_outbox()
    assert keys_on("default") == [("tenant:a", "hot")]
    assert keys_on("keys") == [("tenant:b", "hot")]
    with tenant("b"):
        assert IdempotencyKey.objects.get().scope == "tenant:b"  # the router's read
    assert TENANTS == {"a": "default", "b": "keys"}


@pytest.mark.redis
@pytest.mark.usefixtures("forget_queued_drains")
def test_hybrid_racing_threads_run_each_tenants_view_once(
    sharded: Callable[..., Any], redis_settings: Any, shared_redis_url: str
) -> None:
    value = sharded(shards.ROUTER)
    redis_settings(shared_redis_url, STRATEGY="hybrid", HYBRID_DB_CHECK="always", **value)
    answers = run_at_once(8, lambda i: post("ab"[i % 2], "hot-race").status_code)
    assert effects("default") == ["charge:a"]
    assert effects("keys") == ["charge:b"]
    assert answers.count(201) >= 2 and set(answers) <= {201, 409}
    tasks.drain_outbox()
    assert keys_on("default") == [("tenant:a", "hot-race")]
    assert keys_on("keys") == [("tenant:b", "hot-race")]


def test_expired_rows_are_left_alone_by_the_placement(sharded: Callable[..., Any]) -> None:
    """An expired key on one shard is replaced by a new execution there only."""
    sharded(shards.ROUTER)
    ExpiredKeyFactory(
        _using="keys", scope="tenant:b", key="old", expires_at=timezone.now() - timedelta(1)
    )
    assert post("b", "old").status_code == 201
    assert effects("keys") == ["charge:b"] and effects("default") == []
