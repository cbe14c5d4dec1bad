"""django_idempotency.testing: the helpers a project's test suite uses, against the shared
Redis (DB 15), whose other keys they must never touch.

The motivating case: with the ``redis`` strategy two ``TestCase`` tests that send the same
key for the same user (the same primary key) share a Redis record, which the first test's
rollback does not undo; the second test's POST replays and its charge is never created.
"""

from __future__ import annotations

import json
import unittest
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import TestCase, override_settings
from rest_framework.test import APIClient, APITestCase

from django_idempotency.conf import conf
from django_idempotency.strategies import get_strategy
from django_idempotency.strategies.redis.store import get_store, reset_clients
from django_idempotency.testing import (
    IdempotencyTestMixin,
    clear_store,
    isolated_store,
    testcases,
    use_strategy,
)
from example_project.payments.models import Charge

from .support import services
from .support.api import replayed
from .support.redis_servers import delete_prefix

pytestmark = [pytest.mark.redis, pytest.mark.postgres]

#: One primary key for the user of every test below: what a database that resets its
#: sequence between tests (SQLite) gives each test's first user.
USER_PK = 424242
KEY = "same-key-in-every-test"


@pytest.fixture
def redis_strategy(redis_prefix: str) -> Iterator[str]:
    """The redis strategy on the shared Redis, under the base prefix ``redis_prefix``."""
    value = {"STRATEGY": "redis", "REDIS_URL": services.REDIS_URL, "REDIS_KEY_PREFIX": redis_prefix}
    with override_settings(IDEMPOTENCY=value):
        yield redis_prefix
    reset_clients()


@pytest.fixture
def raw_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(services.REDIS_URL)
    yield client
    client.close()


def charge(test: Any) -> Any:
    """POST a charge to the DRF example for the user ``USER_PK``, with ``KEY``."""
    user, _ = get_user_model().objects.get_or_create(pk=USER_PK, defaults={"username": "payer"})
    client = APIClient()
    client.force_authenticate(user)
    body = json.dumps({"amount": 500, "currency": "eur"})
    return client.post(
        "/ex/drf-class/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=KEY
    )


def two_tests(*bases: type) -> unittest.TestResult:
    """Run two TestCase tests, one after the other, each charging with ``KEY`` for
    ``USER_PK`` and asserting that its own charge was created."""

    class Charges(*bases):  # type: ignore[misc]
        def charge_is_created(self) -> None:
            response = charge(self)
            assert response.status_code == 201, response.content
            assert not replayed(response), "an earlier test's response was replayed"
            assert Charge.objects.filter(user_id=USER_PK).count() == 1

        test_first = charge_is_created
        test_second = charge_is_created

    result = unittest.TestResult()
    unittest.TestSuite([Charges("test_first"), Charges("test_second")]).run(result)
    return result


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_strategy")
@pytest.mark.parametrize("base", [TestCase, APITestCase], ids=["TestCase", "APITestCase"])
def test_with_the_mixin_each_test_creates_its_charge(base: type) -> None:
    result = two_tests(IdempotencyTestMixin, base)
    assert (result.testsRun, result.failures, result.errors) == (2, [], [])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_strategy")
def test_without_it_the_second_test_gets_the_first_tests_response() -> None:
    """What the docs warn about: the record outlives the first test's rollback."""
    result = two_tests(TestCase)
    assert result.testsRun == 2 and result.errors == []
    assert [str(test) for test, _ in result.failures] == [
        "test_second (tests.test_testing.two_tests.<locals>.Charges.test_second)"
    ]
    assert "an earlier test's response was replayed" in result.failures[0][1]


@pytest.mark.django_db(transaction=True)
def test_the_mixin_deletes_only_its_own_keys(redis_strategy: str, raw_redis: redis.Redis) -> None:
    """Another test's (another process's) keys under the base prefix survive: no flush."""
    raw_redis.set(f"{redis_strategy}:{{other}}:rec", b"x")
    seen: list[str] = []

    class Records(IdempotencyTestMixin, TestCase):
        def test_charge(self) -> None:
            seen.append(get_store().prefix)
            assert charge(self).status_code == 201
            assert raw_redis.keys(f"{get_store().prefix}:*") != []

    result = unittest.TestResult()
    Records("test_charge").run(result)
    assert (result.failures, result.errors) == ([], [])
    (prefix,) = seen
    assert prefix.startswith(f"{redis_strategy}-test-") and get_store().prefix == redis_strategy
    assert raw_redis.keys(f"{prefix}:*") == []
    assert raw_redis.get(f"{redis_strategy}:{{other}}:rec") == b"x"


@pytest.mark.django_db(transaction=True)
def test_the_mixin_switches_the_strategy() -> None:
    seen: list[str] = []

    class OnDb(IdempotencyTestMixin, TestCase):
        idempotency_strategy = "db"

        def test_strategy(self) -> None:
            seen.append(get_strategy().name)
            assert charge(self).status_code == 201

    result = unittest.TestResult()
    OnDb("test_strategy").run(result)
    assert (result.failures, result.errors, seen) == ([], [], ["db"])


def test_isolated_store_gives_each_block_a_prefix_and_clears_it(
    redis_strategy: str, raw_redis: redis.Redis
) -> None:
    with isolated_store() as first:
        assert get_store().prefix == redis_strategy + first and first.startswith("-test-")
        get_store().put_completed("s", "k", "fp", _response(), 60_000)
        assert len(raw_redis.keys(f"{redis_strategy}{first}:*")) == 1
    with isolated_store() as second:
        assert second != first and get_store().get("s", "k") is None
    assert get_store().prefix == redis_strategy == conf.REDIS_KEY_PREFIX
    assert raw_redis.keys(f"*{first}:*") == []


def test_a_test_that_overrides_the_settings_stays_isolated(
    redis_strategy: str, raw_redis: redis.Redis
) -> None:
    """override_settings inside the block (on a test method, pytest-django's settings
    fixture) replaces IDEMPOTENCY, prefix and all: the suffix stays, and so does the
    clean-up, under the prefix the block switched to."""
    with isolated_store() as suffix:
        other = {"STRATEGY": "redis", "REDIS_URL": services.REDIS_URL, "REDIS_KEY_PREFIX": "x"}
        with override_settings(IDEMPOTENCY={**other, "REDIS_KEY_PREFIX": redis_strategy + "-o"}):
            assert get_store().prefix == f"{redis_strategy}-o{suffix}"
            get_store().put_completed("s", "k", "fp", _response(), 60_000)
            assert raw_redis.keys(f"{redis_strategy}-o{suffix}:*") != []
    assert raw_redis.keys(f"*{suffix}:*") == []


def test_isolated_blocks_nest(redis_strategy: str) -> None:
    with isolated_store() as outer:
        with isolated_store() as inner:
            assert get_store().prefix == redis_strategy + inner
        assert get_store().prefix == redis_strategy + outer
    assert get_store().prefix == redis_strategy


def test_clear_store_escapes_the_pattern_and_refuses_an_empty_prefix(
    redis_strategy: str, raw_redis: redis.Redis
) -> None:
    """A prefix with glob characters deletes its own keys, not the ones it would match."""
    odd = f"{redis_strategy}-a*"
    raw_redis.set(f"{odd}:1", b"mine")
    raw_redis.set(f"{redis_strategy}-ab:1", b"not mine")
    assert clear_store(odd) == 1
    assert raw_redis.get(f"{redis_strategy}-ab:1") == b"not mine"
    delete_prefix(services.REDIS_URL, f"{redis_strategy}-ab")
    with pytest.raises(ValueError, match="needs a key prefix"):
        clear_store("")


def test_isolated_store_without_a_reachable_redis_still_runs_the_block() -> None:
    value = {"STRATEGY": "db", "REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_SOCKET_TIMEOUT": 0.2}
    with override_settings(IDEMPOTENCY=value), isolated_store() as suffix:
        assert suffix.startswith("-test-")
    reset_clients()


def test_a_block_that_never_reached_the_store_deletes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No SCAN for a test that sent no keyed request (most of a project's tests): here
    the Redis cannot be reached, and only the block that made a store tries to delete."""
    value = {"STRATEGY": "redis", "REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_SOCKET_TIMEOUT": 0.2}
    with override_settings(IDEMPOTENCY=value):
        with isolated_store():
            pass
        assert "could not delete" not in caplog.text
        with isolated_store():
            get_store()
    reset_clients()
    assert "could not delete the Redis keys of -test-" in caplog.text


def test_use_strategy_keeps_the_other_settings(redis_strategy: str) -> None:
    with use_strategy("db", TTL=60):
        assert (get_strategy().name, conf.TTL, conf.REDIS_KEY_PREFIX) == ("db", 60, redis_strategy)
    assert get_strategy().name == "redis"


@pytest.mark.django_db
@pytest.mark.usefixtures("redis_strategy")
def test_the_store_fixture_isolates_the_test(idempotency_store: str) -> None:
    assert idempotency_store.startswith("-test-")
    assert charge(None).status_code == 201
    assert get_store().prefix == conf.REDIS_KEY_PREFIX + idempotency_store


@pytest.mark.django_db
@pytest.mark.usefixtures("redis_strategy", "idempotency_db_strategy")
def test_the_db_strategy_fixture() -> None:
    assert get_strategy().name == "db"
    assert charge(None).status_code == 201


def _response() -> Any:
    from django_idempotency.protocol.replay import StoredResponse

    return StoredResponse(status=201, body=b"{}")


# Two pytest-django tests in a row, the same key and the same user pk: the second would be a
# replay of the first (its charge never created) without the idempotency_store fixture.


@pytest.fixture(scope="module")
def module_prefix() -> Iterator[str]:
    """One base prefix for the pair below (a fresh one per test would isolate them)."""
    prefix = f"idemtest-{uuid.uuid4().hex[:12]}"
    yield prefix
    delete_prefix(services.REDIS_URL, prefix)


@pytest.fixture
def shared_redis_strategy(module_prefix: str) -> Iterator[str]:
    value = {
        "STRATEGY": "redis",
        "REDIS_URL": services.REDIS_URL,
        "REDIS_KEY_PREFIX": module_prefix,
    }
    with override_settings(IDEMPOTENCY=value):
        yield module_prefix
    reset_clients()


def _charge_is_created() -> None:
    response = charge(None)
    assert response.status_code == 201, response.content
    assert not replayed(response), "an earlier test's response was replayed"
    assert Charge.objects.filter(user_id=USER_PK).count() == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("shared_redis_strategy", "idempotency_store")
def test_the_fixture_first_of_two() -> None:
    _charge_is_created()


@pytest.mark.django_db
@pytest.mark.usefixtures("shared_redis_strategy", "idempotency_store")
def test_the_fixture_second_of_two() -> None:
    _charge_is_created()


@pytest.mark.redis_cluster
def test_isolated_store_on_a_cluster_deletes_its_keys_on_every_node(
    redis_cluster: Any, redis_settings: Any
) -> None:
    """Keys in many slots (one DEL per key there), on a private Redis Cluster."""
    from redis.cluster import RedisCluster

    redis_settings(redis_cluster.url, REDIS_CLUSTER=True)
    with isolated_store() as suffix:
        store = get_store()
        for n in range(40):
            store.put_completed("s", f"k{n}", "fp", _response(), 60_000)
        base = store.prefix
        client = RedisCluster.from_url(redis_cluster.url, socket_timeout=2)
        assert len(list(client.scan_iter(match=f"*{suffix}:*"))) == 40
    try:
        client.set(f"{conf.REDIS_KEY_PREFIX}:{{kept}}:rec", b"x")
        assert list(client.scan_iter(match=f"*{suffix}:*")) == []
        assert base.endswith(suffix)
        assert client.get(f"{conf.REDIS_KEY_PREFIX}:{{kept}}:rec") == b"x"
    finally:
        client.close()


# -- django_idempotency.testing.testcases: under manage.py test, the TestCase's transaction ---


@pytest.fixture
def per_transaction(redis_strategy: str) -> Iterator[str]:
    """The store's prefix follows the test's transaction, as under ``manage.py test``."""
    from django_idempotency.strategies.redis import store

    store.isolate_by(testcases.current_suffix)
    yield redis_strategy
    store.isolate_by(None)


@pytest.mark.django_db
def test_a_testcase_transaction_has_a_suffix_of_its_own(
    per_transaction: str, raw_redis: redis.Redis
) -> None:
    """pytest-django's ``db`` runs the test in a TestCase's transaction, as manage.py test."""
    suffix = testcases.current_suffix()
    assert suffix.startswith("-test-") and suffix.endswith(f"-{testcases.RUN}")
    assert get_store().prefix == per_transaction + suffix
    with transaction.atomic():  # a block of the view's or the test's own: the same
        assert testcases.current_suffix() == suffix
    with isolated_store() as explicit:  # the mixin, the fixture: they win
        assert get_store().prefix == per_transaction + explicit
    assert charge(None).status_code == 201
    assert raw_redis.keys(f"{per_transaction}{suffix}:*") != []
    testcases.delete_records()  # at the end of the run
    assert raw_redis.keys(f"*-{testcases.RUN}:*") == []


@pytest.mark.django_db
def test_test_isolation_off_follows_no_transaction(per_transaction: str) -> None:
    with override_settings(IDEMPOTENCY={**conf.user_settings, "TEST_ISOLATION": False}):
        assert testcases.current_suffix() == ""
        assert get_store().prefix == per_transaction


@pytest.mark.django_db(transaction=True)
def test_outside_a_testcase_transaction_there_is_no_suffix(per_transaction: str) -> None:
    assert testcases.current_suffix() == ""
    assert get_store().prefix == per_transaction


def test_pytest_is_not_the_test_command() -> None:
    """Here the plugin isolates; manage.py test's is tested in a project's own run
    (tests/system/test_user_test_suites.py)."""
    assert testcases.running_tests() is False


def test_records_of_the_run_that_cannot_be_deleted_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    value = {"STRATEGY": "redis", "REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_SOCKET_TIMEOUT": 0.2}
    with override_settings(IDEMPOTENCY=value):
        testcases.delete_records()
    reset_clients()
    assert "could not delete the Redis keys of the test run" in caplog.text
