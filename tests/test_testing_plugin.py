"""django_idempotency.testing.plugin, in this process: the automatic isolation around each
test, its marker and its setting. (tests/conftest.py turns the isolation off for the rest of
the suite; tests/system/test_user_test_suites.py runs it in projects' own suites.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_idempotency.conf import conf
from django_idempotency.strategies.redis.store import get_store, reset_clients
from django_idempotency.testing import plugin

from .support import services

pytestmark = pytest.mark.redis


@pytest.fixture
def idempotency_isolation(request: pytest.FixtureRequest) -> bool:
    """The plugin's own decision, as in a project without an override of its own."""
    return plugin.isolation_wanted(request.node)


@pytest.fixture(scope="module", autouse=True)
def redis_project() -> Iterator[None]:
    """The project's settings name the redis strategy (before any test's fixture runs)."""
    value = {"STRATEGY": "redis", "REDIS_URL": services.REDIS_URL, "REDIS_KEY_PREFIX": "plg"}
    with override_settings(IDEMPOTENCY=value):
        yield
    reset_clients()


def test_each_test_gets_a_suffix_of_its_own(idempotency_isolated: Any) -> None:
    assert idempotency_isolated.startswith("-test-")
    assert get_store().prefix == "plg" + idempotency_isolated


def test_the_store_fixture_is_that_suffix(
    idempotency_isolated: Any, idempotency_store: str
) -> None:
    assert idempotency_store == idempotency_isolated


@pytest.mark.idempotency_shared_store
def test_a_marked_test_shares_the_prefix(idempotency_isolated: Any) -> None:
    assert idempotency_isolated is None
    assert get_store().prefix == "plg"


@pytest.mark.idempotency_shared_store
def test_a_marked_test_may_still_ask_for_a_store_of_its_own(idempotency_store: str) -> None:
    assert get_store().prefix == "plg" + idempotency_store


@pytest.fixture
def isolation_off() -> Iterator[None]:
    with override_settings(IDEMPOTENCY={**conf.user_settings, "TEST_ISOLATION": False}):
        yield


def test_test_isolation_off_shares_the_prefix(
    request: pytest.FixtureRequest, isolation_off: None
) -> None:
    assert plugin.isolation_wanted(request.node) is False
