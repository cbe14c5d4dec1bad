"""``@idempotent`` for plain Django function views."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from django.db import transaction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from .conf import conf
from .engine import Options, default_scope, handle

ViewFunc = TypeVar("ViewFunc", bound=Callable[..., HttpResponseBase])


@overload
def idempotent(view: ViewFunc) -> ViewFunc: ...


@overload
def idempotent(
    view: None = None,
    *,
    methods: Iterable[str] | None = None,
    required: bool | None = None,
    ttl: float | None = None,
    lock_timeout: float | None = None,
    scope: Callable[[HttpRequest], str] | None = None,
    strategy: str | None = None,
    wait: float | None = None,
) -> Callable[[ViewFunc], ViewFunc]: ...


def idempotent(
    view: Any = None,
    *,
    methods: Iterable[str] | None = None,
    required: bool | None = None,
    ttl: float | None = None,
    lock_timeout: float | None = None,
    scope: Callable[[HttpRequest], str] | None = None,
    strategy: str | None = None,
    wait: float | None = None,
) -> Any:
    """Honour the Idempotency-Key header on a function view.

    ``@idempotent`` or ``@idempotent(required=True, methods=["POST"], ttl=3600)``;
    ``scope`` is a ``(request) -> str`` callable (default: the user); ``wait`` the seconds
    a duplicate waits for the first request's answer (default: ``IDEMPOTENCY["WAIT"]``).
    The view is exempt from ``ATOMIC_REQUESTS``: the app runs it in its own
    transaction, which also stores the response.
    """
    options = Options(
        methods=methods,
        required=required,
        ttl=ttl,
        lock_timeout=lock_timeout,
        strategy=strategy,
        wait=wait,
    )
    scope_func = scope or default_scope

    def decorate(func: ViewFunc) -> ViewFunc:
        @functools.wraps(func)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return handle(
                request,
                lambda: func(request, *args, **kwargs),
                scope=scope_func,
                options=options,
            )

        return transaction.non_atomic_requests(using=conf.DATABASE)(wrapper)  # type: ignore[return-value]

    if view is not None:
        return decorate(view)
    return decorate
