"""The settings as a whole: every validator of ``settings.IDEMPOTENCY`` behind the system
check and the start-up enforcement, and the checks of a view's own options.

``validate_settings()`` is pure (it reads the settings, never connects); ``ensure_valid()``
raises ``InvalidConfiguration`` with the checks' messages, once per settings, in every
process (``AppConfig.ready()``) and on first use after a setting changed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.exceptions import ImproperlyConfigured

from ..conf import DEFAULTS, conf, validate_with
from ..errors import STRATEGY_HINT
from . import ID, middleware, partitions, raise_errors, routing, stores, values
from .stores import strategy_errors
from .values import boolean_errors, methods_errors, positive_errors, wait_errors


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


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return validate_settings()


def ensure_valid() -> None:
    """Raise ``InvalidConfiguration`` (an ``ImproperlyConfigured``, with the system
    checks' messages) when the current settings have an error; once per settings.

    ``AppConfig.ready()`` validates at start-up, in every process; the request path
    and the tasks call this on first use, so a setting changed later
    (``override_settings``, ``setting_changed``) is validated before it is used too.
    Valid settings cost one dictionary lookup here (``conf.ensure_valid()``, which the
    adapters call, runs :func:`enforce_settings`)."""
    conf.ensure_valid()


def enforce_settings() -> None:
    """Raise ``InvalidConfiguration`` when the settings have an error (start-up, first use)."""
    raise_errors(validate_settings())


#: The settings' validators, one per concern, in the order their messages are listed:
#: each takes no argument, reads ``settings`` and ``conf`` (never connecting, never
#: resolving URLs) and returns its messages. ``check_settings`` lists them and
#: ``enforce_settings`` raises their errors, so a new setting's check goes here once.
SETTINGS_VALIDATORS: list[Callable[[], list[CheckMessage]]] = [
    *values.VALIDATORS,
    *stores.VALIDATORS,
    *partitions.VALIDATORS,
    *middleware.VALIDATORS,
    *routing.VALIDATORS,
]


def view_option_errors(
    where: str,
    *,
    methods: Any = None,
    required: Any = None,
    ttl: Any = None,
    lock_timeout: Any = None,
    strategy: Any = None,
    wait: Any = None,
    steps: Any = None,
    completer: Any = None,
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
    if steps is not None:
        messages += boolean_errors(f"{where}: steps", steps)
        if steps is True and strategy is not None:
            messages += _steps_strategy_errors(where, strategy)
    if completer is not None:
        messages += boolean_errors(f"{where}: completer", completer)
        if completer is True and steps is not True:
            messages.append(
                Error(
                    f"{where}: completer=True, but the view does not run in steps.",
                    hint=(
                        "The completer resumes a request from its recovery point: declare "
                        "steps=True as well, or drop completer=True; see docs/steps.md."
                    ),
                    id=ID + "E092",
                )
            )
    return messages


def _steps_strategy_errors(where: str, name: Any) -> list[CheckMessage]:
    """E090 for a view with steps that declares a strategy that does not run them; only
    once the app registry is ready, as for E006. (Under the setting's strategy, which may
    change after the view is declared, its requests are answered 503.)"""
    from django.apps import apps

    if not isinstance(name, str) or not apps.ready:
        return []
    from ..strategies import load_strategy
    from ..strategies.stepped import STEP_STRATEGIES, stepped

    try:
        runs_steps = stepped(load_strategy(name)) is not None
    except ImproperlyConfigured:
        return []  # E006 says why
    if runs_steps:
        return []
    return [
        Error(
            f"{where}: steps=True, but the strategy {name!r} does not run a view in steps.",
            hint=(
                f"Use one of {', '.join(STEP_STRATEGIES)} for this view (strategy=...), "
                "or drop steps=True; see docs/steps.md."
            ),
            id=ID + "E090",
        )
    ]


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


def _validate_view(view: Any, **options: Any) -> None:
    validate_view_options(view_name(view), **options)


# The adapters, the protocol and the tasks validate through ``conf``, never importing this
# package: the validators are handed over here, when the app's apps.py imports this module.
validate_with(enforce_settings, _validate_view)
