"""The checks of the URLconf's views: ``@idempotent`` around or inside DRF's ``@api_view``
(E020, E021), DRF views ``IdempotencyMiddleware`` cannot protect (E102, W101), and views
with steps under a ``STRATEGY`` that does not run them (E091). Each walks the URLconf once
with :func:`views`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import connections
from django.urls import URLPattern, URLResolver, get_resolver

from ..conf import conf
from ..decorators import EXEMPT_ATTR, HANDLED_ATTR, OPT_IN_ATTR, OptIn
from ..middleware import drf_view_class, view_options
from . import ID
from .middleware import PATH


def uses_mixin(cls: type) -> bool:
    """Whether the DRF view class ``cls`` handles the protocol itself (imports DRF)."""
    from ..mixins import IdempotencyMixin

    return issubclass(cls, IdempotencyMixin)


def views() -> list[tuple[str, Callable[..., Any]]]:
    """Every route of the URLconf and its view, or none when the URLconf does not load
    (Django's own checks report that)."""
    try:
        return list(_routes(get_resolver()))
    except Exception:  # a broken URLconf is reported by Django's own checks
        return []


def _routes(resolver: URLResolver, prefix: str = "") -> Iterator[tuple[str, Callable[..., Any]]]:
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern.callback


def is_idempotent(func: Any) -> bool:
    """Whether ``func``, or a function it wraps (``functools.wraps``), is ``@idempotent``'s
    wrapper (which carries ``HANDLED_ATTR``)."""
    seen = 0
    while func is not None and seen < 50:
        if getattr(func, HANDLED_ATTR, False):
            return True
        func, seen = getattr(func, "__wrapped__", None), seen + 1
    return False


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
    atomic = _atomic_key_databases()
    messages: list[CheckMessage] = []
    for route, callback in views():
        view_class = drf_view_class(callback)
        if view_class is None or uses_mixin(view_class):
            continue
        name = _view_class_name(view_class)
        if is_idempotent(callback):
            messages.append(_outside_api_view_error(name, route, callback))
        else:
            exempt = getattr(callback, "_non_atomic_requests", ())
            missing = [alias for alias in atomic if alias not in exempt]
            if missing and _idempotent_inside(view_class):
                messages.append(_atomic_requests_error(name, route, callback, missing[0]))
    return messages


def _atomic_key_databases() -> list[str]:
    """The key databases (``KEY_DATABASES``) with ``ATOMIC_REQUESTS`` on; an unknown alias
    is left to E005 and E035 of the settings' checks."""
    found = []
    for alias in conf.KEY_DATABASES:
        try:
            if connections[alias].settings_dict.get("ATOMIC_REQUESTS"):
                found.append(alias)
        except Exception:
            continue
    return found


def _idempotent_inside(view_class: type) -> bool:
    """Whether a handler of the ``@api_view`` class wraps an ``@idempotent`` function."""
    for method in getattr(view_class, "http_method_names", ()):
        handler = getattr(view_class, method, None)
        for cell in getattr(handler, "__closure__", None) or ():
            try:
                if is_idempotent(cell.cell_contents):
                    return True
            except ValueError:  # an empty cell
                continue
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


@register(Tags.urls)
def check_middleware(**kwargs: Any) -> list[CheckMessage]:
    """E102/W101: DRF views in the URLconf that ``IdempotencyMiddleware`` cannot protect
    (:mod:`.middleware` has the settings' checks)."""
    if PATH not in list(getattr(settings, "MIDDLEWARE", None) or []):
        return []
    messages: list[CheckMessage] = []
    for route, callback in views():
        cls = drf_view_class(callback)
        if cls is None or uses_mixin(cls) or getattr(callback, EXEMPT_ATTR, False):
            continue
        message = _unprotected_drf_view(f"{cls.__module__}.{cls.__qualname__}", route, callback)
        if message is not None:
            messages.append(message)
    return messages


def _unprotected_drf_view(name: str, route: str, callback: Any) -> CheckMessage | None:
    hint = (
        "DRF authenticates inside the view, after every middleware, so the middleware "
        "never handles DRF views. Put IdempotencyMixin before APIView in the view's "
        "bases, or mark the view @idempotency_exempt."
    )
    cls = drf_view_class(callback)
    if isinstance(getattr(callback, OPT_IN_ATTR, None), OptIn):
        return Error(
            f"The DRF view {name} ({route!r}) is marked @idempotency_opt_in; "
            "IdempotencyMiddleware does not protect it.",
            hint=hint,
            obj=cls,
            id=ID + "E102",
        )
    if conf.MIDDLEWARE_DEFAULT == "all":
        return Warning(
            f"The DRF view {name} ({route!r}) is not protected: "
            'MIDDLEWARE_DEFAULT = "all" does not cover DRF views.',
            hint=hint,
            obj=cls,
            id=ID + "W101",
        )
    return None


@register(Tags.urls)
def check_steps_under_the_setting(**kwargs: Any) -> list[CheckMessage]:
    """E091: a view of the URLconf declares ``steps=True`` without a strategy of its own
    while the ``STRATEGY`` setting names one that does not run steps (``redis``,
    ``hybrid``, a project's): every request of the view would be answered 503. (A view's
    own strategy is checked when it is declared, E090.)"""
    from ..strategies import load_strategy
    from ..strategies.stepped import STEP_STRATEGIES, stepped

    name = conf.STRATEGY
    try:
        if stepped(load_strategy(name)) is not None:
            return []
    except Exception:  # an unknown strategy: E006 says why
        return []
    messages: list[CheckMessage] = []
    for route, callback in views():
        steps, strategy = declared_steps(callback)
        if steps is True and strategy is None:
            messages.append(
                Error(
                    f"The view of URL {route!r} declares steps=True and runs under the "
                    f"STRATEGY setting, {name!r}, which does not run a view in steps: "
                    "every request of it is answered 503 store-unavailable.",
                    hint=(
                        f"Set IDEMPOTENCY['STRATEGY'] to one of {', '.join(STEP_STRATEGIES)}, "
                        "or give the view a strategy of its own (strategy=..., "
                        "idempotency_strategy); see docs/steps.md."
                    ),
                    obj=callback,
                    id=ID + "E091",
                )
            )
    return messages


def declared_steps(callback: Any) -> tuple[Any, Any]:
    """``(steps, strategy)`` as the view ``callback`` declares them
    (:func:`~django_idempotency.middleware.view_options`); ``(None, None)`` for a view that
    declares neither."""
    options = view_options(callback)
    return (None, None) if options is None else (options.steps, options.strategy)
