"""The checks of each setting's value: on its own, as its declaration in ``conf`` says
(its :class:`~django_idempotency.conf.Rule`: E002, E004, E009, E010, E013-E019, E022, E060,
E071, E076), and against the other settings (E003, E061, W001-W004)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from django.core.checks import CheckMessage, Error, Warning

from ..conf import (
    BOOLEAN,
    CALLABLE,
    DEFAULTS,
    METHOD_LIST,
    NAMES,
    POSITIVE,
    SETTINGS,
    WAIT_SECONDS,
    Rule,
    Setting,
    conf,
    finite_number,
)
from . import ID

#: Settings that are True or False (E015).
BOOLEAN_SETTINGS = tuple(name for name, s in SETTINGS.items() if s.rule is BOOLEAN)

#: Settings that are lists of header or cookie names (E017).
NAME_LIST_SETTINGS = tuple(name for name, s in SETTINGS.items() if s.rule is NAMES)


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
    return conf.raw(name)


_number = finite_number


def importable_callable(path: Any) -> bool:
    """Whether ``path`` is the dotted path of a callable that can be imported."""
    return CALLABLE.passes(path)


def rule_errors(
    rule: Rule, label: str, value: Any, setting: Setting[Any] | None = None, **fields: Any
) -> list[CheckMessage]:
    """``rule``'s error for ``label`` (a setting, or a view's option) unless ``value``
    passes it. ``setting`` (else the first whose rule it is) gives the default and the
    example the message may name; ``fields`` override them."""
    if rule.passes(value):
        return []
    setting = setting or next(s for s in SETTINGS.values() if s.rule is rule)
    fields = {
        "label": label,
        "value": value,
        "name": setting.name,
        "default": setting.default,
        "example": setting.example,
        "defaults": DEFAULTS,
        **fields,
    }
    return [Error(rule.message.format(**fields), hint=rule.hint.format(**fields), id=ID + rule.id)]


def value_errors(name: str) -> list[CheckMessage]:
    """The errors of setting ``name``'s value on its own (its rule; none when it has no rule,
    or is None where None is allowed)."""
    setting = SETTINGS[name]
    value = conf.raw(name)
    if setting.rule is None or (value is None and setting.nullable):
        return []
    return rule_errors(setting.rule, f"IDEMPOTENCY[{name!r}]", value, setting)


def _check_values() -> list[CheckMessage]:
    """Each setting's value on its own, as its declaration says, in the settings' order."""
    return [message for name in SETTINGS for message in value_errors(name)]


def positive_errors(label: str, value: Any, default: Any) -> list[CheckMessage]:
    """E002 for ``label`` (a setting, or a view's option) unless ``value`` is a positive number."""
    return rule_errors(POSITIVE, label, value, default=default)


def methods_errors(label: str, value: Any) -> list[CheckMessage]:
    """E004 unless ``value`` is a list of HTTP methods (not a string, which is letters)."""
    return rule_errors(METHOD_LIST, label, value)


def wait_errors(label: str, value: Any) -> list[CheckMessage]:
    """E013 unless ``value`` is a number of seconds of at least 0."""
    return rule_errors(WAIT_SECONDS, label, value)


def boolean_errors(label: str, value: Any) -> list[CheckMessage]:
    """E015 unless ``value`` is True or False: ``"False"`` would be true."""
    return rule_errors(BOOLEAN, label, value)


def _check_numbers() -> list[CheckMessage]:
    """E003: the heartbeat within the lease; W002: TTL at least LOCK_TIMEOUT (once both
    are valid: E002 says what is wrong with them otherwise)."""
    messages: list[CheckMessage] = []
    if value_errors("TTL") or value_errors("LOCK_TIMEOUT"):
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


def _check_headers() -> list[CheckMessage]:
    if value_errors("STORED_HEADERS") or value_errors("NEVER_STORED_HEADERS"):
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


def _check_hybrid_redis_ttl() -> list[CheckMessage]:
    """E061: HYBRID_REDIS_TTL not longer than TTL (a record in Redis would outlive the key
    it answers for)."""
    number = _number(_raw("HYBRID_REDIS_TTL"))
    if number is None or value_errors("HYBRID_REDIS_TTL"):
        return []  # None, or E060
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
    _check_values,
    _check_numbers,
    _check_headers,
    _check_hybrid_redis_ttl,
    _check_metrics,
]
