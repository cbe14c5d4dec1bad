"""The library in a project's own test suite: a Django ``TestCase`` (the view runs inside
the test's transaction, which never commits) sees exactly the ``on_commit`` callbacks its
view registered, and the library's post-commit work still happens.

Real servers: PostgreSQL (``default``) and SQLite (``sqlite``); the hybrid strategy on the
shared Redis (DB 15) under a key prefix of the test's own, deleted afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
from django.db import connections, transaction
from django.test import Client, TestCase, override_settings
from rest_framework.test import APIClient

from django_idempotency.strategies.redis.store import get_store, reset_clients
from tests.testapp import views
from tests.testapp.models import SideEffect

from ..support import services
from ..support.api import replayed
from ..support.commands import ROOT
from ..support.factories import UserFactory
from ..support.redis_servers import delete_prefix
from ..support.shop import write_shop

pytestmark = pytest.mark.usefixtures("forget_queued_drains")

ENTRIES = {"drf": "/t/drf-hook/", "fn": "/t/fn-hook/"}


class OnCommitCase(TestCase):
    """One strategy on one alias; subclasses below name them."""

    alias: ClassVar[str] = "default"
    strategy: ClassVar[str] = "db"
    databases = {"default", "sqlite"}
    __test__ = False

    def setUp(self) -> None:
        views.hooks_ran.clear()
        self.prefix = f"idemtest-{uuid.uuid4().hex[:12]}"
        overrides: dict[str, Any] = {"STRATEGY": self.strategy, "DATABASE": self.alias}
        if self.strategy in {"redis", "hybrid"}:
            overrides |= {"REDIS_URL": services.REDIS_URL, "REDIS_KEY_PREFIX": self.prefix}
        self.enterContext(override_settings(IDEMPOTENCY=overrides))
        self.addCleanup(reset_clients)
        self.addCleanup(delete_prefix, services.REDIS_URL, self.prefix)
        self.user = UserFactory()

    def client_for(self, entry: str) -> Client:
        if entry == "drf":
            client = APIClient()
            client.force_authenticate(self.user)
            return client
        session = Client()
        session.force_login(self.user)
        return session

    def post(self, entry: str, key: str) -> Any:
        return self.client_for(entry).post(
            ENTRIES[entry],
            json.dumps({"a": 1}),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
        )

    def library_callbacks_seen(self) -> None:
        """Every entry, on both aliases: the view's one callback, and nothing else."""
        for entry in ENTRIES:
            with self.subTest(entry=entry):
                key = uuid.uuid4().hex
                with (
                    self.captureOnCommitCallbacks(using=self.alias) as on_alias,
                    self.captureOnCommitCallbacks(using="default") as on_default,
                ):
                    response = self.post(entry, key)
                assert response.status_code == 201, response.content
                seen = on_alias if self.alias == "default" else on_alias + on_default
                assert len(seen) == 1, seen
                seen[0]()
                assert views.hooks_ran == [f"{entry}-hook"]
                views.hooks_ran.clear()

    def test_the_view_registers_one_callback_and_the_test_sees_one(self) -> None:
        self.library_callbacks_seen()

    def test_callbacks_run_by_the_capture_run_once_and_the_retry_replays(self) -> None:
        for entry in ENTRIES:
            with self.subTest(entry=entry):
                key = uuid.uuid4().hex
                with self.captureOnCommitCallbacks(using=self.alias, execute=True) as seen:
                    first = self.post(entry, key)
                assert len(seen) == 1, seen
                assert views.hooks_ran == [f"{entry}-hook"]
                retry = self.post(entry, key)
                assert (retry.status_code, replayed(retry)) == (201, True)
                assert retry.content == first.content
                rows = SideEffect.objects.using(self.alias).filter(label=f"{entry}-hook")
                assert rows.count() == 1
                views.hooks_ran.clear()


@pytest.mark.postgres
class TestDbOnPostgres(OnCommitCase):
    __test__ = True


class TestDbOnSqlite(OnCommitCase):
    __test__ = True
    alias = "sqlite"


@pytest.mark.postgres
class TestAdvisoryOnPostgres(OnCommitCase):
    __test__ = True
    strategy = "advisory_lock"


@pytest.mark.redis
@pytest.mark.postgres
class TestHybridOnPostgres(OnCommitCase):
    __test__ = True
    strategy = "hybrid"

    def test_the_completed_record_is_in_redis_at_the_end_of_the_view(self) -> None:
        """In the test, the end of the view's block is where production commits: the
        library publishes the completed record then (no callback to run)."""
        key = uuid.uuid4().hex
        with self.captureOnCommitCallbacks() as seen:
            response = self.post("drf", key)
        assert (response.status_code, len(seen)) == (201, 1)
        record = get_store().get(f"user:{self.user.pk}", key)
        assert record is not None
        assert record.completed


@pytest.mark.redis
@pytest.mark.postgres
class TestRedisOnPostgres(OnCommitCase):
    __test__ = True
    strategy = "redis"


class InsideTheTestsOwnTransaction(OnCommitCase):
    """The view inside a transaction of the test's own (``ATOMIC_REQUESTS``, an atomic
    block around the request): the response is durable when that one commits, which in a
    TestCase is where its savepoint is released; the library's work waits for that, with
    no callback either."""

    strategy = "hybrid"

    def setUp(self) -> None:
        super().setUp()
        self.scope = f"user:{self.user.pk}"

    def completed(self, key: str) -> bool | None:
        record = get_store().get(self.scope, key)
        return None if record is None else record.completed

    def test_the_view_registers_one_callback_and_the_test_sees_one(self) -> None:
        for entry in ENTRIES:
            with self.subTest(entry=entry):
                key = uuid.uuid4().hex
                with self.captureOnCommitCallbacks(using=self.alias) as seen:
                    with transaction.atomic(using=self.alias):
                        assert self.post(entry, key).status_code == 201
                        # not before that "COMMIT" (redis: prepared until then)
                        assert self.completed(key) is False
                    assert self.completed(key) is True
                assert len(seen) == 1, seen

    def test_atomic_requests(self) -> None:
        settings = connections[self.alias].settings_dict
        self.addCleanup(settings.__setitem__, "ATOMIC_REQUESTS", settings["ATOMIC_REQUESTS"])
        settings["ATOMIC_REQUESTS"] = True
        for entry in ENTRIES:
            with self.subTest(entry=entry):
                key = uuid.uuid4().hex
                with self.captureOnCommitCallbacks(using=self.alias, execute=True) as seen:
                    first = self.post(entry, key)
                assert (first.status_code, len(seen)) == (201, 1), seen
                assert self.completed(key) is True
                retry = self.post(entry, key)
                assert (retry.status_code, replayed(retry)) == (201, True)

    def test_a_rollback_in_between_drops_the_work(self) -> None:
        key = uuid.uuid4().hex

        class Undone(Exception):
            pass

        with (
            transaction.atomic(using=self.alias),
            contextlib.suppress(Undone),
            transaction.atomic(using=self.alias),
        ):
            assert self.post("drf", key).status_code == 201
            raise Undone
        assert self.completed(key) is False  # the claim waits for its lease to expire

    def test_callbacks_run_by_the_capture_run_once_and_the_retry_replays(self) -> None:
        key = uuid.uuid4().hex
        with (
            self.captureOnCommitCallbacks(using=self.alias, execute=True) as seen,
            transaction.atomic(using=self.alias),
        ):
            first = self.post("fn", key)
        assert len(seen) == 1 and views.hooks_ran == ["fn-hook"]
        retry = self.post("fn", key)
        assert retry.content == first.content and replayed(retry)


@pytest.mark.redis
@pytest.mark.postgres
class TestHybridInsideTheTestsOwnTransaction(InsideTheTestsOwnTransaction):
    __test__ = True


@pytest.mark.redis
class TestRedisInsideTheTestsOwnTransactionOnSqlite(InsideTheTestsOwnTransaction):
    """The redis strategy's record stays prepared until that "COMMIT", as hybrid's waits."""

    __test__ = True
    strategy = "redis"
    alias = "sqlite"


# -- outside a TestCase: the connection's outermost transaction, or a project's own ----------


@pytest.fixture
def hybrid_settings(redis_prefix: str) -> Any:
    value = {
        "STRATEGY": "hybrid",
        "REDIS_URL": services.REDIS_URL,
        "REDIS_KEY_PREFIX": redis_prefix,
    }
    with override_settings(IDEMPOTENCY=value):
        yield value
    reset_clients()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
def test_the_view_finds_no_callback_of_the_librarys_in_its_transaction(strategy: str) -> None:
    """In production the view's transaction is the outermost: while the view runs, the
    connection's on_commit list holds nothing the library put there."""
    seen: list[list[Any]] = []
    views.contend.append(lambda using: seen.append(list(connections[using].run_on_commit)))
    try:
        with override_settings(IDEMPOTENCY={"STRATEGY": strategy}):
            client = APIClient()
            client.force_authenticate(UserFactory())
            response = client.post(
                "/t/contended/", {}, format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex
            )
    finally:
        views.contend.clear()
    assert response.status_code == 201
    assert seen == [[]]


@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_inside_a_projects_transaction_redis_waits_for_its_commit(
    hybrid_settings: Any, outcome: str
) -> None:
    """hybrid in an outer atomic: the completed record reaches Redis (and the drain is
    queued) only once that transaction commits, never when it rolls back."""
    user = UserFactory()
    client = APIClient()
    client.force_authenticate(user)
    key = uuid.uuid4().hex
    scope = f"user:{user.pk}"

    class RolledBack(Exception):
        pass

    views.hooks_ran.clear()
    with pytest.raises(RolledBack) if outcome == "rollback" else _nothing(), transaction.atomic():
        response = client.post("/t/drf-hook/", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
        assert response.status_code == 201
        record = get_store().get(scope, key)
        assert record is not None and not record.completed
        if outcome == "rollback":
            raise RolledBack
    record = get_store().get(scope, key)
    assert record is not None and record.completed is (outcome == "commit")
    assert views.hooks_ran[-1:] == (["drf-hook"] if outcome == "commit" else [])


def _nothing() -> Any:
    return contextlib.nullcontext()


# -- a project's own suite that never heard of django_idempotency.testing ---------------------
#
# The shop of tests/support/shop.py: two tests with one fixed key and the same user pk.
# Each suite runs as its own process, as the project runs it (pytest with pytest-django,
# `manage.py test`), on the shared Redis under a prefix of its own.

#: The plugin as pytest loads it from the entry point (named so, it loads once either way).
PLUGIN = "django_idempotency.testing.plugin"


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The shop's files, and the environment its suites run in (this checkout's package)."""
    write_shop(tmp_path)
    prefix = f"shop-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env |= {
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
        "SHOP_REDIS_URL": services.REDIS_URL,
        "SHOP_PREFIX": prefix,
    }
    yield tmp_path, env
    client = redis.Redis.from_url(services.REDIS_URL)
    leftover = list(client.scan_iter(match=f"{prefix}*"))
    if leftover:
        client.delete(*leftover)
    client.close()


def run_suite(shop: tuple[Path, dict[str, str]], *args: str, **env: str) -> Any:
    folder, base = shop
    return subprocess.run(
        [sys.executable, *args],
        cwd=folder,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def keys_left(shop: tuple[Path, dict[str, str]]) -> list[bytes]:
    client = redis.Redis.from_url(services.REDIS_URL)
    try:
        return list(client.scan_iter(match=f"{shop[1]['SHOP_PREFIX']}*"))
    finally:
        client.close()


PYTEST = ("-m", "pytest", "-p", "no:cacheprovider", "-q", "test_charges.py")


@pytest.mark.redis
def test_a_pytest_django_suite_is_isolated_by_the_plugin(shop: Any) -> None:
    """Loaded as the entry point loads it, and listed in the conftest.py as well (as
    before the entry point): once."""
    (shop[0] / "conftest.py").write_text(f"pytest_plugins = [{PLUGIN!r}]\n", encoding="utf-8")
    result = run_suite(shop, *PYTEST, "-p", PLUGIN)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    assert keys_left(shop) == []  # each test's records deleted after it


@pytest.mark.redis
@pytest.mark.parametrize(
    ("how", "args", "env"),
    [
        ("without the plugin", ("-p", f"no:{PLUGIN}"), {}),
        ("marked shared", ("-p", PLUGIN), {"SHOP_SHARED_MARK": "1"}),
        ("TEST_ISOLATION off", ("-p", PLUGIN), {"SHOP_TEST_ISOLATION": "0"}),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_pytest_django_suite_that_opts_out_replays(
    shop: Any, how: str, args: tuple[str, ...], env: dict[str, str]
) -> None:
    """What the plugin prevents: the second test's POST replays the first's charge."""
    result = run_suite(shop, *PYTEST, *args, **env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout, result.stdout
    assert "a replay of the earlier test's charge" in result.stdout


@pytest.mark.redis
def test_a_django_test_runner_suite_is_isolated(shop: Any) -> None:
    result = run_suite(shop, "manage.py", "test", "payments", "-v", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Ran 2 tests" in result.stderr and "OK" in result.stderr
    assert keys_left(shop) == []  # the run's records deleted when it ended


@pytest.mark.redis
def test_a_django_test_runner_suite_with_test_isolation_off_replays(shop: Any) -> None:
    result = run_suite(shop, "manage.py", "test", "payments", SHOP_TEST_ISOLATION="0")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED (failures=1)" in result.stderr
    assert "a replay of the earlier test's charge" in result.stderr


def test_the_entry_point_names_the_plugin_module() -> None:
    """pytest loads the ``pytest11`` entry point by the name pyproject.toml gives it; that
    name is the module's, so a conftest.py that lists it in ``pytest_plugins`` too loads
    it once, and ``-p no:<name>`` unloads it."""
    import importlib
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    entry_points = project["project"]["entry-points"]["pytest11"]
    assert entry_points == {PLUGIN: PLUGIN}
    module = importlib.import_module(PLUGIN)
    assert callable(module.pytest_configure)
    assert callable(module.idempotency_isolation)
