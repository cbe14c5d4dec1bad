"""The order in which the suite's workers take their work (``--dist loadscope``).

pytest-xdist's ``loadscope`` hands out a module at a time (a test class at a time where
there are classes), the modules with the most tests first. The longest modules of this suite
have few tests (a gunicorn or a Celery worker killed at seven points is one test) and
came last, so that the run ended with one worker on a long module while the others had
nothing left; and the fault matrix, a module of its own, kept one worker busy for a third of
the run. :class:`LongestFirst` hands out the modules of :data:`SECONDS` first, the longest
first, and the tests of the modules of :data:`SPREAD` one by one, so that every worker takes
part in them; everything else is handed out as ``loadscope`` does. pytest-randomly's order
still holds within a module, and among the modules :data:`SECONDS` leaves out.

Only the order and the size of the portions change: each test still runs whole in one worker,
with its fixtures. The figures are a quiet run's (``CI=true make test
PYTEST_ARGS=--junitxml=junit.xml``, each module's tests' times summed); a module that grows
long belongs here, and a module missing from it is merely handed out later.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from xdist.scheduler import LoadScopeScheduling

#: Seconds each long module took, its tests' times summed, in a quiet run on 2 cores.
SECONDS = {
    "tests/system/test_faults.py": 518,
    "tests/system/test_wait_race.py": 209,
    "tests/test_idempotent_tasks.py": 138,
    "tests/system/test_task_steps_crash.py": 128,
    "tests/system/test_asgi_race.py": 121,
    "tests/system/test_race.py": 96,
    "tests/strategies/test_hybrid.py": 92,
    "tests/protocol/test_writeguard.py": 83,
    "tests/system/test_completer_crash.py": 79,
    "tests/system/test_steps_crash.py": 70,
    "tests/store/test_partitions.py": 61,
    "tests/test_tasks.py": 57,
    "tests/system/test_redis_sentinel.py": 56,
    "tests/protocol/test_negotiation.py": 45,
    "tests/protocol/test_fingerprint_properties.py": 43,
    "tests/system/test_benchmarks.py": 38,
    "tests/protocol/test_shards.py": 37,
    "tests/system/test_docs.py": 35,
    "tests/system/test_hung_database.py": 35,
    "tests/strategies/redis/test_strategy.py": 34,
    "tests/system/test_user_test_suites.py": 32,
    "tests/store/test_outbox.py": 30,
    "tests/system/test_crash_recovery.py": 28,
    "tests/system/test_redis_cluster.py": 27,
    "tests/system/test_skewed_worker.py": 25,
    "tests/system/test_fallback_restart.py": 24,
    "tests/system/test_quickstart.py": 22,
}

#: Modules whose tests are handed out one by one: long ones whose fixtures are all a test's
#: own or the session's (none of the module's or a class's, no state kept between tests).
SPREAD = frozenset(
    {
        "tests/system/test_faults.py",
        "tests/system/test_wait_race.py",
        "tests/test_idempotent_tasks.py",
        "tests/system/test_task_steps_crash.py",
        "tests/system/test_asgi_race.py",
        "tests/system/test_race.py",
        "tests/strategies/test_hybrid.py",
        "tests/protocol/test_writeguard.py",
        "tests/system/test_completer_crash.py",
        "tests/system/test_steps_crash.py",
        "tests/store/test_partitions.py",
        "tests/test_tasks.py",
    }
)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class _LongestFirstQueue(OrderedDict[str, Any]):
    """``loadscope``'s queue of work, ``scope -> {test: done}``, which gives out the scope of
    the longest module left first (the first one queued among equals)."""

    def popitem(self, last: bool = True) -> tuple[str, Any]:
        if not self:
            raise KeyError("the queue is empty")
        scope = max(self, key=lambda scope: SECONDS.get(module_of(scope), 0))
        return scope, self.pop(scope)


class LongestFirst(LoadScopeScheduling):
    """``loadscope`` with the long modules first and :data:`SPREAD`'s tests one by one."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.workqueue: OrderedDict[str, Any] = _LongestFirstQueue()

    def _split_scope(self, nodeid: str) -> str:
        if module_of(nodeid) in SPREAD:
            return nodeid
        return str(super()._split_scope(nodeid))
