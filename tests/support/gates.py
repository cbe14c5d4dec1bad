"""Views whose timing a test controls, for the engine's concurrency tests.

Use with ``@pytest.mark.urls("tests.support.gates")`` and the ``gate`` fixture of the test
module: a request to ``/gated/`` signals ``gate.entered`` and then waits until the
test calls ``gate.opened.set()``, before it writes its SideEffect row. ``/stolen/``
(and ``/stolen-drf/``) has its claim taken over, from another connection, while it runs.
"""

from __future__ import annotations

import threading
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.conf import conf
from django_idempotency.decorators import idempotent
from django_idempotency.mixins import IdempotencyMixin
from django_idempotency.models import IdempotencyKey
from django_idempotency.store.records import ClaimResult

from ..testapp.models import SideEffect
from .threads import in_background


class Gate:
    """Holds a view until the test opens it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.thefts: list[ClaimResult] = []

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def pass_through(self) -> None:
        self.entered.set()
        if not self.opened.wait(timeout=30):
            raise RuntimeError("the test never opened the gate")


gate = Gate()


def _created(label: str, request: HttpRequest) -> JsonResponse:
    SideEffect.objects.create(label=label)
    idem: Any = getattr(request, "idempotency", None)
    return JsonResponse(
        {
            "label": label,
            "n": SideEffect.objects.count(),
            "psp": idem and idem.downstream_key("psp"),
        },
        status=201,
    )


@csrf_exempt
@idempotent
def gated(request: HttpRequest) -> JsonResponse:
    # Waits *before* writing: on SQLite a written-to transaction holds the one write lock.
    gate.pass_through()
    return _created("gated", request)


@csrf_exempt
@idempotent(lock_timeout=0.3)
def gated_short_lock(request: HttpRequest) -> JsonResponse:
    gate.pass_through()
    return _created("gated", request)


def steal(scope: str, key: str, fingerprint: str) -> ClaimResult:
    """Take the claim over from another thread (so: another database connection),
    as a second worker would once the lease looked stale (lock_timeout=0)."""
    return in_background(
        lambda: IdempotencyKey.objects.claim(
            scope, key, fingerprint, ttl=60, lock_timeout=0, using=conf.DATABASE
        )
    ).result(timeout=30)


@csrf_exempt
@idempotent
def stolen(request: HttpRequest) -> JsonResponse:
    idem: Any = request.idempotency  # type: ignore[attr-defined]
    gate.thefts.append(steal(idem.scope, idem.key, idem.fingerprint))
    return _created("stolen", request)


class StolenAPIView(IdempotencyMixin, APIView):
    """The DRF variant of ``stolen``: its claim is taken over while the handler runs."""

    permission_classes = [AllowAny]

    def post(self, request: Request) -> Response:
        idem: Any = request.idempotency  # type: ignore[attr-defined]
        gate.thefts.append(steal(idem.scope, idem.key, idem.fingerprint))
        SideEffect.objects.create(label="stolen-drf")
        return Response({"ok": True}, status=201)


class Background:
    """One request sent from its own thread (so: its own database connection)."""

    def __init__(self, path: str, key: str, body: object = None) -> None:
        self._running = in_background(
            lambda: Client().post(
                path,
                body or {"amount": 1},
                content_type="application/json",
                HTTP_IDEMPOTENCY_KEY=key,
            )
        )

    def result(self) -> Any:
        """The response; fails if the request hung, re-raises what it raised."""
        return self._running.result(timeout=60)


urlpatterns = [
    path("gated/", gated),
    path("gated-short-lock/", gated_short_lock),
    path("stolen/", stolen),
    path("stolen-drf/", StolenAPIView.as_view()),
]
