"""``@idempotent`` for plain Django function views, sync or async, and the per-view
``@idempotency_opt_in`` / ``@idempotency_exempt`` marks that ``IdempotencyMiddleware`` reads."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, Unpack, overload

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from .conf import conf
from .protocol.engine import ahandle, handle
from .protocol.keysource import KeyFunc
from .protocol.options import Options, ViewOptions
from .protocol.scope import default_scope
from .protocol.shards import non_atomic

ViewFunc = TypeVar("ViewFunc", bound=Callable[..., Any])

#: Set on a view that handles the protocol itself (``@idempotent``), so that
#: ``IdempotencyMiddleware`` leaves it alone instead of claiming its key a second time.
HANDLED_ATTR = "idempotency_handled"
#: Set by ``@idempotency_opt_in``: an :class:`OptIn` for the middleware.
OPT_IN_ATTR = "idempotency_opt_in"
#: Set by ``@idempotency_exempt``: the middleware never handles the view.
EXEMPT_ATTR = "idempotency_exempt"
#: Set on ``@idempotent``'s wrapper: the :class:`Options` it declares (for the checks).
OPTIONS_ATTR = "idempotency_options"


@overload
def idempotent(view: ViewFunc) -> ViewFunc: ...


@overload
def idempotent(
    view: None = None,
    *,
    scope: Callable[[HttpRequest], str] | None = None,
    key: KeyFunc | None = None,
    **options: Unpack[ViewOptions],
) -> Callable[[ViewFunc], ViewFunc]: ...


def idempotent(
    view: Any = None,
    *,
    scope: Callable[[HttpRequest], str] | None = None,
    key: KeyFunc | None = None,
    **options: Unpack[ViewOptions],
) -> Any:
    """Honour the Idempotency-Key header on a function view.

    ``@idempotent`` or ``@idempotent(required=True, methods=["POST"], ttl=3600)``;
    ``scope`` is a ``(request) -> str`` callable (default: the user); ``key`` a
    ``(request) -> str | None`` callable that finds the key where the client sends it
    (default: the ``HEADER`` header, or the ``KEY_BODY_FIELD`` of a JSON body); ``wait`` the
    seconds a duplicate waits for the first request's answer (default: ``IDEMPOTENCY["WAIT"]``).
    The view is exempt from ``ATOMIC_REQUESTS``: the app runs it in its own
    transaction, which also stores the response.

    An ``async def`` view stays async; its claim and completion run in a
    ``sync_to_async`` thread, the view itself on the event loop (docs/async.md).

    Below DRF's ``@api_view`` the view is called with DRF's authenticated ``Request``;
    its answer is then finalized as DRF's ``dispatch()`` would (:func:`as_drf_answers`)
    before it is stored. ``@idempotent_api_view`` is the form for new DRF function views.
    """
    declared = Options.declared("@idempotent", **options)
    scope_func = scope or default_scope
    check_key_hook("@idempotent", key)

    def decorate(func: ViewFunc) -> ViewFunc:
        # An option the checks call an error stops the import of the view's module.
        conf.validate_view(func, **declared.as_dict())
        wrapper: Callable[..., Any]
        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(
                request: HttpRequest, *args: Any, **kwargs: Any
            ) -> HttpResponseBase:
                return await ahandle(
                    request,
                    lambda: func(request, *args, **kwargs),
                    scope=scope_func,
                    options=declared,
                    key=key,
                )

            wrapper = async_wrapper
        else:

            @functools.wraps(func)
            def sync_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
                drf_view = drf_view_of(request)
                if drf_view is None:
                    view = functools.partial(func, request, *args, **kwargs)
                else:
                    view = functools.partial(as_drf_answers, drf_view, func, request, args, kwargs)
                return handle(request, view, scope=scope_func, options=declared, key=key)

            wrapper = sync_wrapper
        setattr(wrapper, HANDLED_ATTR, True)
        setattr(wrapper, OPTIONS_ATTR, declared)
        return non_atomic(wrapper)  # type: ignore[return-value]

    if view is not None:
        return decorate(view)
    return decorate


def drf_view_of(request: HttpRequest) -> Any:
    """The DRF ``APIView`` handling ``request`` when it is DRF's ``Request`` (``@idempotent``
    below DRF's ``@api_view``: the handler is called with DRF's request, authenticated,
    permitted and throttled), else None. DRF is not imported for this: a request can only
    be DRF's when DRF is loaded."""
    module = sys.modules.get("rest_framework.request")
    if module is None or not isinstance(request, module.Request):
        return None
    view = (getattr(request, "parser_context", None) or {}).get("view")
    return view if hasattr(view, "finalize_response") else None


def as_drf_answers(
    view: Any,
    func: Callable[..., Any],
    request: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> HttpResponseBase:
    """Call the view function below ``@api_view`` and return what DRF's ``dispatch()``
    will send, so that it is what gets stored: an ``APIException`` becomes DRF's error
    response (``handle_exception``; any other exception propagates, and the key is given
    back), and the response gets its renderer, media type, renderer context and the
    view's headers (``finalize_response``), so that it can be rendered now. DRF finalizes
    it once more after the handler returns, which changes nothing."""
    try:
        response = func(request, *args, **kwargs)
    except Exception as exc:
        response = view.handle_exception(exc)
    finalized: HttpResponseBase = view.finalize_response(request, response, *args, **kwargs)
    return finalized


def check_key_hook(where: str, key: object) -> None:
    """``TypeError`` (naming ``where``) unless ``key`` is None or a callable: a view must not
    be served with a key hook that fails every request."""
    if key is not None and not callable(key):
        raise TypeError(f"{where}: key must be a callable (request) -> str | None, not {key!r}.")


@dataclass(frozen=True)
class OptIn:
    """What ``@idempotency_opt_in`` asked for: the view's options, scope and key hook."""

    options: Options
    scope: Callable[[HttpRequest], str] = default_scope
    key: KeyFunc | None = None


@overload
def idempotency_opt_in(view: ViewFunc) -> ViewFunc: ...


@overload
def idempotency_opt_in(
    view: None = None,
    *,
    scope: Callable[[HttpRequest], str] | None = None,
    key: KeyFunc | None = None,
    **options: Unpack[ViewOptions],
) -> Callable[[ViewFunc], ViewFunc]: ...


def idempotency_opt_in(
    view: Any = None,
    *,
    scope: Callable[[HttpRequest], str] | None = None,
    key: KeyFunc | None = None,
    **options: Unpack[ViewOptions],
) -> Any:
    """Have ``IdempotencyMiddleware`` protect this view, with the same options (and ``scope``
    and ``key``) as ``@idempotent``. The view function is returned as it is (sync or async),
    with an attribute the middleware reads; it does nothing without the middleware."""
    check_key_hook("@idempotency_opt_in", key)
    opt_in = OptIn(Options.declared("@idempotency_opt_in", **options), scope or default_scope, key)
    if opt_in.options.completer:
        raise TypeError(
            "@idempotency_opt_in: completer=True is for @idempotent, @idempotent_api_view and "
            "IdempotencyMixin views: the completer sends a request to its view without the "
            "project's middleware, which would leave this one unprotected."
        )

    def decorate(func: ViewFunc) -> ViewFunc:
        conf.validate_view(func, **opt_in.options.as_dict())
        setattr(func, OPT_IN_ATTR, opt_in)
        return func

    if view is not None:
        return decorate(view)
    return decorate


def idempotency_exempt(view: ViewFunc) -> ViewFunc:
    """Keep ``IdempotencyMiddleware`` away from this view, also with
    ``MIDDLEWARE_DEFAULT = "all"``. The view function is returned as it is."""
    setattr(view, EXEMPT_ATTR, True)
    return view
