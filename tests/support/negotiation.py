"""Views that answer in more than one representation, one per entry point, for the
content-negotiation and Content-Language tests (``tests/protocol/test_negotiation.py``).

Use with ``@pytest.mark.urls("tests.support.negotiation")``. Every view writes one
SideEffect row per execution and puts the active language into its body, so a test sees
both how often the view ran and in which language a replayed body was produced.

* ``/neg/drf-class/``, ``/neg/drf-function/`` (``@idempotent_api_view``) and
  ``/neg/drf-below/`` (``@idempotent`` below ``@api_view``) are DRF views rendering JSON or
  the browsable API (HTML) by ``Accept`` and ``?format=``;
* ``/neg/plain/`` (``@idempotent``), ``/neg/async/`` (``@idempotent`` on an ``async def``
  view) and ``/neg/middleware/`` (``@idempotency_opt_in``, for ``IdempotencyMiddleware``)
  are plain views that pick HTML or JSON by ``Accept`` themselves,
  or answer the media type the body's ``"as"`` names: ``"problem"`` (a 409
  ``application/problem+json``), ``"vnd"`` (``application/vnd.api+json``), ``"empty"`` (a
  204 without a Content-Type), ``"empty-typed"`` (a 204 with Django's ``text/html``), or
  any media type. ``"content_language"`` in the body is sent as the JSON answer's
  ``Content-Language``.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils.translation import get_language
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view, permission_classes, renderer_classes
from rest_framework.permissions import AllowAny
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.decorators import idempotency_opt_in, idempotent
from django_idempotency.drf import idempotent_api_view
from django_idempotency.mixins import IdempotencyMixin

from ..testapp.models import SideEffect

RENDERERS = [JSONRenderer, BrowsableAPIRenderer]


def _charge(label: str) -> dict[str, Any]:
    """One execution: a SideEffect row, and the body that says which and in what language."""
    SideEffect.objects.create(label=label)
    return {"charge": SideEffect.objects.filter(label=label).count(), "language": get_language()}


class ChargeView(IdempotencyMixin, APIView):
    permission_classes = [AllowAny]
    renderer_classes = RENDERERS

    def post(self, request: Request) -> Response:
        return Response(_charge("neg-drf-class"), status=201)


@idempotent_api_view(["POST"])
@renderer_classes(RENDERERS)
@permission_classes([AllowAny])
def charge_function(request: Request) -> Response:
    return Response(_charge("neg-drf-function"), status=201)


@api_view(["POST"])
@renderer_classes(RENDERERS)
@permission_classes([AllowAny])
@idempotent
def charge_below(request: Request) -> Response:
    return Response(_charge("neg-drf-below"), status=201)


#: What the plain views answer for a body's ``"as"``: (status, media type).
SHAPES = {
    "problem": (409, "application/problem+json"),
    "vnd": (201, "application/vnd.api+json"),
}


def _plain(request: HttpRequest, label: str) -> HttpResponse:
    payload = json.loads(request.body or b"{}")
    body = _charge(label)
    shape = payload.get("as")
    if shape in ("empty", "empty-typed"):
        response = HttpResponse(status=204)  # Django gives it a Content-Type: text/html
        if shape == "empty":
            del response["Content-Type"]
        return response
    if shape is not None:
        status, media_type = SHAPES.get(shape, (201, shape))
        return HttpResponse(json.dumps(body), status=status, content_type=media_type)
    if request.get_preferred_type(["application/json", "text/html"]) == "text/html":
        return HttpResponse(f"<p>charge {body['charge']} ({body['language']})</p>", status=201)
    response = JsonResponse(body, status=201)
    if payload.get("content_language"):
        response["Content-Language"] = payload["content_language"]
    return response


@csrf_exempt
@idempotent
def charge_plain(request: HttpRequest) -> HttpResponse:
    return _plain(request, "neg-plain")


@csrf_exempt
@idempotency_opt_in
def charge_middleware(request: HttpRequest) -> HttpResponse:
    return _plain(request, "neg-middleware")


@csrf_exempt
@idempotent
async def charge_async(request: HttpRequest) -> HttpResponse:
    """``@idempotent`` on an ``async def`` view; its ORM work in the session's thread."""
    response: HttpResponse = await sync_to_async(_plain)(request, "neg-async")
    return response


urlpatterns = [
    path("neg/drf-class/", ChargeView.as_view()),
    path("neg/drf-function/", charge_function),
    path("neg/drf-below/", charge_below),
    path("neg/plain/", charge_plain),
    path("neg/middleware/", charge_middleware),
    path("neg/async/", charge_async),
]
