"""pytest fixtures for a project's tests (pytest-django): ``pytest_plugins =
["django_idempotency.testing.plugin"]`` in the top-level ``conftest.py``.

* ``idempotency_store``: the test's Redis records under a prefix of its own, deleted
  after it (:func:`django_idempotency.testing.isolated_store`); yields the prefix.
  Make it autouse in a ``conftest.py`` of your own to cover every test.
* ``idempotency_db_strategy``: the test runs under the ``db`` strategy
  (:func:`django_idempotency.testing.use_strategy`), its records in the test database.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import isolated_store, use_strategy


@pytest.fixture
def idempotency_store() -> Iterator[str]:
    """This test's Redis key prefix; the keys under it are deleted after the test."""
    with isolated_store() as prefix:
        yield prefix


@pytest.fixture
def idempotency_db_strategy() -> Iterator[None]:
    """The test runs under the ``db`` strategy: records in the test's database only."""
    with use_strategy("db"):
        yield
