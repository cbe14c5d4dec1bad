"""Views used by the tests; each records one SideEffect row per execution."""

from __future__ import annotations

import json
from io import BytesIO
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.utils.datastructures import MultiValueDict
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework.permissions import AllowAny, BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from django_idempotency.decorators import idempotent
from django_idempotency.mixins import IdempotencyMixin

from . import holds
from .models import SideEffect


def _behave(label: str, payload: dict[str, Any]) -> HttpResponse:
    SideEffect.objects.create(label=label)
    if payload.get("hold"):
        holds.wait(str(payload["hold"]))
    status = int(payload.get("status", 201))
    if payload.get("raise"):
        raise RuntimeError("the view failed")
    response = JsonResponse(
        {"label": label, "n": SideEffect.objects.count(), "echo": payload}, status=status
    )
    response["Set-Cookie"] = "session=secret"
    response["X-Request-Private"] = "not-stored"
    response["Location"] = "/somewhere/1"
    return response


@csrf_exempt
@idempotent
def function_view(request: HttpRequest) -> HttpResponse:
    payload = json.loads(request.body or b"{}") if request.method == "POST" else {}
    return _behave("fn", payload)


def _form_echo(data: Any, files: Any) -> dict[str, Any]:
    return {
        "data": {name: data.getlist(name) for name in data if name not in files},
        "files": {name: [f.read().decode() for f in files.getlist(name)] for name in files},
    }


@csrf_exempt
@idempotent(methods=["POST", "PATCH", "PUT"])
def form_function_view(request: HttpRequest) -> HttpResponse:
    """Parses a form body of any method itself, as views that take PATCH or PUT forms do."""
    SideEffect.objects.create(label="fn-form")
    if request.content_type == "multipart/form-data":
        data, files = request.parse_file_upload(request.META, BytesIO(request.body))
    else:
        data, files = QueryDict(request.body), MultiValueDict()
    return JsonResponse(_form_echo(data, files), status=201)


@csrf_exempt
@idempotent(required=True, methods=["POST", "PUT"], ttl=5)
def function_required(request: HttpRequest) -> HttpResponse:
    payload = json.loads(request.body or b"{}")
    return _behave("fn-required", payload)


class EchoView(IdempotencyMixin, APIView):
    def post(self, request: Request) -> Response:
        data = dict(request.data)
        SideEffect.objects.create(label="drf")
        if data.get("hold"):
            holds.wait(str(data["hold"]))
        if data.get("raise"):
            raise RuntimeError("the view failed")
        if data.get("invalid"):
            from rest_framework.exceptions import ValidationError

            raise ValidationError({"amount": ["bad"]})
        status = int(data.get("status", 201))
        return Response(
            {"label": "drf", "n": SideEffect.objects.count(), "echo": data}, status=status
        )

    def get(self, request: Request) -> Response:
        return Response({"n": SideEffect.objects.count()})


class TenantView(EchoView):
    def get_idempotency_scope(self, request: Request) -> str:
        return "tenant:" + request.headers.get("X-Tenant", "none")


class FormView(IdempotencyMixin, APIView):
    """Echoes ``request.data`` and the uploaded files of a PATCH or PUT."""

    permission_classes = [AllowAny]
    idempotency_methods = ("POST", "PATCH", "PUT")

    def patch(self, request: Request) -> Response:
        SideEffect.objects.create(label="drf-form")
        return Response(_form_echo(request.data, request.FILES), status=201)

    put = patch


class ErrorView(EchoView):
    idempotency_required = True


class AnonymousView(EchoView):
    permission_classes = [AllowAny]


#: Called by ContendedView between its read and its write (set by the test).
contend: list[Any] = []


class ContendedView(IdempotencyMixin, APIView):
    """Reads, lets the test interfere from another connection, then writes; all on the
    alias that holds the keys (the view's transaction is the app's)."""

    def post(self, request: Request) -> Response:
        from django_idempotency.conf import conf

        using = conf.DATABASE
        SideEffect.objects.using(using).count()  # the transaction's first read
        for interfere in contend:
            interfere(using)
        SideEffect.objects.using(using).create(label="contended")
        return Response({"written": True}, status=201)


class DenyOnHeader(BasePermission):
    """Refuses a request that carries ``X-Deny`` (403 for an authenticated user)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return "X-Deny" not in request.headers


class ThrottleOnHeader(BaseThrottle):
    """Throttles a request that carries ``X-Throttle`` (429)."""

    def allow_request(self, request: Request, view: Any) -> bool:
        return "X-Throttle" not in request.headers

    def wait(self) -> float:
        return 7


class GuardedView(EchoView):
    """EchoView behind a permission and a throttle the test switches with headers; its
    scope is the X-Tenant header, so a request rejected before authentication and the
    accepted one after it share the key's scope."""

    permission_classes = [IsAuthenticated, DenyOnHeader]
    throttle_classes = [ThrottleOnHeader]

    def get_idempotency_scope(self, request: Request) -> str:
        return "tenant:" + request.headers.get("X-Tenant", "none")


class NarrowMethodsView(EchoView):
    """Has a ``patch`` handler, but PATCH is not in ``http_method_names``."""

    http_method_names = ["post", "options"]

    def patch(self, request: Request) -> Response:
        SideEffect.objects.create(label="drf-patch")
        return Response({"patched": True})


@csrf_exempt
@require_POST
@idempotent
def function_post_only(request: HttpRequest) -> HttpResponse:
    return _behave("fn-post-only", json.loads(request.body or b"{}"))


#: Called by the connection-loss views after their write, with the alias that holds the
#: keys (set by the test: it breaks the view's database connection).
after_write: list[Any] = []


def _write_then_lose_the_connection(label: str) -> int:
    from django_idempotency.conf import conf

    using = conf.DATABASE
    SideEffect.objects.using(using).create(label=label)
    for interfere in after_write:
        interfere(using)
    return SideEffect.objects.using(using).filter(label=label).count()


class ConnectionLossView(IdempotencyMixin, APIView):
    permission_classes = [AllowAny]

    def post(self, request: Request) -> Response:
        return Response({"n": _write_then_lose_the_connection("drf-lost")}, status=201)


@csrf_exempt
@idempotent
def function_connection_loss(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"n": _write_then_lose_the_connection("fn-lost")}, status=201)


#: The labels of the on_commit hooks of OnCommitView and on_commit_function that ran.
hooks_ran: list[str] = []


def _write_and_hook(label: str) -> int:
    """One SideEffect row and one on_commit hook, both on the alias that holds the keys."""
    from django_idempotency.conf import conf

    using = conf.DATABASE
    SideEffect.objects.using(using).create(label=label)
    transaction.on_commit(lambda: hooks_ran.append(label), using=using)
    return SideEffect.objects.using(using).filter(label=label).count()


class OnCommitView(IdempotencyMixin, APIView):
    """Registers exactly one on_commit hook of its own."""

    def post(self, request: Request) -> Response:
        return Response({"n": _write_and_hook("drf-hook")}, status=201)


@csrf_exempt
@require_POST
@idempotent
def on_commit_function(request: HttpRequest) -> HttpResponse:
    """The same with ``@idempotent``."""
    return JsonResponse({"n": _write_and_hook("fn-hook")}, status=201)


# -- a view in steps (docs/steps.md) ----------------------------------------------------------

#: The remote step's calls in this process: (downstream key, label), in order.
REMOTE_CALLS: list[tuple[str, str]] = []
#: label -> the point where the next request of that label fails once: a step's name
#: (after its write, before its commit), "call" (before the remote call) or "after-call".
FAIL_ONCE: dict[str, str] = {}


class StepFailed(RuntimeError):
    """Raised where ``FAIL_ONCE`` says (a crash of the view there)."""


def _fails(label: str, point: str) -> None:
    if FAIL_ONCE.get(label) == point:
        del FAIL_ONCE[label]
        raise StepFailed(point)


def _remote_call(downstream: str, label: str) -> str:
    REMOTE_CALLS.append((downstream, label))
    _fails(label, "after-call")
    return f"ref-{downstream[:12]}"


def _stepped(request: HttpRequest) -> HttpResponse:
    """Four steps, each one SideEffect row (``<label>:<step>``) but the remote call; the
    body's ``hold`` names a step that waits for ``holds.release("<label>:<step>")``."""
    payload = json.loads(request.body or b"{}")
    label = str(payload.get("label", "stepped"))
    steps = request.idempotency.steps  # type: ignore[attr-defined]

    def effect(name: str) -> int:
        if payload.get("hold") == name:
            holds.wait(f"{label}:{name}")
        row = SideEffect.objects.create(label=f"{label}:{name}")
        _fails(label, name)
        return row.pk

    created = steps.local("create", effect, "create")
    _fails(label, "call")
    answer = steps.remote("call", _remote_call, label)
    steps.local("record", effect, "record")
    steps.local("receipt", effect, "receipt")
    return JsonResponse(
        {"created": created, "answer": answer, "resumed": steps.resumed}, status=201
    )


#: Under the ``STRATEGY`` setting (the tests choose ``db`` or ``advisory_lock``).
stepped = csrf_exempt(idempotent(steps=True)(_stepped))


class SteppedAPIView(IdempotencyMixin, APIView):
    """The same steps in a DRF view (``idempotency_steps``)."""

    permission_classes = [AllowAny]
    idempotency_steps = True

    def post(self, request: Request) -> Response:
        response = _stepped(request)
        return Response(json.loads(response.content), status=response.status_code)


@csrf_exempt
@idempotent(steps=True)
def remote_first(request: HttpRequest) -> HttpResponse:
    """A remote step first (nothing committed before it), then a local one."""
    label = str(json.loads(request.body or b"{}").get("label", "remote-first"))
    steps = request.idempotency.steps  # type: ignore[attr-defined]
    answer = steps.remote("call", _remote_call, label)
    created = steps.local("record", lambda: SideEffect.objects.create(label=f"{label}:record").pk)
    return JsonResponse({"created": created, "answer": answer}, status=201)


@csrf_exempt
@idempotent(steps=True)
def stepped_doomed(request: HttpRequest) -> HttpResponse:
    """A step whose block is marked for rollback (the view caught an error in it)."""
    steps = request.idempotency.steps  # type: ignore[attr-defined]
    steps.local("create", lambda: SideEffect.objects.create(label="doomed:create").pk)

    def doomed() -> int:
        row = SideEffect.objects.create(label="doomed:record")
        transaction.set_rollback(True)
        return row.pk

    steps.local("record", doomed)
    return JsonResponse({}, status=201)
