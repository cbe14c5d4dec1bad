"""The checks of the strategy against where it keeps its keys: the keys' database
(E005-E008, E033, E034), Redis (E011, E012), waiting (E050, W014), a hung database (W015,
and W016, W017 with ``--deploy``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from ..conf import conf
from ..errors import STRATEGY_HINT, ImproperlyConfiguredStrategy
from . import ID
from .values import _number, _raw


def _check_database_and_strategy() -> list[CheckMessage]:
    """E005: DATABASE is an alias; then the strategy's own checks (:func:`strategy_errors`)."""
    alias = conf.DATABASE
    if alias not in settings.DATABASES:
        return [
            Error(
                f"IDEMPOTENCY['DATABASE'] is {alias!r}, which is not in DATABASES.",
                hint="Name the database alias that holds your views' data.",
                id=ID + "E005",
            )
        ]
    return strategy_errors(conf.STRATEGY)


def strategy_errors(strategy: str) -> list[CheckMessage]:
    """E006: ``strategy`` (the setting's, or a view's) cannot be loaded; E007/E008: it
    does not run on the keys' database; E033/E034: the keys' MySQL or MariaDB connection
    does not read or keep times as the db strategy needs; E011/E012: it needs a Redis
    that is not configured. Every key database (``KEY_DATABASES``) is checked. Reads
    ``connections[alias].vendor``, which does not connect."""
    from ..strategies import load_strategy

    try:
        load_strategy(strategy)
    except ImproperlyConfiguredStrategy as exc:
        return [Error(exc.reason, hint=STRATEGY_HINT, id=ID + "E006")]
    messages: list[CheckMessage] = []
    for alias in conf.KEY_DATABASES:  # each one that is in DATABASES (else E005, E035)
        if alias in settings.DATABASES:
            messages.extend(_database_errors(strategy, alias))
    return messages or _redis_errors(strategy)


def _database_errors(strategy: str, alias: str) -> list[CheckMessage]:
    """E007/E008: ``strategy`` does not run on the key database ``alias``; E033/E034 for
    the db strategy on MySQL or MariaDB."""
    from django.db import connections

    from ..store.sql.statements import features_of, running

    connection = connections[alias]
    vendor, features = connection.vendor, features_of(connection)
    supporting = running(strategy)  # none for a strategy that keeps no keys in SQL
    if not supporting or strategy in features.strategies:
        return _mysql_errors(alias) if strategy == "db" and features.session_from_options else []
    names = " and ".join(dialect.display_name for dialect in supporting)
    if strategy == "advisory_lock":
        return [
            Error(
                f"The advisory_lock strategy needs {names}; database {alias!r} is {vendor}.",
                hint="Use the 'db' strategy on SQLite.",
                id=ID + "E007",
            )
        ]
    return [
        Error(
            f"The {strategy} strategy supports {names}; database {alias!r} is {vendor}.",
            hint=(
                "The db strategy runs on PostgreSQL, SQLite, MariaDB and MySQL."
                if strategy != "db"
                else "It needs an atomic insert-if-absent on the unique (scope, key)."
            ),
            id=ID + "E008",
        )
    ]


def _mysql_errors(alias: str) -> list[CheckMessage]:
    """E033: the keys' MySQL or MariaDB connection reads under READ COMMITTED; E034: it
    keeps datetimes in UTC. Reads the settings only (``timezone_name`` does not connect)."""
    from django.db import connections

    connection = connections[alias]
    options = connection.settings_dict.get("OPTIONS") or {}
    level = options.get("isolation_level", "read committed")
    messages: list[CheckMessage] = []
    if str(level).lower() != "read committed":
        messages.append(
            Error(
                f"The db strategy on MySQL and MariaDB needs READ COMMITTED; database "
                f"{alias!r} sets isolation_level {level!r}.",
                hint=(
                    "Remove OPTIONS['isolation_level'] (Django's default on MySQL is "
                    "'read committed') or set it so: under REPEATABLE READ a claim inside "
                    "a transaction reads its snapshot and misses the request that won the "
                    "key; under READ UNCOMMITTED it could replay a response that never "
                    "committed."
                ),
                id=ID + "E033",
            )
        )
    if connection.timezone_name != "UTC":
        messages.append(
            Error(
                f"The db strategy on MySQL and MariaDB takes the time from the server's "
                f"UTC_TIMESTAMP(); database {alias!r} keeps datetimes in "
                f"{connection.timezone_name}.",
                hint=(
                    "Set USE_TZ = True and leave DATABASES[alias]['TIME_ZONE'] unset (or "
                    "'UTC'): leases and expiry are compared with the database's clock."
                ),
                id=ID + "E034",
            )
        )
    return messages


REDIS_STRATEGIES = {"redis", "hybrid"}


#: Django's own Redis cache backend, accepted for REDIS_CACHE_ALIAS like django-redis.
DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"


def _redis_errors(strategy: str) -> list[CheckMessage]:
    """The redis and hybrid strategies need a Redis to talk to (E011), and a cache
    alias must name a Redis cache, django-redis or Django's own (E012). Nothing here
    connects to Redis."""
    if strategy not in REDIS_STRATEGIES:
        return []
    alias = conf.REDIS_CACHE_ALIAS
    if not alias and not conf.REDIS_URL:
        return [
            Error(
                f"The {strategy} strategy needs IDEMPOTENCY['REDIS_URL'] or "
                "IDEMPOTENCY['REDIS_CACHE_ALIAS'].",
                hint="Set REDIS_URL (e.g. 'redis://127.0.0.1:6379/0', with REDIS_CLUSTER "
                "for a Redis Cluster) or name a Redis cache (django-redis or "
                "django.core.cache.backends.redis.RedisCache) in REDIS_CACHE_ALIAS.",
                id=ID + "E011",
            )
        ]
    if alias:
        backend = str(getattr(settings, "CACHES", {}).get(alias, {}).get("BACKEND", ""))
        if not backend.startswith("django_redis.") and backend != DJANGO_REDIS_CACHE:
            found = f"its BACKEND is {backend!r}" if backend else "it is not in CACHES"
            return [
                Error(
                    f"IDEMPOTENCY['REDIS_CACHE_ALIAS'] is {alias!r}, but {found}.",
                    hint="Name a cache whose BACKEND is 'django_redis.cache.RedisCache' "
                    f"(pip install django-idempotency[django-redis]) or {DJANGO_REDIS_CACHE!r}, "
                    "or set REDIS_URL instead.",
                    id=ID + "E012",
                )
            ]
    return []


def _check_wait_listen_database() -> list[CheckMessage]:
    """WAIT_LISTEN_DATABASE must be None, an alias of a PostgreSQL database in DATABASES,
    or a libpq DSN or URI that parses (E050): a wrong value would leave every waiter
    polling in silence, or LISTEN somewhere no NOTIFY of the keys' database reaches."""
    configured = getattr(settings, "IDEMPOTENCY", None)
    value = (configured if isinstance(configured, dict) else {}).get("WAIT_LISTEN_DATABASE")
    if value is None:
        return []
    problem = _listen_database_problem(value)
    if not problem:
        return []
    return [
        Error(
            f"IDEMPOTENCY['WAIT_LISTEN_DATABASE'] {problem}.",
            hint=(
                "Name an alias of DATABASES whose ENGINE is PostgreSQL, or give a libpq DSN or "
                "URI (postgresql://user@host:5432/name) of a direct connection to the keys' "
                "database, not through a transaction pooler; None listens on the keys' "
                "database when its connection is direct, else the waiters poll."
            ),
            id=ID + "E050",
        )
    ]


def _listen_database_problem(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        return "must be an alias of DATABASES or a PostgreSQL DSN"
    databases = getattr(settings, "DATABASES", {})
    if value in databases:
        if "postgresql" not in str(databases[value].get("ENGINE", "")):
            return f"names {value!r}, which is not a PostgreSQL database"
        return ""
    if not value.startswith(("postgres://", "postgresql://")) and "=" not in value:
        return f"is {value!r}: neither an alias of DATABASES nor a DSN"
    try:
        from psycopg.conninfo import conninfo_to_dict

        conninfo_to_dict(value)
    except ImportError:
        return "is a DSN, which needs psycopg (3) installed"
    except Exception as exc:  # psycopg.ProgrammingError: the DSN does not parse
        return f"does not parse as a DSN ({exc})"
    return ""


def _check_redis_connection() -> list[CheckMessage]:
    """E080-E083, W080: how the Redis strategies connect (see the redis_config_checks
    module): a Sentinel cache that would fail every request, TLS files that do not exist,
    a cache whose client would wait for a reply for ever or send a command twice."""
    from ..strategies.redis.config_checks import check_redis_connection

    return check_redis_connection()


def _check_advisory_wait() -> list[CheckMessage]:
    """W014: advisory_lock bounds a duplicate's lock wait by LOCK_TIMEOUT too, so a WAIT
    above it is cut to LOCK_TIMEOUT."""
    wait, lock = _number(_raw("WAIT")), _number(_raw("LOCK_TIMEOUT"))
    if conf.STRATEGY != "advisory_lock" or wait is None or lock is None or wait <= lock:
        return []
    return [
        Warning(
            f"IDEMPOTENCY['WAIT'] is {wait:g} s, but the advisory_lock strategy waits at most "
            f"LOCK_TIMEOUT ({lock:g} s) for a key in progress.",
            hint="Keep WAIT at or below LOCK_TIMEOUT with advisory_lock.",
            id=ID + "W014",
        )
    ]


def _check_database_timeout() -> list[CheckMessage]:
    """W015: DATABASE_TIMEOUT is None while a key database is PostgreSQL, where nothing
    else bounds a statement that a hung server never answers (libpq has no read timeout).
    Reads ``connections[alias].vendor``, which does not connect."""
    from django.db import connections

    from ..store.sql.statements import features_of

    if _raw("DATABASE_TIMEOUT") is not None:
        return []
    aliases = [a for a in conf.KEY_DATABASES if a in settings.DATABASES]
    if not any(features_of(connections[a]).cut_on_timeout for a in aliases):
        return []
    return [
        Warning(
            "IDEMPOTENCY['DATABASE_TIMEOUT'] is None: a PostgreSQL that hangs without "
            "closing its connections keeps every request on it waiting forever.",
            hint="Leave it at its default (30) or set a number of seconds; see "
            "docs/operations.md, 'A database that hangs'.",
            id=ID + "W015",
        )
    ]


@register("idempotency_stores", deploy=True)
def check_connect_timeout(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W016 (``check --deploy``): a PostgreSQL key database that gives a new connection no
    ``connect_timeout``. ``DATABASE_TIMEOUT`` bounds statements, not connecting: a server
    that hangs (its kernel accepts, nothing answers) keeps each request that opens a
    connection to it waiting for psycopg's default (130 s), libpq's (forever) for psycopg2."""
    from django.db import connections

    from ..store.sql.statements import features_of

    if os.environ.get("PGCONNECT_TIMEOUT"):
        return []
    return [
        Warning(
            f"DATABASES[{alias!r}] gives a new PostgreSQL connection no connect_timeout: a "
            f"server that hangs keeps every request that connects to it waiting, beyond "
            f"IDEMPOTENCY['DATABASE_TIMEOUT'], which bounds statements only.",
            hint=f"Set DATABASES[{alias!r}]['OPTIONS']['connect_timeout'] (5, for example); "
            "see docs/operations.md, 'A database that hangs'.",
            id=ID + "W016",
        )
        for alias in conf.KEY_DATABASES
        if alias in settings.DATABASES
        and features_of(connections[alias]).cut_on_timeout
        and not _options(alias).get("connect_timeout")
    ]


@register("idempotency_stores", deploy=True)
def check_read_timeout(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W017 (``check --deploy``): a key database whose driver waits for a reply for ever
    unless its own read timeout is set (mysqlclient's ``read_timeout`` on MariaDB and
    MySQL), where ``DATABASE_TIMEOUT`` does not cut the connection: a server that hangs
    (stopped, swapping, a path that holds the traffic) keeps every request waiting on a
    claim, a renewal or a completion."""
    from django.db import connections

    from ..store.sql.statements import features_of

    messages: list[CheckMessage] = []
    for alias in conf.KEY_DATABASES:
        if alias not in settings.DATABASES:
            continue
        option = features_of(connections[alias]).read_timeout_option
        if not option or _options(alias).get(option):
            continue
        messages.append(
            Warning(
                f"DATABASES[{alias!r}] sets no {option}: a server that hangs keeps every "
                f"request that waits on it waiting for ever (IDEMPOTENCY['DATABASE_TIMEOUT'] "
                "bounds statements on PostgreSQL only).",
                hint=f"Set DATABASES[{alias!r}]['OPTIONS'][{option!r}] (and "
                "'connect_timeout') to a few seconds, above the slowest view's query; see "
                "docs/operations.md, 'A database that hangs'.",
                id=ID + "W017",
            )
        )
    return messages


def _options(alias: str) -> dict[str, Any]:
    options = settings.DATABASES[alias].get("OPTIONS")
    return options if isinstance(options, dict) else {}


#: This module's validators of the settings (see ``settings.SETTINGS_VALIDATORS``).
VALIDATORS: list[Callable[[], list[CheckMessage]]] = [
    _check_database_and_strategy,
    _check_advisory_wait,
    _check_database_timeout,
    _check_wait_listen_database,
    _check_redis_connection,
]
