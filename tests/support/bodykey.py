"""Views for the key-in-the-body tests (``tests/protocol/test_keysource.py``), one per entry
point, each in two forms: reading the key where the settings say (the header,
``KEY_BODY_FIELD``) and with a key hook of its own, which finds it at ``meta.request_id`` in
the JSON body (parsed by the view's framework: DRF's ``request.data`` on DRF views).

Use with ``@pytest.mark.urls("tests.support.bodykey")``. Every view writes one SideEffect row
per execution, labelled ``bk-<entry>`` (``bk-hook-<entry>``), and answers 201 with the JSON
it was sent and the key it ran under. A body with ``"hold": true`` holds the view inside its
claim until :data:`held` is released (``held.opened``), after signalling ``held.entered``.

* ``drf-class``: ``IdempotencyMixin`` (the hook: ``get_idempotency_key``);
* ``drf-function``: ``@idempotent_api_view`` (``key=``);
* ``drf-below``: ``@idempotent`` below ``@api_view`` (``key=``);
* ``plain``, ``async``: ``@idempotent`` on a sync and on an ``async def`` view (``key=``);
* ``middleware``: ``@idempotency_opt_in`` (``key=``) for ``IdempotencyMiddleware``.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.decorators import idempotency_opt_in, idempotent
from django_idempotency.drf import idempotent_api_view
from django_idempotency.mixins import IdempotencyMixin

from ..testapp.models import SideEffect
from .gates import Gate

held = Gate()


def _run(label: str, data: Any, request: Any) -> dict[str, Any]:
    """One execution: hold when asked to, write the row, say what ran."""
    if isinstance(data, dict) and data.get("hold") is True:
        held.pass_through()
    SideEffect.objects.create(label=label)
    idem = getattr(request, "idempotency", None)
    return {"sent": data, "key": idem and idem.key, "runs": SideEffect.objects.count()}


def _json(request: HttpRequest) -> Any:
    try:
        return json.loads(request.body or b"null")
    except ValueError:
        return None


def meta_request_id(request: Any) -> Any:
    """The hook: the key at ``meta.request_id`` of the body; DRF's parsed data on a DRF
    request, the raw body's JSON on Django's."""
    data = request.data if isinstance(request, Request) else _json(request)
    meta = data.get("meta") if isinstance(data, dict) else None
    return meta.get("request_id") if isinstance(meta, dict) else None


class ChargeView(IdempotencyMixin, APIView):
    permission_classes = [AllowAny]
    label = "bk-drf-class"

    def post(self, request: Request) -> Response:
        return Response(_run(self.label, request.data, request), status=201)


class HookChargeView(ChargeView):
    label = "bk-hook-drf-class"

    def get_idempotency_key(self, request: Request) -> Any:
        return meta_request_id(request)


def _below(label: str, key: Any = None) -> Any:
    def view(request: Request) -> Response:
        return Response(_run(label, request.data, request), status=201)

    view.__name__ = view.__qualname__ = label.replace("-", "_")
    return api_view(["POST"])(permission_classes([AllowAny])(idempotent(key=key)(view)))


def _function(label: str, key: Any = None) -> Any:
    def view(request: Request) -> Response:
        return Response(_run(label, request.data, request), status=201)

    view.__name__ = view.__qualname__ = label.replace("-", "_")
    return idempotent_api_view(["POST"], key=key)(permission_classes([AllowAny])(view))


def _plain(label: str, key: Any = None) -> Any:
    def view(request: HttpRequest) -> JsonResponse:
        return JsonResponse(_run(label, _json(request), request), status=201)

    view.__name__ = view.__qualname__ = label.replace("-", "_")
    return csrf_exempt(idempotent(key=key)(view))


def _async(label: str, key: Any = None) -> Any:
    async def view(request: HttpRequest) -> JsonResponse:
        body = await sync_to_async(_run)(label, _json(request), request)
        return JsonResponse(body, status=201)

    view.__name__ = view.__qualname__ = label.replace("-", "_")
    return csrf_exempt(idempotent(key=key)(view))


def _middleware(label: str, key: Any = None) -> Any:
    def view(request: HttpRequest) -> JsonResponse:
        return JsonResponse(_run(label, _json(request), request), status=201)

    view.__name__ = view.__qualname__ = label.replace("-", "_")
    return csrf_exempt(idempotency_opt_in(key=key)(view))


def _views(prefix: str, key: Any) -> list[Any]:
    label = "bk-hook-" if key is not None else "bk-"
    return [
        path(f"{prefix}/drf-function/", _function(label + "drf-function", key)),
        path(f"{prefix}/drf-below/", _below(label + "drf-below", key)),
        path(f"{prefix}/plain/", _plain(label + "plain", key)),
        path(f"{prefix}/async/", _async(label + "async", key)),
        path(f"{prefix}/middleware/", _middleware(label + "middleware", key)),
    ]


urlpatterns = [
    path("bk/drf-class/", ChargeView.as_view()),
    path("bk-hook/drf-class/", HookChargeView.as_view()),
    *_views("bk", None),
    *_views("bk-hook", meta_request_id),
]
