"""System checks for ``settings.IDEMPOTENCY`` (ids ``django_idempotency.E0xx``/``W0xx``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from .conf import DEFAULTS, conf
from .errors import ImproperlyConfiguredStrategy

ID = "django_idempotency."
SQL_VENDORS = {"postgresql", "sqlite"}


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    user = getattr(settings, "IDEMPOTENCY", None)
    if user is not None and not isinstance(user, Mapping):
        return [
            Error(
                "IDEMPOTENCY must be a dict.",
                hint="Set IDEMPOTENCY = {'STRATEGY': 'db', ...} or remove it.",
                id=ID + "E001",
            )
        ]
    messages: list[CheckMessage] = []
    for name in sorted(set(user or {}) - set(DEFAULTS)):
        messages.append(
            Warning(
                f"IDEMPOTENCY[{name!r}] is not a known setting and is ignored.",
                hint="Known settings: " + ", ".join(sorted(DEFAULTS)) + ".",
                id=ID + "W001",
            )
        )
    messages.extend(_check_numbers())
    messages.extend(_check_database_and_strategy())
    messages.extend(_check_headers())
    messages.extend(_check_choices())
    messages.extend(_check_redis())
    messages.extend(_check_metrics())
    messages.extend(_check_wait())
    messages.extend(_check_wait_listen_database())
    return messages


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


def _check_wait() -> list[CheckMessage]:
    """E013: WAIT at least 0, WAIT_POLL_INTERVAL positive, WAIT_MAX_WAITERS a whole number
    of at least 1."""
    configured = getattr(settings, "IDEMPOTENCY", None)
    raw = configured if isinstance(configured, dict) else {}
    problems: list[str] = []
    for name, least, inclusive in (("WAIT", 0, True), ("WAIT_POLL_INTERVAL", 0, False)):
        value = raw.get(name, DEFAULTS[name])
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or value < least or (value == least and not inclusive):
            problems.append(name)
    waiters = raw.get("WAIT_MAX_WAITERS", DEFAULTS["WAIT_MAX_WAITERS"])
    if isinstance(waiters, bool) or not isinstance(waiters, int) or waiters < 1:
        problems.append("WAIT_MAX_WAITERS")
    return [
        Error(
            f"IDEMPOTENCY[{name!r}] is not valid.",
            hint=(
                "WAIT is seconds (0 turns waiting off), WAIT_POLL_INTERVAL a positive number "
                "of seconds, WAIT_MAX_WAITERS a whole number of at least 1; the defaults are "
                f"{DEFAULTS['WAIT']!r}, {DEFAULTS['WAIT_POLL_INTERVAL']!r} and "
                f"{DEFAULTS['WAIT_MAX_WAITERS']!r}."
            ),
            id=ID + "E013",
        )
        for name in problems
    ]


def _check_numbers() -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for name in ("TTL", "LOCK_TIMEOUT", "MAX_STORED_BODY_SIZE"):
        try:
            value = float(getattr(conf, name))
        except (TypeError, ValueError):
            value = -1
        if value <= 0:
            messages.append(
                Error(
                    f"IDEMPOTENCY[{name!r}] must be a positive number.",
                    hint=f"The default is {DEFAULTS[name]!r}.",
                    id=ID + "E002",
                )
            )
    if messages:
        return messages
    try:
        heartbeat = conf.HEARTBEAT_INTERVAL
    except (TypeError, ValueError):
        heartbeat = -1
    if not 0 < heartbeat < conf.LOCK_TIMEOUT:
        messages.append(
            Error(
                "IDEMPOTENCY['HEARTBEAT_INTERVAL'] must be positive and shorter than LOCK_TIMEOUT.",
                hint="Leave it unset to renew leases every LOCK_TIMEOUT / 3 seconds.",
                id=ID + "E003",
            )
        )
    if conf.TTL < conf.LOCK_TIMEOUT:
        messages.append(
            Warning(
                "IDEMPOTENCY['TTL'] is shorter than LOCK_TIMEOUT.",
                hint="Keep completed keys at least as long as a request may run.",
                id=ID + "W002",
            )
        )
    try:
        methods = conf.METHODS
    except TypeError:  # not a list of names, e.g. None
        methods = frozenset()
    if not methods or not methods <= {"POST", "PUT", "PATCH", "DELETE", "GET"}:
        messages.append(
            Error(
                "IDEMPOTENCY['METHODS'] must list HTTP methods such as POST and PATCH.",
                hint="The default is ('POST', 'PATCH').",
                id=ID + "E004",
            )
        )
    return messages


def _check_database_and_strategy() -> list[CheckMessage]:
    alias = conf.DATABASE
    if alias not in settings.DATABASES:
        return [
            Error(
                f"IDEMPOTENCY['DATABASE'] is {alias!r}, which is not in DATABASES.",
                hint="Name the database alias that holds your views' data.",
                id=ID + "E005",
            )
        ]
    from django.db import connections

    vendor = connections[alias].vendor
    strategy = conf.STRATEGY
    from .strategies import load_strategy

    try:
        load_strategy(strategy)
    except ImproperlyConfiguredStrategy as exc:
        return [
            Error(
                str(exc),
                hint="Use 'db', 'advisory_lock', 'redis', 'hybrid' or the dotted path "
                "of a Strategy subclass (the redis and hybrid strategies need "
                "`pip install django-idempotency[redis]`).",
                id=ID + "E006",
            )
        ]
    if strategy == "advisory_lock" and vendor != "postgresql":
        return [
            Error(
                f"The advisory_lock strategy needs PostgreSQL; database {alias!r} is {vendor}.",
                hint="Use the 'db' strategy on SQLite.",
                id=ID + "E007",
            )
        ]
    if strategy in {"db", "hybrid"} and vendor not in SQL_VENDORS:
        return [
            Error(
                f"The {strategy} strategy supports PostgreSQL and SQLite; "
                f"database {alias!r} is {vendor}.",
                hint="It needs INSERT … ON CONFLICT DO NOTHING RETURNING.",
                id=ID + "E008",
            )
        ]
    return []


def _check_headers() -> list[CheckMessage]:
    both = conf.STORED_HEADERS & conf.NEVER_STORED_HEADERS
    if both:
        return [
            Warning(
                "These headers are listed in STORED_HEADERS but are never stored: "
                + ", ".join(sorted(both))
                + ".",
                hint="Secrets, cookies and hop-by-hop headers are never replayed.",
                id=ID + "W003",
            )
        ]
    return []


def _check_choices() -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    if conf.REDIS_FAILURE_MODE not in {"db", "fail_closed"}:
        messages.append(
            Error(
                "IDEMPOTENCY['REDIS_FAILURE_MODE'] must be 'db' or 'fail_closed'.",
                hint="'db' falls back to the database strategy; 'fail_closed' answers 503.",
                id=ID + "E009",
            )
        )
    if conf.HYBRID_DB_CHECK not in {"always", "after_loss"}:
        messages.append(
            Error(
                "IDEMPOTENCY['HYBRID_DB_CHECK'] must be 'always' or 'after_loss'.",
                hint="'always' never double-charges after a Redis data loss.",
                id=ID + "E010",
            )
        )
    return messages


REDIS_STRATEGIES = {"redis", "hybrid"}
#: Django's own Redis cache backend, accepted for REDIS_CACHE_ALIAS like django-redis.
DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"


def _check_redis() -> list[CheckMessage]:
    """The redis and hybrid strategies need a Redis to talk to (E011), and a cache
    alias must name a Redis cache, django-redis or Django's own (E012). Nothing here
    connects to Redis."""
    if conf.STRATEGY not in REDIS_STRATEGIES:
        return []
    alias = conf.REDIS_CACHE_ALIAS
    if not alias and not conf.REDIS_URL:
        return [
            Error(
                f"The {conf.STRATEGY} strategy needs IDEMPOTENCY['REDIS_URL'] or "
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


def _check_metrics() -> list[CheckMessage]:
    """METRICS is on but prometheus_client is not installed (W004): no metrics are exported."""
    import importlib.util

    if conf.METRICS and importlib.util.find_spec("prometheus_client") is None:
        return [
            Warning(
                "IDEMPOTENCY['METRICS'] is on, but prometheus_client is not installed, "
                "so no metrics are exported.",
                hint="pip install django-idempotency[prometheus], or set METRICS to False.",
                id=ID + "W004",
            )
        ]
    return []


@register(Tags.urls)
def check_drf_function_views(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``@idempotent`` combined with DRF's ``@api_view`` in the URLconf. Outside it, the
    key is claimed before DRF authenticates the caller (W020). Inside it (below
    ``@api_view``) the key is claimed after DRF's authentication and the response stored
    as DRF renders it, but the view cannot exempt itself from ``ATOMIC_REQUESTS`` (DRF's
    ``as_view()`` is the view Django wraps): E020 when the keys' database has it on and
    the URL's view is not marked ``@transaction.non_atomic_requests``.
    ``@idempotent_api_view`` is the form of a DRF function view that needs neither."""
    import importlib.util

    if importlib.util.find_spec("rest_framework") is None:
        return []
    from django.db import connections
    from django.urls import URLPattern, URLResolver, get_resolver
    from rest_framework.views import APIView

    from .mixins import IdempotencyMixin

    codes = _idempotent_wrapper_codes()
    messages: list[CheckMessage] = []
    database = conf.DATABASE
    try:
        atomic_requests = bool(connections[database].settings_dict.get("ATOMIC_REQUESTS"))
    except Exception:  # an unknown alias: E0xx of check_settings says so
        atomic_requests = False

    def is_idempotent_wrapper(func: Any) -> bool:
        """Whether ``func``, or a function it wraps (``functools.wraps``), is one."""
        seen = 0
        while func is not None and seen < 50:
            if getattr(func, "__code__", None) in codes:
                return True
            func, seen = getattr(func, "__wrapped__", None), seen + 1
        return False

    def visit(patterns: Any, prefix: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                visit(pattern.url_patterns, prefix + str(pattern.pattern))
                continue
            if not isinstance(pattern, URLPattern):
                continue
            callback = pattern.callback
            view_class = getattr(callback, "cls", None)
            if not isinstance(view_class, type) or not issubclass(view_class, APIView):
                continue
            if issubclass(view_class, IdempotencyMixin):
                continue
            route = prefix + str(pattern.pattern)
            name = f"{view_class.__module__}.{view_class.__qualname__}"
            if is_idempotent_wrapper(callback):
                messages.append(
                    Warning(
                        f"{name} (URL {route!r}) has @idempotent outside DRF's @api_view: "
                        "the key is claimed before DRF authenticates the caller, so a "
                        "request with credentials is refused (credentials-not-authenticated) "
                        "and a rejected request's 401, 403 or 429 is stored for its key.",
                        hint="Replace @idempotent and @api_view(...) with "
                        "@idempotent_api_view(...) from django_idempotency.drf.",
                        obj=callback,
                        id=ID + "W020",
                    )
                )
                continue
            if not atomic_requests or database in getattr(callback, "_non_atomic_requests", ()):
                continue
            for method in getattr(view_class, "http_method_names", ()):
                handler = getattr(view_class, method, None)
                cells = getattr(handler, "__closure__", None) or ()
                if any(is_idempotent_wrapper(_cell_value(cell)) for cell in cells):
                    messages.append(
                        Error(
                            f"{name} (URL {route!r}) has @idempotent inside DRF's @api_view "
                            f"while ATOMIC_REQUESTS is on for the database {database!r}: the "
                            "request's transaction holds the claim and the stored response "
                            "until the request ends, so duplicates cannot see the claim, its "
                            "lease cannot be renewed, and a response can be stored for "
                            "writes that are rolled back afterwards.",
                            hint="Replace @idempotent and @api_view(...) with "
                            "@idempotent_api_view(...) from django_idempotency.drf, or put "
                            f"@transaction.non_atomic_requests(using={database!r}) above "
                            "@api_view(...).",
                            obj=callback,
                            id=ID + "E020",
                        )
                    )
                    break

    try:
        resolver = get_resolver()
        patterns = resolver.url_patterns
    except Exception:  # a broken URLconf is reported by Django's own checks
        return []
    visit(patterns, "")
    return messages


def _idempotent_wrapper_codes() -> set[Any]:
    """The code objects of the functions ``@idempotent`` wraps a view in (one per kind
    of view it supports), to tell its wrappers from any other decorator's."""
    from .decorators import idempotent

    def sync_view(request: Any) -> Any:
        raise NotImplementedError

    async def async_view(request: Any) -> Any:
        raise NotImplementedError

    codes = set()
    views: tuple[Any, ...] = (sync_view, async_view)
    for view in views:
        code = getattr(idempotent(view), "__code__", None)
        if code is not None and code not in (sync_view.__code__, async_view.__code__):
            codes.add(code)
    return codes


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None
