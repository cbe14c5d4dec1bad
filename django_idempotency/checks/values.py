"""The checks of each setting's value on its own: numbers, methods, names, booleans,
callables, choices (E002-E004, E009-E017, E022, W001-W004)."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string

from ..conf import DEFAULTS, conf
from . import ID

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
    "TEST_ISOLATION",
)


#: Settings that are lists of header or cookie names (E017).
NAME_LIST_SETTINGS = (
    "STORED_HEADERS",
    "NEVER_STORED_HEADERS",
    "CREDENTIAL_HEADERS",
    "CREDENTIAL_COOKIES",
)


def _check_unknown_keys() -> list[CheckMessage]:
    """W001: a key that is not a setting (a typo would be ignored); the hint names the
    closest setting when there is one."""
    return [
        Warning(
            f"IDEMPOTENCY[{name!r}] is not a known setting and is ignored.",
            hint=_unknown_hint(name),
            id=ID + "W001",
        )
        for name in sorted(set(conf.user_settings) - set(DEFAULTS))
    ]


def _unknown_hint(name: object) -> str:
    close = difflib.get_close_matches(str(name).upper(), DEFAULTS, n=1, cutoff=0.75)
    if close:
        return f"Did you mean {close[0]!r}?"
    return "Known settings: " + ", ".join(sorted(DEFAULTS)) + "."


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
    if _raw("DATABASE_TIMEOUT") is not None:
        messages += positive_errors(
            "IDEMPOTENCY['DATABASE_TIMEOUT']",
            _raw("DATABASE_TIMEOUT"),
            DEFAULTS["DATABASE_TIMEOUT"],
        )
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


def importable_callable(path: Any) -> bool:
    """Whether ``path`` is the dotted path of a callable that can be imported."""
    try:
        return callable(import_string(path)) if isinstance(path, str) else False
    except ImportError:
        return False


def _check_callables() -> list[CheckMessage]:
    """E018: SCOPE_FUNCTION and PROBLEM_RENDERER name callables that can be imported; one
    that cannot would fail every request that needs it."""
    messages: list[CheckMessage] = []
    for name in ("SCOPE_FUNCTION", "PROBLEM_RENDERER"):
        path = _raw(name)
        if path is not None and not importable_callable(path):
            messages.append(
                Error(
                    f"IDEMPOTENCY[{name!r}] is {path!r}, which is not the dotted path of a "
                    "callable that can be imported.",
                    hint="Name a function as 'package.module.function', or set None.",
                    id=ID + "E018",
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


def _check_hybrid_redis_ttl() -> list[CheckMessage]:
    """E060: HYBRID_REDIS_TTL None or a positive number; E061: not longer than TTL (a
    record in Redis would outlive the key it answers for)."""
    value = _raw("HYBRID_REDIS_TTL")
    if value is None:
        return []
    number = _number(value)
    if number is None or number <= 0:
        return [
            Error(
                f"IDEMPOTENCY['HYBRID_REDIS_TTL'] is {value!r}, which is neither None nor a "
                "positive number of seconds.",
                hint="None keeps completed records in Redis for TTL seconds.",
                id=ID + "E060",
            )
        ]
    ttl = _number(_raw("TTL"))
    if ttl is not None and number > ttl:
        return [
            Error(
                f"IDEMPOTENCY['HYBRID_REDIS_TTL'] ({number:g} s) is longer than TTL ({ttl:g} s).",
                hint="Redis holds the hot window of the keys the database keeps for TTL: set "
                "it to at most TTL, or None for TTL.",
                id=ID + "E061",
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


#: This module's validators of the settings (see ``settings.SETTINGS_VALIDATORS``).
VALIDATORS: list[Callable[[], list[CheckMessage]]] = [
    _check_unknown_keys,
    _check_numbers,
    _check_methods,
    _check_headers,
    _check_choices,
    _check_hybrid_redis_ttl,
    _check_metrics,
    _check_wait,
    _check_header,
    _check_key_body_field,
    _check_booleans,
    _check_retry_after,
    _check_name_lists,
    _check_callables,
]
