from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The shared assertions and request helpers report like assertions in the tests themselves.
pytest.register_assert_rewrite(
    "tests.support.api",
    "tests.support.assertions",
    "tests.support.example",
    "tests.support.threads",
)

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from .support import services  # noqa: E402
from .support.api import api_client  # noqa: E402
from .support.factories import UserFactory  # noqa: E402
from .support.faketime import faketime_library  # noqa: E402
from .support.gates import Gate  # noqa: E402
from .support.gates import gate as the_gate  # noqa: E402
from .support.pgbouncer import pgbouncer_binary  # noqa: E402
from .support.workers import delete_queue  # noqa: E402

pytest_plugins = [
    "tests.support.redis_fixtures",
    "tests.support.task_workers",
    "django_idempotency.testing.plugin",
]

_CHECKS: dict[str, Callable[[], bool]] = {
    "postgres": lambda: connections["default"].vendor == "postgresql",
    "redis": lambda: services.answers(services.REDIS_URL, 6379),
    "celery": lambda: services.answers(services.REDIS_URL, 6379),
    "redis_cluster": lambda: services.which("redis-server") is not None,
    "sentinel": lambda: services.which("redis-server") is not None,
    "redis_tls": lambda: services.redis_server_has_tls() and services.which("openssl") is not None,
    "browser": lambda: services.chromium() is not None,
    "pgbouncer": lambda: pgbouncer_binary() is not None,
    "faketime": lambda: faketime_library() is not None,
    "gettext": lambda: all(services.which(tool) for tool in ("msgfmt", "xgettext", "msgmerge")),
    "mariadb": lambda: (
        "mariadb" in settings.DATABASES and services.answers(services.MARIADB_URL, 3306)
    ),
}
_results: dict[str, bool] = {}
#: The whole-system suites (CONTRIBUTING.md, "Where the tests live"), marked ``system``.
SYSTEM = Path(__file__).resolve().parent / "system"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of tests/system/ ``system``, so that ``-m "not system"`` runs the rest."""
    for item in items:
        if item.path.resolve().is_relative_to(SYSTEM):
            item.add_marker(pytest.mark.system)


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


@pytest.fixture(scope="session", autouse=True)
def _scratch_templates() -> Iterator[None]:
    """The databases the example project's scratch databases are copied from
    (``tests/support/example.py``) go when the session ends."""
    yield
    from .support.example import drop_templates

    drop_templates()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` with the longest modules first (``tests/support/scheduling.py``)."""
    if config.getoption("dist") != "loadscope":
        return None
    from .support.scheduling import LongestFirst

    return LongestFirst(config, log)


@pytest.fixture
def idempotency_isolation() -> bool:
    """The plugin's automatic isolation is off here: the tests choose their own prefixes
    (and tests/test_testing.py and tests/system/test_user_test_suites.py test it)."""
    return False


@pytest.fixture
def gate() -> Iterator[Gate]:
    """The gate the test views wait at (tests/support/gates.py), reset; opened at the end,
    so that a failed test never leaves a view waiting."""
    the_gate.reset()
    yield the_gate
    the_gate.opened.set()


@pytest.fixture(params=["default", "sqlite"])
def alias(request: pytest.FixtureRequest) -> str:
    """Each database alias in turn: PostgreSQL (or SQLite without it) and SQLite."""
    return str(request.param)


@pytest.fixture
def api(db: None) -> APIClient:
    """An ``APIClient`` authenticated as a new user (``UserFactory``)."""
    return api_client(UserFactory())


@pytest.fixture(scope="module")
def forget_queued_drains() -> Iterator[None]:
    """Hybrid commits in this process queue drain tasks on the run's own default queue
    (``tests/settings.py``); after the module, drop what no worker took."""
    yield
    queue = str(getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", ""))
    if queue.startswith("idem-tests-"):
        delete_queue(queue)


@pytest.fixture(autouse=True)
def _forget_pending_redis_work() -> None:
    """Each test starts as a new process would: with no deletions or confirmations pending
    for Redis and no keys suspected (``strategies/redis/discards.py``, ``suspects.py``).
    An earlier test's pending deletion, against a Redis of its own, would otherwise be sent
    before this test's first claim, on the connection the test prepared for that claim
    (``test_faults.py``, seed 2307552980: that deletion's reply was lost, its connection
    closed, and the claim went out on a new one whose handshake was lost too)."""
    from django_idempotency.strategies.redis.discards import discards
    from django_idempotency.strategies.redis.suspects import suspects

    discards.forget()
    suspects.forget()


@pytest.fixture(autouse=True)
def _stop_wait_listeners() -> Iterator[None]:
    """A WAIT listener (started by any request whose view waits) holds a connection of its
    own to the test database: stop it after each test, so that it neither leaks into the
    next test (which may count the database's connections) nor keeps pytest-django from
    dropping the database."""
    yield
    from django_idempotency.strategies import waiting

    waiting.reset_listeners()
