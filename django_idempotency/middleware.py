"""``IdempotencyMiddleware``: the Idempotency-Key protocol for views that opt in, or for
every view (``IDEMPOTENCY["MIDDLEWARE_DEFAULT"] = "all"``), on sync and async stacks.

The middleware does its work in ``process_view``: for a view it protects, it runs the
view itself inside the claim's session (the way ``@idempotent`` does) and returns the
response, so Django does not call the view a second time. That is why it goes last in
``MIDDLEWARE``: a ``process_view`` hook listed after it (``CsrfViewMiddleware``'s, say)
would not run for the views it protects; check E103 says so.

It never handles:

* a view marked ``@idempotency_exempt``;
* a view that handles the protocol itself (``@idempotent``);
* a Django REST framework view. DRF authenticates inside the view, after every
  middleware, so a middleware sees a token user as anonymous. DRF class views use
  ``IdempotencyMixin``; check W101 lists DRF views the middleware would otherwise cover,
  and E102 those opted in with ``@idempotency_opt_in``.

The scope is the engine's ``default_scope`` (or the view's ``scope=``), computed from the
``request.user`` that the authentication middleware listed before this one has set.
See docs/middleware.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from .conf import conf
from .decorators import EXEMPT_ATTR, HANDLED_ATTR, OPT_IN_ATTR, OPTIONS_ATTR, OptIn
from .protocol.engine import ahandle, handle, takes_part
from .protocol.options import Options
from .protocol.scope import default_scope

GetResponse = Callable[[HttpRequest], Any]


def drf_view_class(view_func: Callable[..., Any]) -> type | None:
    """The DRF ``APIView`` subclass behind ``view_func`` (``as_view()``, ``@api_view``),
    or None (not a DRF view, or DRF is not installed)."""
    cls = getattr(view_func, "cls", None) or getattr(view_func, "view_class", None)
    if not isinstance(cls, type):
        return None
    try:
        from rest_framework.views import APIView
    except ImportError:  # pragma: no cover - DRF is an optional dependency
        return None
    return cls if issubclass(cls, APIView) else None


def view_options(callback: Callable[..., Any]) -> Options | None:
    """The options the view ``callback`` declares: ``@idempotent``'s (around it, or a
    function it wraps), ``@idempotency_opt_in``'s, or an ``IdempotencyMixin`` view's (its
    ``as_view()`` keywords, else its class's); None for a view that declares none."""
    func: Any = callback
    seen = 0
    while func is not None and seen < 50:
        options = getattr(func, OPTIONS_ATTR, None)
        if options is None and isinstance(getattr(func, OPT_IN_ATTR, None), OptIn):
            options = getattr(func, OPT_IN_ATTR).options
        if isinstance(options, Options):
            return options
        func, seen = getattr(func, "__wrapped__", None), seen + 1
    cls = drf_view_class(callback)
    if cls is None:
        return None
    from .mixins import IdempotencyMixin, declared_options  # DRF is loaded: the view is DRF's

    if not issubclass(cls, IdempotencyMixin):
        return None
    return Options(**declared_options(cls, getattr(callback, "view_initkwargs", None) or {}))


def protection(view_func: Callable[..., Any]) -> OptIn | None:
    """What the middleware does for ``view_func``: an :class:`OptIn` (protect it with
    these options and scope) or None (leave it alone)."""
    conf.ensure_valid()
    if getattr(view_func, EXEMPT_ATTR, False) or getattr(view_func, HANDLED_ATTR, False):
        return None
    if drf_view_class(view_func) is not None:
        return None
    opt_in = getattr(view_func, OPT_IN_ATTR, None)
    if isinstance(opt_in, OptIn):
        return opt_in
    if conf.MIDDLEWARE_DEFAULT == "all":
        return OptIn(Options(), default_scope)
    return None


class IdempotencyMiddleware:
    """Runs the views it protects under the Idempotency-Key protocol; sync and async."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
            # Django calls a coroutine ``process_view`` as it is on an async stack: a
            # request that does not take part costs no thread hop.
            self.process_view = self._aprocess_view  # type: ignore[method-assign,assignment]

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        return await self.get_response(request)

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: Sequence[Any],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        opt_in = protection(view_func)
        if opt_in is None or not takes_part(request, opt_in.options, opt_in.key):
            return None
        # An async view on a sync stack: Django would run it with async_to_sync too.
        call = async_to_sync(view_func) if iscoroutinefunction(view_func) else view_func
        return _handled(opt_in, request, call, view_args, view_kwargs)

    async def _aprocess_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: Sequence[Any],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        opt_in = protection(view_func)
        if opt_in is None or not takes_part(request, opt_in.options, opt_in.key):
            return None
        if iscoroutinefunction(view_func):
            return await ahandle(
                request,
                lambda: view_func(request, *view_args, **view_kwargs),
                scope=opt_in.scope,
                options=opt_in.options,
                key=opt_in.key,
            )

        # A sync view on an async stack: the lifecycle and the view in one thread, as Django
        # runs sync views (``sync_to_async``, thread-sensitive).
        return await sync_to_async(_handled, thread_sensitive=True)(
            opt_in, request, view_func, view_args, view_kwargs
        )


def _handled(
    opt_in: OptIn,
    request: HttpRequest,
    view_func: Callable[..., Any],
    view_args: Sequence[Any],
    view_kwargs: dict[str, Any],
) -> HttpResponseBase:
    """The sync view ``view_func`` run under the protocol, as ``opt_in`` declares it."""
    return handle(
        request,
        lambda: view_func(request, *view_args, **view_kwargs),
        scope=opt_in.scope,
        options=opt_in.options,
        key=opt_in.key,
    )
