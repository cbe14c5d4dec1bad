from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connections

from . import services

pytest_plugins = ["tests.conftest_redis"]

_CHECKS: dict[str, Callable[[], bool]] = {
    "postgres": lambda: connections["default"].vendor == "postgresql",
    "redis": lambda: services.answers(services.REDIS_URL, 6379),
    "celery": lambda: services.answers(services.REDIS_URL, 6379),
    "redis_cluster": lambda: services.which("redis-server") is not None,
    "browser": lambda: services.chromium() is not None,
}
_results: dict[str, bool] = {}


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose service is missing is skipped locally and fails when CI is set."""
    for marker, check in _CHECKS.items():
        if item.get_closest_marker(marker) is None:
            continue
        if marker not in _results:
            _results[marker] = check()
        if _results[marker]:
            continue
        reason = f"{marker} is not available on this machine"
        if services.in_ci():
            pytest.fail(reason + ", and CI is set", pytrace=False)
        pytest.skip(reason + " (with CI set this fails)")
