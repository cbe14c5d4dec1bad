"""Settings of the control project, from the environment.

BENCH_DATABASE_URL  postgres://user:password@host:port/name (default: the local ``postgres``)
BENCH_REDIS_URL     the Redis of the redis and hybrid routes (default redis://127.0.0.1:6379/14)
BENCH_REDIS_PREFIX  their key prefix (default idem-bench)

The harness (benchmarks/harness/control.py) sets all three: a scratch database, a private
``redis-server``, a prefix of the run's own.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

_db = urlsplit(os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")

SECRET_KEY = "control-project-insecure-secret-key"
DEBUG = False
ALLOWED_HOSTS = ["*"]

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
    "benchmarks.control.orders",
]

# As ``django-admin startproject`` writes it.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "benchmarks.control.urls"
WSGI_APPLICATION = "benchmarks.control.wsgi.application"
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

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_db.path.lstrip("/")) or "postgres",
        "USER": unquote(_db.username or "postgres"),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "127.0.0.1",
        "PORT": str(_db.port or 5432),
        "CONN_MAX_AGE": 600,
        "CONN_HEALTH_CHECKS": True,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.TokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

IDEMPOTENCY = {
    "REDIS_URL": REDIS_URL,
    "REDIS_KEY_PREFIX": os.environ.get("BENCH_REDIS_PREFIX", "idem-bench"),
}

# Where a Celery app would send the hybrid route's outbox drains; none is loaded (the
# project's celery.py is for running a worker by hand), so no drain is queued.
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True

LOGGING = {"version": 1, "disable_existing_loggers": False}
