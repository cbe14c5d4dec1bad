"""The docs' examples run as in a project's own suite: with the pytest
plugin's automatic isolation (tests/conftest.py turns it off for the rest of
the suite)."""

import pytest

from django_idempotency.testing import plugin


@pytest.fixture
def idempotency_isolation(request: pytest.FixtureRequest) -> bool:
    return plugin.isolation_wanted(request.node)
