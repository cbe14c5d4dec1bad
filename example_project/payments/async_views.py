"""Views of the example API for ASGI (``example_project.asgi``).

``async_charge`` is an ``async def`` view under ``@idempotent``; ``middleware_charge`` is
the same view protected by ``IdempotencyMiddleware`` instead (``EXAMPLE_MIDDLEWARE=1``,
which also installs ``token_auth_middleware`` so that the middleware sees token users), and
``middleware_sync_charge`` a plain sync view protected by the middleware, which Django
runs in a thread under ASGI. All take ``{"amount": n, "currency": "EUR"}`` and write one
Charge per execution.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import sync_and_async_middleware
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from django_idempotency.decorators import idempotency_opt_in, idempotent

from . import psp
from .models import Charge

AsyncView = Callable[..., Awaitable[HttpResponse]]


def _authenticate(request: HttpRequest) -> bool:
    """Set ``request.user`` from a DRF API token, when the request carries a valid one;
    whether the request is authenticated. Runs in a thread: it also loads the session
    user, so that async code can read ``request.user`` without a query."""
    try:
        found = TokenAuthentication().authenticate(request)  # type: ignore[arg-type]
    except exceptions.AuthenticationFailed:
        found = None
    if found is not None:
        request.user = found[0]
    return bool(request.user.is_authenticated)


@sync_and_async_middleware
def token_auth_middleware(get_response: Callable[[HttpRequest], Any]) -> Any:
    """Authenticate API tokens before the view middleware runs (after
    AuthenticationMiddleware), so that plain views and IdempotencyMiddleware see the user."""
    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> Any:
            await sync_to_async(_authenticate)(request)
            return await get_response(request)

        return async_middleware

    def middleware(request: HttpRequest) -> Any:
        _authenticate(request)
        return get_response(request)

    return middleware


def async_api_user_required(view: AsyncView) -> AsyncView:
    """Accept the API tokens of the DRF views (or a session) on an async view."""

    @wraps(view)
    async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not await sync_to_async(_authenticate)(request):
            return JsonResponse(
                {"detail": "Authentication credentials were not provided."}, status=401
            )
        return await view(request, *args, **kwargs)

    return wrapper


def _payload(request: HttpRequest) -> tuple[dict[str, Any], int, str] | None:
    """The JSON body, its amount and its currency; None when it is not a charge."""
    try:
        payload = json.loads(request.body or b"{}")
        return payload, int(payload["amount"]), str(payload["currency"]).upper()
    except (ValueError, KeyError, TypeError):
        return None


BAD_CHARGE = {"detail": 'Send {"amount": <int>, "currency": "EUR"}.'}


def _charged(charge: Charge) -> JsonResponse:
    return JsonResponse(
        {
            "id": charge.pk,
            "amount": charge.amount,
            "currency": charge.currency,
            "psp_reference": charge.psp_reference,
        },
        status=201,
    )


async def _charge(request: HttpRequest) -> JsonResponse:
    parsed = _payload(request)
    if parsed is None:
        return JsonResponse(BAD_CHARGE, status=400)
    payload, amount, currency = parsed
    delay = settings.PSP_DELAY_MS / 1000
    if delay:
        await asyncio.sleep(delay)  # the payment provider, awaited
    user = request.user  # loaded by _authenticate
    reference = "psp_" + request.idempotency.downstream_key("psp")[:24]  # type: ignore[attr-defined]
    charge = await Charge.objects.acreate(
        user=user, amount=amount, currency=currency, psp_reference=reference
    )
    if payload.get("fail_after_write"):  # the tests' way to fail after the write
        raise RuntimeError("the view failed after its write")
    return _charged(charge)


@csrf_exempt
@require_POST
@async_api_user_required
@idempotent(required=True)
async def async_charge(request: HttpRequest) -> JsonResponse:
    """POST charges the caller; an ``async def`` view under ``@idempotent``."""
    return await _charge(request)


@csrf_exempt
@require_POST
@idempotency_opt_in(required=True)
async def middleware_charge(request: HttpRequest) -> JsonResponse:
    """POST charges the caller; protected by IdempotencyMiddleware (when installed)."""
    if not request.user.is_authenticated:  # loaded by token_auth_middleware
        return JsonResponse({"detail": "Authentication credentials were not provided."}, status=401)
    return await _charge(request)


@csrf_exempt
@require_POST
@idempotency_opt_in(required=True)
def middleware_sync_charge(request: HttpRequest) -> JsonResponse:
    """POST charges the caller; a sync view protected by IdempotencyMiddleware (when
    installed), through the payment provider (``psp``, which takes ``PSP_DELAY_MS``)."""
    if not request.user.is_authenticated:  # loaded by token_auth_middleware
        return JsonResponse({"detail": "Authentication credentials were not provided."}, status=401)
    parsed = _payload(request)
    if parsed is None:
        return JsonResponse(BAD_CHARGE, status=400)
    payload, amount, currency = parsed
    reference = psp.charge(
        amount,
        currency,
        idempotency_key=request.idempotency.downstream_key("psp"),  # type: ignore[attr-defined]
    )
    charge = Charge.objects.create(
        user=request.user, amount=amount, currency=currency, psp_reference=reference
    )
    if payload.get("fail_after_write"):  # the tests' way to fail after the write
        raise RuntimeError("the view failed after its write")
    return _charged(charge)
