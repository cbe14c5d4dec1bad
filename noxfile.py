"""The version matrix: a smoke subset of the tests on every supported combination of
Python, Django and Django REST framework but the main one (``make matrix``).

The main combination (Python 3.11, the newest Django the main virtualenv gets, the newest
DRF) runs the whole suite in ``make test``. Every other one runs here, against the same
PostgreSQL, MariaDB and Redis: the claim, the replay, the races on real threads, and the
migrations check. Django 6.0 and 6.1 need Python 3.12 or newer, so 3.11 pairs with Django
5.2 only. Deprecation warnings are errors in these runs. The venvs are reused between
runs (``nox -r``); the packages come from PyPI.

    nox -r                         # every combination
    nox -r -s "smoke-3.12(django='6.0', drf='3.15')"
    nox -l                         # the session names
"""

from __future__ import annotations

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["smoke"]

PYTHONS = ["3.11", "3.12", "3.13"]
DJANGO = {"5.2": "django~=5.2.0", "6.0": "django~=6.0.0", "6.1": "django~=6.1.0"}
# "3.15" is the lower bound of the drf extra in pyproject.toml; "latest" is whatever PyPI has.
DRF = {"3.15": "djangorestframework==3.15.2", "latest": "djangorestframework"}
#: Run by ``make test`` with the whole suite instead.
MAIN = ("3.11", "5.2", "latest")

#: What the smoke tests import, and nothing more (no Celery, no browser).
DEPS = ["psycopg[binary]", "mysqlclient", "redis", "pytest", "pytest-django", "factory-boy"]

#: The claim, the replay, conflicts and mismatches, leases and takeovers, through the
#: managers, the engine, the DRF mixin and the decorator, on PostgreSQL and SQLite (and the
#: managers' statements and the engine's sixteen-request race on MariaDB too); with the
#: races on real threads (sixteen at once on one key: the managers' claim and takeover, and
#: whole requests through the engine).
SMOKE = [
    "tests/store/test_managers.py",
    "tests/protocol/test_engine.py",
    "tests/test_mixins.py",
    "tests/test_decorators.py",
    "tests/test_admin.py",
    "tests/protocol/test_transactions.py",
]


def _combinations() -> list[nox.param]:
    combinations = []
    for python in PYTHONS:
        for django in DJANGO:
            if django != "5.2" and python == "3.11":
                continue  # Django 6.0 and 6.1 require Python >= 3.12
            drfs = ["latest"] if django == "6.1" else DRF  # 3.15.2 does not import on 6.1
            for drf in drfs:
                if (python, django, drf) != MAIN:
                    combinations.append(nox.param(python, django, drf))
    return combinations


@nox.session
@nox.parametrize(("python", "django", "drf"), _combinations())
def smoke(session: nox.Session, django: str, drf: str) -> None:
    session.install("-e", ".", DJANGO[django], DRF[drf], *DEPS)
    session.run(
        "python",
        "-c",
        "import sys, django, rest_framework; print('python', sys.version.split()[0],"
        " '· django', django.__version__, '· djangorestframework', rest_framework.__version__)",
    )
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=-ra --strict-markers",
        # A deprecation (Django 6.1 warns of 2028 removals) is an error: found here first.
        "-W",
        "error::PendingDeprecationWarning",
        "-W",
        "error::DeprecationWarning",
        *SMOKE,
        *session.posargs,
    )
    session.run(
        "python",
        "manage.py",
        "makemigrations",
        "--check",
        "--dry-run",
        # Django 6.1's field checks connect to MariaDB's database, which only the tests create.
        "--skip-checks",
        env={"DJANGO_SETTINGS_MODULE": "tests.settings"},
    )
