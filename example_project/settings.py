"""Settings of the example payments API, configured from the environment.

DATABASE_URL              sqlite:///path/to/db.sqlite3 (default: db.sqlite3 here) or
                          postgres://user:password@host:port/name
IDEMPOTENCY_STRATEGY      db (default), advisory_lock, redis, hybrid
IDEMPOTENCY_LOCK_TIMEOUT  seconds before an in-progress lease counts as abandoned (default 60)
IDEMPOTENCY_WAIT          seconds a duplicate waits for the first request's answer (default 0)
IDEMPOTENCY_WAIT_MAX_WAITERS  duplicates that may wait at once in one process (default 16)
IDEMPOTENCY_COMPLETER_AFTER  seconds past a lapsed lease before the completer finishes a
                          request of the stepped charge (default 60)
PSP_DELAY_MS              how long the fake payment provider takes (default 0)
PSP_FAIL_MARKER           a file path: while it exists, the next payment call fails once (tests)
PSP_CALL_LOG              a file path: each payment call appends its process id (tests)
PSP_HOLD_MARKER           a file path: while it exists, payment calls do not answer (tests)
EXAMPLE_BASELINE_ROUTES   1 adds /baseline/ routes (benchmarks and the naive race control)
EXAMPLE_MIDDLEWARE        1 installs IdempotencyMiddleware (after an API-token middleware)
DATABASE_CONN_MAX_AGE     seconds a PostgreSQL connection is kept (default 600; 0 under ASGI,
                          where every request runs its database work in a thread of its own)
IDEMPOTENCY_REDIS_PREFIX  the Redis key prefix of the redis and hybrid strategies (default idem)
IDEMPOTENCY_REDIS_SOCKET_TIMEOUT  seconds a Redis reply is waited for (the library's default)
CELERY_BROKER_URL         the Celery broker (default: REDIS_URL, else redis://127.0.0.1:6379/0)
CELERY_TASK_DEFAULT_QUEUE the Celery queue the outbox drain is sent to (default celery)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent


def env_flag(name: str, default: bool = False) -> bool:
    return os.environ.get(name, "1" if default else "0").lower() in {"1", "true", "yes", "on"}


def database_from_url(url: str) -> dict[str, Any]:
    """Parse sqlite:///path, postgres://user:pass@host:port/name and
    mysql://user:pass@host:port/name (or mariadb://: Django's MySQL backend, mysqlclient)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if parts.netloc:  # sqlite://relative/path
            path = parts.netloc + path
        elif path.startswith("/") and not path.startswith("//"):
            path = path[1:] if not Path(path).is_absolute() else path
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path or str(BASE_DIR / "db.sqlite3"),
            "OPTIONS": {
                # SQLite's default (deferred) transactions: a view holds the write lock only
                # from its first write, not while it waits for the payment provider. A view
                # that reads before it writes can lose that race to a concurrent commit; the
                # app answers that with a 503 transient-conflict and releases the key.
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")) or "postgres",
            "USER": unquote(parts.username or "postgres"),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "127.0.0.1",
            "PORT": str(parts.port or 5432),
            # Persistent connections, as a production deployment would use.
            "CONN_MAX_AGE": int(os.environ.get("DATABASE_CONN_MAX_AGE", "600")),
            "CONN_HEALTH_CHECKS": True,
            # A server that hangs while a connection opens costs a request 5 s, not
            # psycopg's 130 (DATABASE_TIMEOUT bounds statements only; check --deploy: W016).
            "OPTIONS": {"connect_timeout": 5},
        }
    if parts.scheme in {"mysql", "mariadb"}:
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": unquote(parts.path.lstrip("/")) or "idempotency",
            "USER": unquote(parts.username or "root"),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "127.0.0.1",
            "PORT": str(parts.port or 3306),
            "CONN_MAX_AGE": int(os.environ.get("DATABASE_CONN_MAX_AGE", "600")),
            "CONN_HEALTH_CHECKS": True,
            # Django's default isolation on MySQL and MariaDB (READ COMMITTED), said out
            # loud: the db strategy requires it (check E033).
            "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
        }
    raise ValueError(f"unsupported DATABASE_URL scheme: {parts.scheme!r}")


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-insecure-secret-key-change-me")
DEBUG = env_flag("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = os.environ.get(
    "DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver"
).split(",")

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
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

if env_flag("EXAMPLE_MIDDLEWARE"):
    MIDDLEWARE += [
        "example_project.payments.async_views.token_auth_middleware",
        "django_idempotency.middleware.IdempotencyMiddleware",
    ]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DATABASES = {
    "default": database_from_url(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

IDEMPOTENCY = {
    "STRATEGY": os.environ.get("IDEMPOTENCY_STRATEGY", "db"),
    "LOCK_TIMEOUT": float(os.environ.get("IDEMPOTENCY_LOCK_TIMEOUT", "60")),
    "WAIT": float(os.environ.get("IDEMPOTENCY_WAIT", "0")),
}
if os.environ.get("IDEMPOTENCY_COMPLETER_AFTER"):
    IDEMPOTENCY["COMPLETER_AFTER"] = float(os.environ["IDEMPOTENCY_COMPLETER_AFTER"])
if os.environ.get("IDEMPOTENCY_TTL"):
    IDEMPOTENCY["TTL"] = float(os.environ["IDEMPOTENCY_TTL"])
if os.environ.get("REDIS_CLUSTER_URL"):
    IDEMPOTENCY.update(REDIS_URL=os.environ["REDIS_CLUSTER_URL"], REDIS_CLUSTER=True)
elif os.environ.get("REDIS_URL"):
    IDEMPOTENCY.update(REDIS_URL=os.environ["REDIS_URL"])

if os.environ.get("IDEMPOTENCY_WAIT_MAX_WAITERS"):
    IDEMPOTENCY["WAIT_MAX_WAITERS"] = int(os.environ["IDEMPOTENCY_WAIT_MAX_WAITERS"])

if os.environ.get("IDEMPOTENCY_REDIS_PREFIX"):
    IDEMPOTENCY["REDIS_KEY_PREFIX"] = os.environ["IDEMPOTENCY_REDIS_PREFIX"]
if os.environ.get("IDEMPOTENCY_REDIS_SOCKET_TIMEOUT"):
    IDEMPOTENCY["REDIS_SOCKET_TIMEOUT"] = float(os.environ["IDEMPOTENCY_REDIS_SOCKET_TIMEOUT"])

# Time partitions of the key table (PostgreSQL; docs/operations.md): seconds per partition.
if os.environ.get("IDEMPOTENCY_PARTITION_INTERVAL"):
    IDEMPOTENCY["PARTITION_INTERVAL"] = int(os.environ["IDEMPOTENCY_PARTITION_INTERVAL"])

# Celery (example_project/celery.py): the hybrid strategy's outbox drain and the key purge.
CELERY_BROKER_URL = (
    os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
)
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
try:
    from django_idempotency.tasks import beat_schedule
except ImportError:  # celery is not installed
    CELERY_BEAT_SCHEDULE: dict[str, Any] = {}
else:
    CELERY_BEAT_SCHEDULE = beat_schedule(drain_every=10, purge_every=3600)

PSP_DELAY_MS = int(os.environ.get("PSP_DELAY_MS", "0"))
PSP_FAIL_MARKER = os.environ.get("PSP_FAIL_MARKER", "")
PSP_CALL_LOG = os.environ.get("PSP_CALL_LOG", "")
PSP_HOLD_MARKER = os.environ.get("PSP_HOLD_MARKER", "")
PSP_LEDGER = os.environ.get("PSP_LEDGER", "")
EXAMPLE_BASELINE_ROUTES = env_flag("EXAMPLE_BASELINE_ROUTES")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_idempotency": {
            "handlers": ["console"],
            "level": os.environ.get("IDEMPOTENCY_LOG_LEVEL", "WARNING"),
        }
    },
}
