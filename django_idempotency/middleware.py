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

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core import checks
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils.module_loading import import_string

from .conf import conf
from .decorators import EXEMPT_ATTR, HANDLED_ATTR, OPT_IN_ATTR, OptIn
from .protocol.engine import ahandle, handle, takes_part
from .protocol.options import Options
from .protocol.scope import default_scope

PATH = "django_idempotency.middleware.IdempotencyMiddleware"
#: The values of ``IDEMPOTENCY["MIDDLEWARE_DEFAULT"]``.
MIDDLEWARE_DEFAULTS = ("opt_in", "all")

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


def uses_mixin(cls: type) -> bool:
    from .mixins import IdempotencyMixin

    return issubclass(cls, IdempotencyMixin)


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
        return handle(
            request,
            lambda: call(request, *view_args, **view_kwargs),
            scope=opt_in.scope,
            options=opt_in.options,
            key=opt_in.key,
        )

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
        return await sync_to_async(self._run_sync, thread_sensitive=True)(
            request, view_func, view_args, view_kwargs, opt_in
        )

    @staticmethod
    def _run_sync(
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: Sequence[Any],
        view_kwargs: dict[str, Any],
        opt_in: OptIn,
    ) -> HttpResponseBase:
        return handle(
            request,
            lambda: view_func(request, *view_args, **view_kwargs),
            scope=opt_in.scope,
            options=opt_in.options,
            key=opt_in.key,
        )


# -- system checks ------------------------------------------------------------------------------


def _patterns(resolver: URLResolver, prefix: str = "") -> Iterator[tuple[str, Callable[..., Any]]]:
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            yield from _patterns(pattern, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern.callback


def validate_middleware_settings() -> list[checks.CheckMessage]:
    """E101: MIDDLEWARE_DEFAULT; E103/E104: the middleware's place in MIDDLEWARE. Settings
    only (the checks of ``settings.IDEMPOTENCY`` list these, and start-up enforces them)."""
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    if PATH not in middleware:
        return []
    messages: list[checks.CheckMessage] = []
    default = conf.MIDDLEWARE_DEFAULT
    if default not in MIDDLEWARE_DEFAULTS:
        messages.append(
            checks.Error(
                f'IDEMPOTENCY["MIDDLEWARE_DEFAULT"] is {default!r}.',
                hint=f"Use one of {', '.join(repr(v) for v in MIDDLEWARE_DEFAULTS)}.",
                id="django_idempotency.E101",
            )
        )
    position = middleware.index(PATH)
    auth = "django.contrib.auth.middleware.AuthenticationMiddleware"
    if auth in middleware and middleware.index(auth) > position:
        messages.append(
            checks.Error(
                "IdempotencyMiddleware is listed before AuthenticationMiddleware: every "
                "request would reach the claim as anonymous.",
                hint="Move IdempotencyMiddleware to the end of MIDDLEWARE.",
                id="django_idempotency.E104",
            )
        )
    for path in middleware[position + 1 :]:
        try:
            later = import_string(path)
        except ImportError:
            continue  # Django reports it when it loads the middleware
        if hasattr(later, "process_view"):
            messages.append(
                checks.Error(
                    f"{path} is listed after IdempotencyMiddleware and has a process_view "
                    "hook, which would not run for the views IdempotencyMiddleware "
                    "protects (it calls them itself).",
                    hint="Move IdempotencyMiddleware to the end of MIDDLEWARE.",
                    id="django_idempotency.E103",
                )
            )
    return messages


@checks.register(checks.Tags.urls)
def check_middleware(**kwargs: Any) -> list[checks.CheckMessage]:
    """E102/W101: DRF views in the URLconf (:func:`validate_middleware_settings` has the
    settings' checks)."""
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    if PATH not in middleware:
        return []
    messages: list[checks.CheckMessage] = []
    default = conf.MIDDLEWARE_DEFAULT
    try:
        patterns = list(_patterns(get_resolver()))
    except Exception:  # a broken URLconf is reported by Django's own checks
        return messages
    for route, callback in patterns:
        cls = drf_view_class(callback)
        if cls is None or uses_mixin(cls) or getattr(callback, EXEMPT_ATTR, False):
            continue
        name = f"{cls.__module__}.{cls.__qualname__}"
        hint = (
            "DRF authenticates inside the view, after every middleware, so the middleware "
            "never handles DRF views. Put IdempotencyMixin before APIView in the view's "
            "bases, or mark the view @idempotency_exempt."
        )
        if isinstance(getattr(callback, OPT_IN_ATTR, None), OptIn):
            messages.append(
                checks.Error(
                    f"The DRF view {name} ({route!r}) is marked @idempotency_opt_in; "
                    "IdempotencyMiddleware does not protect it.",
                    hint=hint,
                    obj=cls,
                    id="django_idempotency.E102",
                )
            )
        elif default == "all":
            messages.append(
                checks.Warning(
                    f"The DRF view {name} ({route!r}) is not protected: "
                    'MIDDLEWARE_DEFAULT = "all" does not cover DRF views.',
                    hint=hint,
                    obj=cls,
                    id="django_idempotency.W101",
                )
            )
    return messages
