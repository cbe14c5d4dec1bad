"""pytest fixtures for a project's tests (pytest-django): ``pytest_plugins =
["django_idempotency.testing.plugin"]`` in the top-level ``conftest.py``.

* ``idempotency_store``: the test's Redis records apart from every other test's (their
  prefix gets a suffix of the test's own), deleted after it
  (:func:`django_idempotency.testing.isolated_store`); yields the suffix.
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
    """What follows ``REDIS_KEY_PREFIX`` in this test's keys; they are deleted after it."""
    with isolated_store() as suffix:
        yield suffix


@pytest.fixture
def idempotency_db_strategy() -> Iterator[None]:
    """The test runs under the ``db`` strategy: records in the test's database only."""
    with use_strategy("db"):
        yield
