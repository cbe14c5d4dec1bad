"""System checks for ``settings.IDEMPOTENCY`` (ids ``django_idempotency.E0xx``/``W0xx``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.utils.module_loading import import_string

from .conf import DEFAULTS, conf
from .errors import STRATEGY_HINT, ImproperlyConfiguredStrategy, InvalidConfiguration

ID = "django_idempotency."
#: The databases each SQL strategy runs on (``connection.vendor``; ``mysql`` is MySQL and
#: MariaDB), and how the checks name them.
SQL_VENDORS = {
    "db": frozenset({"postgresql", "sqlite", "mysql"}),
    "hybrid": frozenset({"postgresql", "sqlite"}),
}
VENDOR_NAMES = {"postgresql": "PostgreSQL", "sqlite": "SQLite", "mysql": "MySQL/MariaDB"}
#: The methods ``METHODS`` (and a view's ``methods``) may name.
HTTP_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE", "GET"})
#: An HTTP field name (RFC 9110 section 5.1: a token).
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Settings that are True or False (E015).
BOOLEAN_SETTINGS = (
    "REQUIRED",
    "ATOMIC",
    "STORE_SERVER_ERRORS",
    "ADMIN_ENABLED",
    "METRICS",
    "REDIS_CLUSTER",
)
#: Settings that are lists of header or cookie names (E017).
NAME_LIST_SETTINGS = (
    "STORED_HEADERS",
    "NEVER_STORED_HEADERS",
    "CREDENTIAL_HEADERS",
    "CREDENTIAL_COOKIES",
)


def validate_settings() -> list[CheckMessage]:
    """Every message of :data:`SETTINGS_VALIDATORS` for the current settings (E001 alone
    when ``IDEMPOTENCY`` is not a dict). Pure: reads ``settings`` and ``conf``, never
    connects; the system check lists these, :func:`enforce_settings` raises the errors."""
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
    for validator in SETTINGS_VALIDATORS:
        messages.extend(validator())
    return messages


def _check_unprotected() -> list[CheckMessage]:
    """E031: UNPROTECTED_DATABASES is a list of aliases of DATABASES; E032: not the keys'."""
    raw = conf.user_settings.get("UNPROTECTED_DATABASES", DEFAULTS["UNPROTECTED_DATABASES"])
    hint = (
        "List the database aliases a protected view may write to outside the protection, "
        "e.g. ['analytics']; the default is () (every write to another database than "
        "IDEMPOTENCY['DATABASE'] is refused)."
    )
    if not isinstance(raw, list | tuple | set | frozenset) or not all(
        isinstance(alias, str) for alias in raw
    ):
        return [
            Error(
                "IDEMPOTENCY['UNPROTECTED_DATABASES'] must be a list of database aliases.",
                hint=hint,
                id=ID + "E031",
            )
        ]
    messages: list[CheckMessage] = [
        Error(
            f"IDEMPOTENCY['UNPROTECTED_DATABASES'] names {alias!r}, which is not in DATABASES.",
            hint=hint,
            id=ID + "E031",
        )
        for alias in sorted(raw)
        if alias not in settings.DATABASES
    ]
    if conf.DATABASE in raw:
        messages.append(
            Error(
                f"IDEMPOTENCY['UNPROTECTED_DATABASES'] names {conf.DATABASE!r}, the database "
                "that holds the keys (IDEMPOTENCY['DATABASE']), whose writes are the ones the "
                "protocol protects.",
                hint=f"Remove {conf.DATABASE!r} from it.",
                id=ID + "E032",
            )
        )
    return messages


#: Django's models that views do not write: ``migrate`` writes the content types and the
#: permissions, the admin its log (the admin's views are not idempotent views).
NOT_WRITTEN_BY_VIEWS = frozenset({"contenttypes.contenttype", "auth.permission", "admin.logentry"})
#: The labels of django.contrib's apps that have models.
DJANGO_APPS = frozenset(
    {"admin", "auth", "contenttypes", "sessions", "sites", "redirects", "flatpages"}
)
#: Models named in a message, at most: the project's first, Django's own last.
SHOWN_MODELS = 6


def _models(labels: list[str]) -> str:
    labels = sorted(labels, key=lambda label: (label.split(".")[0] in DJANGO_APPS, label))
    shown = ", ".join(labels[:SHOWN_MODELS])
    more = len(labels) - SHOWN_MODELS
    return f"{shown} and {more} more" if more > 0 else shown


def _routed_writes() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Where the router sends each installed model's writes (``db_for_write`` without an
    instance): ``({alias: labels})`` of the models views write, and of this app's own."""
    from django.apps import apps
    from django.db import router

    views: dict[str, list[str]] = {}
    own: dict[str, list[str]] = {}
    for model in apps.get_models(include_auto_created=True):
        meta = model._meta
        if meta.label_lower in NOT_WRITTEN_BY_VIEWS:
            continue
        try:
            alias = router.db_for_write(model)
        except Exception:  # a router that cannot answer without an instance
            continue
        found = own if meta.app_config is not None and meta.app_config.name == PACKAGE else views
        found.setdefault(alias, []).append(meta.label)
    return views, own


PACKAGE = "django_idempotency"


@register(Tags.compatibility)
def check_database_routing(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E030: the router sends writes of installed models to a database other than the
    keys' one, not declared in UNPROTECTED_DATABASES (a protected view's writes there are
    refused at run time); W030: it sends this app's own models elsewhere; W031:
    ATOMIC_REQUESTS on a declared one. Nothing here connects to a database."""

    keys = conf.DATABASE
    databases = settings.DATABASES
    if keys not in databases:
        return []  # E005
    unprotected = {alias for alias in conf.UNPROTECTED_DATABASES if alias in databases}
    views, own = _routed_writes()
    messages: list[CheckMessage] = []
    for alias in sorted(set(views) - {keys} - unprotected):
        messages.append(
            Error(
                f"The database router sends the writes of {_models(views[alias])} to "
                f"{alias!r}, but the keys are on {keys!r} (IDEMPOTENCY['DATABASE']): a "
                "protected view's writes there would commit outside the transaction that "
                "stores its key's response (a failed request would leave them for its retry "
                "to repeat, and a response could be stored for writes that never commit), "
                "so they are refused with a 503 database-misconfigured.",
                hint=f"Route these models to {keys!r}, or keep the keys on {alias!r} "
                f"(IDEMPOTENCY['DATABASE']). If writes to {alias!r} are meant to be outside "
                f"the protection, list it in IDEMPOTENCY['UNPROTECTED_DATABASES'].",
                id=ID + "E030",
            )
        )
    for alias in sorted(set(own) - {keys}):
        messages.append(
            Warning(
                f"The database router sends the writes of {_models(own[alias])} to "
                f"{alias!r}, but the keys are on {keys!r} (IDEMPOTENCY['DATABASE']): the "
                f"protocol reads and writes them on {keys!r}, while the admin and code using "
                f"the models without using= act on {alias!r}.",
                hint=f"Route the {PACKAGE} app's models to {keys!r}.",
                id=ID + "W030",
            )
        )
    messages.extend(_atomic_unprotected(sorted(unprotected), keys))
    return messages


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return validate_settings()


def error_text(message: CheckMessage) -> str:
    """``"<id>: <message> HINT: <hint>"``: a check message as ``InvalidConfiguration`` says it."""
    text = f"{message.id}: {message.msg}"
    return f"{text} HINT: {message.hint}" if message.hint else text


def raise_errors(messages: Iterable[CheckMessage]) -> None:
    """Raise ``InvalidConfiguration`` naming every error (not warning) in ``messages``."""
    errors = [error_text(m) for m in messages if m.is_serious()]
    if errors:
        raise InvalidConfiguration("\n".join(errors))


def enforce_settings() -> None:
    """Raise ``InvalidConfiguration`` when the settings have an error (start-up, first use)."""
    raise_errors(validate_settings())


def _check_unknown_keys() -> list[CheckMessage]:
    """W001: a key that is not a setting (a typo would be ignored)."""
    return [
        Warning(
            f"IDEMPOTENCY[{name!r}] is not a known setting and is ignored.",
            hint="Known settings: " + ", ".join(sorted(DEFAULTS)) + ".",
            id=ID + "W001",
        )
        for name in sorted(set(conf.user_settings) - set(DEFAULTS))
    ]


def _raw(name: str) -> Any:
    """The value of setting ``name`` as given (not converted), or its default."""
    return conf.user_settings.get(name, DEFAULTS[name])


def _number(value: Any) -> float | None:
    """``value`` as a finite float (a number, or a string of one, as ``conf`` reads it),
    else None: ``nan`` and ``inf`` break every comparison or overflow a date."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def positive_errors(label: str, value: Any, default: Any) -> list[CheckMessage]:
    """E002 for ``label`` (a setting, or a view's option) unless ``value`` is a positive number."""
    number = _number(value)
    if number is not None and number > 0:
        return []
    return [
        Error(
            f"{label} must be a positive number.",
            hint=f"The default is {default!r}.",
            id=ID + "E002",
        )
    ]


def methods_errors(label: str, value: Any) -> list[CheckMessage]:
    """E004 unless ``value`` is a list of HTTP methods (not a string, which is letters)."""
    names = None
    if not isinstance(value, str | bytes) and isinstance(value, Iterable):
        names = {str(m).upper() for m in value}
    if names and names <= HTTP_METHODS:
        return []
    return [
        Error(
            f"{label} must list HTTP methods such as POST and PATCH.",
            hint="The default is ('POST', 'PATCH').",
            id=ID + "E004",
        )
    ]


def wait_errors(label: str, value: Any) -> list[CheckMessage]:
    """E013 unless ``value`` is a number of seconds of at least 0."""
    number = _number(value)
    if number is not None and number >= 0:
        return []
    return [
        Error(
            f"{label} is not valid.",
            hint=(
                "WAIT is seconds (0 turns waiting off), WAIT_POLL_INTERVAL a positive number "
                "of seconds, WAIT_MAX_WAITERS a whole number of at least 1; the defaults are "
                f"{DEFAULTS['WAIT']!r}, {DEFAULTS['WAIT_POLL_INTERVAL']!r} and "
                f"{DEFAULTS['WAIT_MAX_WAITERS']!r}."
            ),
            id=ID + "E013",
        )
    ]


def boolean_errors(label: str, value: Any) -> list[CheckMessage]:
    """E015 unless ``value`` is True or False: ``"False"`` would be true."""
    if isinstance(value, bool):
        return []
    return [
        Error(
            f"{label} must be True or False, not {value!r}.",
            hint="A string such as 'False' counts as true; use the Python constants.",
            id=ID + "E015",
        )
    ]


def _check_wait() -> list[CheckMessage]:
    """E013: WAIT at least 0, WAIT_POLL_INTERVAL positive, WAIT_MAX_WAITERS a whole number
    of at least 1 (all finite)."""
    messages = wait_errors("IDEMPOTENCY['WAIT']", _raw("WAIT"))
    poll = _number(_raw("WAIT_POLL_INTERVAL"))
    if poll is None or poll <= 0:
        messages += wait_errors("IDEMPOTENCY['WAIT_POLL_INTERVAL']", -1)
    waiters = _raw("WAIT_MAX_WAITERS")
    if isinstance(waiters, bool) or not isinstance(waiters, int) or waiters < 1:
        messages += wait_errors("IDEMPOTENCY['WAIT_MAX_WAITERS']", -1)
    return messages


def _check_numbers() -> list[CheckMessage]:
    """E002: durations and sizes positive; E003: the heartbeat within the lease; W002."""
    messages: list[CheckMessage] = []
    for name in ("TTL", "LOCK_TIMEOUT", "MAX_STORED_BODY_SIZE", "REDIS_SOCKET_TIMEOUT"):
        messages += positive_errors(f"IDEMPOTENCY[{name!r}]", _raw(name), DEFAULTS[name])
    if messages:
        return messages
    heartbeat = _raw("HEARTBEAT_INTERVAL")
    beat = conf.LOCK_TIMEOUT / 3 if heartbeat is None else _number(heartbeat)
    if beat is None or not 0 < beat < conf.LOCK_TIMEOUT:
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
    return messages


def _check_methods() -> list[CheckMessage]:
    return methods_errors("IDEMPOTENCY['METHODS']", _raw("METHODS"))


def _check_header() -> list[CheckMessage]:
    """E014: HEADER must be a header name (an RFC 9110 token): any other never matches a
    request header, and every key would be ignored."""
    header = _raw("HEADER")
    if isinstance(header, str) and TOKEN.fullmatch(header):
        return []
    return [
        Error(
            f"IDEMPOTENCY['HEADER'] is {header!r}, which is not an HTTP header name.",
            hint="Use a name of letters, digits and dashes; the default is 'Idempotency-Key'.",
            id=ID + "E014",
        )
    ]


#: The longest ``KEY_BODY_FIELD``.
MAX_FIELD_NAME = 255


def _check_key_body_field() -> list[CheckMessage]:
    """E022: KEY_BODY_FIELD is None or the name of a JSON field: a string of 1 to 255
    characters, none of them a control character. Any other never matches a body's field
    (every key sent there would be ignored) or cannot be named in a problem's detail."""
    field = _raw("KEY_BODY_FIELD")
    if field is None or (
        isinstance(field, str) and 0 < len(field) <= MAX_FIELD_NAME and field.isprintable()
    ):
        return []
    return [
        Error(
            f"IDEMPOTENCY['KEY_BODY_FIELD'] is {field!r}, which is not the name of a JSON field.",
            hint="Name a top-level field of the JSON request body, such as 'idempotency_key' "
            f"(1 to {MAX_FIELD_NAME} printable characters), or set None to read the key "
            "from the header only.",
            id=ID + "E022",
        )
    ]


def _check_booleans() -> list[CheckMessage]:
    return [
        message
        for name in BOOLEAN_SETTINGS
        for message in boolean_errors(f"IDEMPOTENCY[{name!r}]", _raw(name))
    ]


def _check_retry_after() -> list[CheckMessage]:
    """E016: RETRY_AFTER is None or whole seconds: any other fails every 409 (a 500)."""
    value = _raw("RETRY_AFTER")
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return []
    return [
        Error(
            f"IDEMPOTENCY['RETRY_AFTER'] is {value!r}.",
            hint="Use None (the strategy chooses) or a whole number of seconds, such as 1.",
            id=ID + "E016",
        )
    ]


def _check_name_lists() -> list[CheckMessage]:
    """E017: the header and cookie lists are lists of names. A string would be read as
    its letters: NEVER_STORED_HEADERS = 'Set-Cookie' would store and replay cookies, and
    CREDENTIAL_HEADERS = 'Authorization' would let an unauthenticated token share the
    scope 'anonymous'."""
    messages: list[CheckMessage] = []
    for name in NAME_LIST_SETTINGS:
        value = _raw(name)
        if value is None and name == "CREDENTIAL_COOKIES":
            continue
        if isinstance(value, list | tuple | set | frozenset) and all(
            isinstance(v, str) and v for v in value
        ):
            continue
        messages.append(
            Error(
                f"IDEMPOTENCY[{name!r}] must be a list of names, not {value!r}.",
                hint=f"For example {list(DEFAULTS[name] or ['sessionid'])[:2]!r}.",
                id=ID + "E017",
            )
        )
    return messages


def _check_callables() -> list[CheckMessage]:
    """E018: SCOPE_FUNCTION and PROBLEM_RENDERER name callables that can be imported; one
    that cannot would fail every request that needs it."""
    messages: list[CheckMessage] = []
    for name in ("SCOPE_FUNCTION", "PROBLEM_RENDERER"):
        path = _raw(name)
        if path is None:
            continue
        try:
            found = callable(import_string(path)) if isinstance(path, str) else False
        except ImportError:
            found = False
        if not found:
            messages.append(
                Error(
                    f"IDEMPOTENCY[{name!r}] is {path!r}, which is not the dotted path of a "
                    "callable that can be imported.",
                    hint="Name a function as 'package.module.function', or set None.",
                    id=ID + "E018",
                )
            )
    return messages


def _check_outbox() -> list[CheckMessage]:
    """E019: OUTBOX_BATCH_SIZE is a whole number of at least 1 (0 would never drain)."""
    size = _raw("OUTBOX_BATCH_SIZE")
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return []
    return [
        Error(
            f"IDEMPOTENCY['OUTBOX_BATCH_SIZE'] is {size!r}.",
            hint="Use a whole number of at least 1; the default is "
            f"{DEFAULTS['OUTBOX_BATCH_SIZE']!r}.",
            id=ID + "E019",
        )
    ]


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
    that is not configured. Reads ``connections[alias].vendor``, which does not connect."""
    from django.db import connections

    from .strategies import load_strategy

    try:
        load_strategy(strategy)
    except ImproperlyConfiguredStrategy as exc:
        return [Error(exc.reason, hint=STRATEGY_HINT, id=ID + "E006")]
    alias = conf.DATABASE
    vendor = connections[alias].vendor
    if strategy == "advisory_lock" and vendor != "postgresql":
        return [
            Error(
                f"The advisory_lock strategy needs PostgreSQL; database {alias!r} is {vendor}.",
                hint="Use the 'db' strategy on SQLite.",
                id=ID + "E007",
            )
        ]
    supported = SQL_VENDORS.get(strategy)
    if supported is not None and vendor not in supported:
        names = " and ".join(VENDOR_NAMES[name] for name in sorted(supported))
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
    if strategy == "db" and vendor == "mysql":
        return _mysql_errors(alias)
    return _redis_errors(strategy)


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


def _check_headers() -> list[CheckMessage]:
    if _check_name_lists():
        return []  # not lists of names: E017 says so
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
    """E080, E081, W080: how the Redis strategies connect (see the redis_config_checks
    module): a Sentinel cache that would fail every request, TLS files that do not exist."""
    from .strategies.redis.config_checks import check_redis_connection

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


def _check_middleware_settings() -> list[CheckMessage]:
    """E101, E103, E104: IdempotencyMiddleware's settings (see the middleware module)."""
    from .middleware import validate_middleware_settings

    return validate_middleware_settings()


#: The settings' validators, one per concern, in the order their messages are listed:
#: each takes no argument, reads ``settings`` and ``conf`` (never connecting, never
#: resolving URLs) and returns its messages. ``check_settings`` lists them and
#: ``enforce_settings`` raises their errors, so a new setting's check goes here once.
SETTINGS_VALIDATORS: list[Callable[[], list[CheckMessage]]] = [
    _check_unknown_keys,
    _check_numbers,
    _check_methods,
    _check_database_and_strategy,
    _check_headers,
    _check_choices,
    _check_metrics,
    _check_wait,
    _check_header,
    _check_key_body_field,
    _check_booleans,
    _check_retry_after,
    _check_name_lists,
    _check_callables,
    _check_outbox,
    _check_advisory_wait,
    _check_middleware_settings,
    _check_unprotected,
    _check_wait_listen_database,
    _check_redis_connection,
]


# -- a view's own options -----------------------------------------------------------------------


def view_option_errors(
    where: str,
    *,
    methods: Any = None,
    required: Any = None,
    ttl: Any = None,
    lock_timeout: Any = None,
    strategy: Any = None,
    wait: Any = None,
) -> list[CheckMessage]:
    """The checks of the settings, applied to the options a view declares (``None``: the
    setting's, checked with the settings). ``where`` names the view in the messages."""
    messages: list[CheckMessage] = []
    if methods is not None:
        messages += methods_errors(f"{where}: methods", methods)
    if required is not None:
        messages += boolean_errors(f"{where}: required", required)
    for name, value in (("ttl", ttl), ("lock_timeout", lock_timeout)):
        if value is not None:
            messages += positive_errors(f"{where}: {name}={value!r}", value, DEFAULTS[name.upper()])
    if wait is not None:
        messages += wait_errors(f"{where}: wait={wait!r}", wait)
    if strategy is not None:
        messages += _view_strategy_errors(strategy)
    return messages


def _view_strategy_errors(strategy: Any) -> list[CheckMessage]:
    """:func:`strategy_errors` for a view's ``strategy``; only once the app registry is
    ready (a strategy's module may import models): the request loads it otherwise, and
    raises the same E006."""
    from django.apps import apps

    if not isinstance(strategy, str):
        return [Error(f"{strategy!r} is not a strategy name.", hint=STRATEGY_HINT, id=ID + "E006")]
    if not apps.ready or conf.DATABASE not in settings.DATABASES:
        return []
    return strategy_errors(strategy)


def validate_view_options(where: str, **options: Any) -> None:
    """Raise ``InvalidConfiguration`` where a view declares an option the checks call an
    error (decoration, class creation, ``as_view()``)."""
    raise_errors(view_option_errors(where, **options))


def view_name(view: Any) -> str:
    """``module.qualname`` of a view function or class, for messages."""
    module = getattr(view, "__module__", None) or "?"
    return f"{module}.{getattr(view, '__qualname__', None) or getattr(view, '__name__', view)}"


def _atomic_unprotected(aliases: list[str], keys: str) -> list[CheckMessage]:
    """W031: ATOMIC_REQUESTS on an alias of UNPROTECTED_DATABASES."""
    from django.db import connections

    messages: list[CheckMessage] = []
    for alias in aliases:
        if connections[alias].settings_dict.get("ATOMIC_REQUESTS"):
            messages.append(
                Warning(
                    f"ATOMIC_REQUESTS is on for {alias!r}, which is listed in "
                    "IDEMPOTENCY['UNPROTECTED_DATABASES']: a protected view's writes there "
                    "commit after its key's response is stored, so a COMMIT that fails "
                    f"there (a deferred constraint) leaves a stored response that every "
                    "retry replays, for writes that do not exist.",
                    hint=f"Turn ATOMIC_REQUESTS off for {alias!r}, or route the models the "
                    f"views write to {keys!r}.",
                    id=ID + "W031",
                )
            )
    return messages


@register(Tags.urls)
def check_drf_function_views(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``@idempotent`` combined with DRF's ``@api_view`` in the URLconf. Outside it, the
    key is claimed before DRF authenticates the caller, so every request with DRF
    credentials is refused: a construct that can never work (E021). Inside it (below
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
        return _wraps_one_of(func, codes)

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
            name = _view_class_name(view_class)
            if is_idempotent_wrapper(callback):
                messages.append(_outside_api_view_error(name, route, callback))
                continue
            if not atomic_requests or database in getattr(callback, "_non_atomic_requests", ()):
                continue
            for method in getattr(view_class, "http_method_names", ()):
                handler = getattr(view_class, method, None)
                cells = getattr(handler, "__closure__", None) or ()
                if any(is_idempotent_wrapper(_cell_value(cell)) for cell in cells):
                    messages.append(_atomic_requests_error(name, route, callback, database))
                    break

    try:
        resolver = get_resolver()
        patterns = resolver.url_patterns
    except Exception:  # a broken URLconf is reported by Django's own checks
        return []
    visit(patterns, "")
    return messages


def _wraps_one_of(func: Any, codes: set[Any]) -> bool:
    """Whether ``func``, or a function it wraps (``functools.wraps``), has one of ``codes``."""
    seen = 0
    while func is not None and seen < 50:
        if getattr(func, "__code__", None) in codes:
            return True
        func, seen = getattr(func, "__wrapped__", None), seen + 1
    return False


def _view_class_name(view_class: type) -> str:
    """``module.name``; ``@api_view`` names its class after the function, but not its
    ``__qualname__``."""
    qualname = view_class.__qualname__
    if qualname.endswith("WrappedAPIView"):
        qualname = view_class.__name__
    return f"{view_class.__module__}.{qualname}"


def _outside_api_view_error(name: str, route: str, callback: Any) -> Error:
    """E021: ``@idempotent`` above ``@api_view``, which can never work with DRF's
    authentication."""
    return Error(
        f"{name} (URL {route!r}) has @idempotent outside DRF's @api_view: "
        "the key is claimed before DRF authenticates the caller, so every "
        "request with DRF credentials is refused (400 "
        "credentials-not-authenticated) and a rejected request's 401, 403 "
        "or 429 is stored for its key.",
        hint="Replace @idempotent and @api_view(...) with "
        "@idempotent_api_view(...) from django_idempotency.drf (the same "
        "arguments: @api_view's methods first, then @idempotent's options), "
        "or move @idempotent below @api_view(...).",
        obj=callback,
        id=ID + "E021",
    )


def _atomic_requests_error(name: str, route: str, callback: Any, database: str) -> Error:
    """E020: ``@idempotent`` below ``@api_view`` inside the request's transaction."""
    return Error(
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
