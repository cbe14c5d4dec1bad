"""``@idempotent_api_view`` for Django REST framework function views.

DRF's ``@api_view`` turns a function into an ``APIView`` subclass. ``@idempotent``
above it claims the key before DRF has authenticated the caller; below it, it works (it
finalizes DRF's response before storing it) but cannot exempt the view from
``ATOMIC_REQUESTS``, nor read the body before DRF's policy classes do.
``@idempotent_api_view`` builds the same view as ``@api_view`` with
:class:`~django_idempotency.mixins.IdempotencyMixin` in front, so the key is claimed after
authentication, permissions and throttling, and the response is stored as DRF renders
it::

    @idempotent_api_view(["POST"], required=True)
    @permission_classes([IsAuthenticated])
    def pay(request):
        ...

DRF's policy decorators (``@permission_classes``, ``@authentication_classes``,
``@throttle_classes``, ...) go below it, as they go below ``@api_view``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Unpack

from django.http import HttpRequest
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.views import APIView

from .decorators import check_key_hook
from .mixins import OPTION_PREFIX, IdempotencyMixin
from .protocol.keysource import KeyFunc
from .protocol.options import Options, ViewOptions

__all__ = ["idempotent_api_view"]


def idempotent_api_view(
    http_method_names: Sequence[str] | None = None,
    *,
    scope: Callable[[HttpRequest], str] | None = None,
    key: KeyFunc | None = None,
    **options: Unpack[ViewOptions],
) -> Callable[[Callable[..., Any]], Any]:
    """DRF's ``@api_view(http_method_names)`` with the Idempotency-Key protocol.

    ``http_method_names`` are the methods the view answers (default ``["GET"]``, as for
    ``@api_view``); ``methods`` those that honour the header (default
    ``IDEMPOTENCY["METHODS"]``). ``required``, ``ttl``, ``lock_timeout``, ``strategy`` and
    ``wait`` are ``@idempotent``'s; ``scope`` is a ``(request) -> str`` callable given DRF's
    authenticated request (default: the user), ``key`` a ``(request) -> str | None`` callable
    given the same request that finds the key (default: the header, or ``KEY_BODY_FIELD``),
    the view's ``get_idempotency_key``.
    """
    # A string would be split into letters by api_view's method loop.
    if isinstance(http_method_names, str):
        raise TypeError("idempotent_api_view expects a list of HTTP methods, not a string.")

    declared = Options.declared("@idempotent_api_view", **options)
    check_key_hook("@idempotent_api_view", key)

    def decorator(func: Callable[..., Any]) -> Any:
        base = api_view(list(http_method_names) if http_method_names is not None else None)(
            func
        ).cls
        attrs: dict[str, Any] = {
            "__doc__": func.__doc__,
            "__module__": func.__module__,
            "__qualname__": getattr(func, "__qualname__", func.__name__),
            **{OPTION_PREFIX + name: value for name, value in declared.as_dict().items()},
        }
        if scope is not None:
            scope_func = scope

            def get_idempotency_scope(self: IdempotencyMixin, request: Request) -> str:
                return scope_func(request)

            attrs["get_idempotency_scope"] = get_idempotency_scope
        if key is not None:
            key_func = key

            def get_idempotency_key(self: IdempotencyMixin, request: Request) -> Any:
                return key_func(request)

            attrs["get_idempotency_key"] = get_idempotency_key
        view_class: type[APIView] = type(base.__name__, (IdempotencyMixin, base), attrs)
        return view_class.as_view()

    return decorator
