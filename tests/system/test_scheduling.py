"""The order in which the suite's workers take their work (``tests/support/scheduling.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..support.scheduling import SECONDS, SPREAD, LongestFirst, _LongestFirstQueue

ROOT = Path(__file__).resolve().parents[2]

#: A fixture wider than a test's but the session's, or state a module keeps between tests.
WIDER = re.compile(r"scope=[\"'](module|class|package)[\"']|^\s*global |^class Test", re.M)


def test_the_longest_module_left_is_given_out_first() -> None:
    queue = _LongestFirstQueue()
    for scope in (
        "tests/test_conf.py",
        "tests/system/test_race.py::test_one",
        "tests/test_models.py",
        "tests/system/test_faults.py::test_a[db]",
        "tests/system/test_faults.py::test_a[redis]",
    ):
        queue[scope] = {scope: False}
    order = [queue.popitem(last=False)[0] for _ in range(len(queue))]
    assert order == [
        "tests/system/test_faults.py::test_a[db]",
        "tests/system/test_faults.py::test_a[redis]",
        "tests/system/test_race.py::test_one",
        "tests/test_conf.py",
        "tests/test_models.py",
    ]
    with pytest.raises(KeyError):
        queue.popitem(last=False)


def test_the_spread_modules_are_given_out_test_by_test() -> None:
    scheduler = LongestFirst.__new__(LongestFirst)  # _split_scope reads no state
    test = "tests/system/test_faults.py::test_api_exception[db-postgres-plain]"
    assert scheduler._split_scope(test) == test
    assert scheduler._split_scope("tests/test_conf.py::test_defaults") == "tests/test_conf.py"
    assert (
        scheduler._split_scope("tests/strategies/test_advisory.py::TestLock::test_held")
        == "tests/strategies/test_advisory.py::TestLock"
    )


def test_every_module_named_exists() -> None:
    missing = sorted(path for path in {*SECONDS, *SPREAD} if not (ROOT / path).is_file())
    assert not missing, f"renamed or removed: {missing}"
    assert SECONDS.keys() >= SPREAD


@pytest.mark.parametrize("path", sorted(SPREAD))
def test_a_spread_module_keeps_nothing_between_its_tests(path: str) -> None:
    """Its tests run in whichever worker is free, in any order: a fixture of the module's
    would be set up again in each worker, and state kept in the module would be seen by
    some of its tests and not others."""
    found = WIDER.findall((ROOT / path).read_text(encoding="utf-8"))
    assert not found, f"{path}: {found}"
