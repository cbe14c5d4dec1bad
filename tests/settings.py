"""Test settings: PostgreSQL when it answers (required when CI is set), else SQLite.

A second alias, ``sqlite``, is always present so that the SQL that must work on
both backends is tested on both in one run. A third, ``keys``, is a second database of the
same server (PostgreSQL, or SQLite without it) for the tests of keys kept apart from the
views' data (tests/protocol/test_writeguard.py). ``mariadb`` is MariaDB when it answers (and
always with CI set), for the tests marked ``mariadb``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from example_project.settings import database_from_url

from .support.services import REDIS_URL, mariadb_url, postgres_url

SECRET_KEY = "tests-secret-key"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_idempotency",
    "example_project.payments",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.testapp.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_sqlite_dir = Path(tempfile.gettempdir()) / f"django-idempotency-tests-{os.getpid()}"
_sqlite_dir.mkdir(exist_ok=True)


def _sqlite(name: str) -> dict[str, object]:
    db = database_from_url(f"sqlite:///{_sqlite_dir / (name + '.sqlite3')}")
    # A file, not :memory:, so that threads and the lease keeper use real connections.
    db["TEST"] = {"NAME": str(_sqlite_dir / f"test_{name}.sqlite3")}
    return db


_pg = postgres_url()
DATABASES = {
    "default": database_from_url(_pg) if _pg else _sqlite("default"),
    "sqlite": _sqlite("other"),
    "keys": database_from_url(_pg) if _pg else _sqlite("keys"),
}
if _pg:
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # One test database per run, so that parallel runs on one server do not collide.
    DATABASES["default"]["TEST"] = {"NAME": f"test_idempotency_{os.getpid()}"}
    # Another database on the same server, not a second name for the first one.
    DATABASES["keys"]["CONN_MAX_AGE"] = 0
    DATABASES["keys"]["TEST"] = {"NAME": f"test_idempotency_keys_{os.getpid()}"}
    # A subprocess of a test run (a Celery worker) connects to the run's test database.
    if os.environ.get("TEST_DATABASE_NAME"):
        DATABASES["default"]["NAME"] = os.environ["TEST_DATABASE_NAME"]

# MariaDB (``mariadb``), for the tests marked ``mariadb``: present when the server answers,
# and always when CI is set. Its test database is named per process, as the others are.
_maria = mariadb_url()
if _maria:
    DATABASES["mariadb"] = database_from_url(_maria)
    DATABASES["mariadb"]["CONN_MAX_AGE"] = 0
    DATABASES["mariadb"]["TEST"] = {
        "NAME": f"test_idempotency_maria_{os.getpid()}",
        "CHARSET": "utf8mb4",
        # Created on its own: a test may ask for this database alone.
        "DEPENDENCIES": [],
    }

# Celery, for the tasks and the hybrid strategy's drain: the shared Redis (DB 15) with a
# queue of this run's own, which its worker subprocesses are given through the environment.
CELERY_BROKER_URL = os.environ.get("TEST_CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("TEST_CELERY_QUEUE") or f"idem-tests-{os.getpid()}"
CELERY_TASK_IGNORE_RESULT = True
# A worker of the idempotent tasks' tests keeps results (the test reads them back), and
# takes back a killed worker's unacknowledged message after TEST_CELERY_VISIBILITY_TIMEOUT.
CELERY_RESULT_BACKEND = os.environ.get("TEST_CELERY_RESULT_BACKEND") or None
if os.environ.get("TEST_CELERY_VISIBILITY_TIMEOUT"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": float(os.environ["TEST_CELERY_VISIBILITY_TIMEOUT"]),
        "unacked_restore_interval": 1,
    }
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# No remote-control mailbox: a worker killed with SIGKILL would leave its binding behind.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

PSP_DELAY_MS = 0
# The fake provider's ledger and call log, for the crash tests' worker processes.
PSP_LEDGER = os.environ.get("PSP_LEDGER", "")
PSP_CALL_LOG = os.environ.get("PSP_CALL_LOG", "")
EXAMPLE_BASELINE_ROUTES = True
IDEMPOTENCY: dict[str, object] = {}
if os.environ.get("TEST_IDEMPOTENCY_LOCK_TIMEOUT"):  # a crash test's worker processes
    IDEMPOTENCY["LOCK_TIMEOUT"] = float(os.environ["TEST_IDEMPOTENCY_LOCK_TIMEOUT"])
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
