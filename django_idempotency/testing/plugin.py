"""The pytest plugin: pytest loads it by itself once the package is installed (the
``pytest11`` entry point ``django_idempotency.testing.plugin``), and every test's Redis
records live under a prefix of the test's own, deleted after it
(:func:`django_idempotency.testing.isolated_store`), with nothing to opt into.

* ``@pytest.mark.idempotency_shared_store``: this test shares the configured prefix, as
  production does (so does every test with ``IDEMPOTENCY["TEST_ISOLATION"] = False``, or
  a ``conftest.py`` whose ``idempotency_isolation`` fixture returns False);
  ``-p no:django_idempotency.testing.plugin`` unloads the plugin.
* ``idempotency_isolated``: the suffix of the test's records, None where it shares the
  prefix; ``idempotency_store``: the suffix, isolating the test even where the automatic
  isolation is off.
* ``idempotency_db_strategy``: the test runs under the ``db`` strategy
  (:func:`django_idempotency.testing.use_strategy`), its records in the test database.

Nothing here imports Django's test machinery before a test runs: pytest loads the plugin
in every project of the environment, Django or not.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

MARKER = "idempotency_shared_store"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: the test's Redis records share the configured prefix "
        "(django-idempotency isolates each test's otherwise)",
    )


def _django_is_configured() -> bool:
    from django.apps import apps
    from django.conf import settings

    return settings.configured and apps.ready


def isolation_wanted(item: pytest.Item) -> bool:
    """Whether ``item``'s Redis records get a prefix of their own: in a Django project
    with redis-py installed, unless the test is marked ``idempotency_shared_store`` or
    ``IDEMPOTENCY["TEST_ISOLATION"]`` is False."""
    if item.get_closest_marker(MARKER) is not None:
        return False
    if importlib.util.find_spec("redis") is None or not _django_is_configured():
        return False
    from ..conf import conf

    return conf.TEST_ISOLATION


@pytest.fixture
def idempotency_isolation(request: pytest.FixtureRequest) -> bool:
    """:func:`isolation_wanted` for the test; override it in a ``conftest.py`` to decide
    otherwise for the tests below it."""
    return isolation_wanted(request.node)


@pytest.fixture(autouse=True)
def idempotency_isolated(idempotency_isolation: bool) -> Iterator[str | None]:
    """Every test: its records apart from every other test's (their suffix), or None."""
    if not idempotency_isolation:
        yield None
        return
    from . import isolated_store

    with isolated_store() as suffix:
        yield suffix


@pytest.fixture
def idempotency_store(idempotency_isolated: str | None) -> Iterator[str]:
    """What follows ``REDIS_KEY_PREFIX`` in this test's keys; they are deleted after it."""
    if idempotency_isolated is not None:
        yield idempotency_isolated
        return
    from . import isolated_store

    with isolated_store() as suffix:
        yield suffix


@pytest.fixture
def idempotency_db_strategy() -> Iterator[None]:
    """The test runs under the ``db`` strategy: records in the test's database only."""
    from . import use_strategy

    with use_strategy("db"):
        yield
