from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework import exceptions, generics
from rest_framework.authentication import TokenAuthentication

from django_idempotency.decorators import idempotent
from django_idempotency.mixins import IdempotencyMixin

from . import psp
from .charging import charge_in_steps
from .models import Charge, Refund
from .serializers import ChargeSerializer


class ChargeViewBase(generics.ListCreateAPIView):
    """GET lists the caller's charges; POST charges the caller through the provider."""

    serializer_class = ChargeSerializer

    def get_queryset(self) -> Any:
        return Charge.objects.filter(user=self.request.user)

    def provider_key(self) -> str:
        return self.request.idempotency.downstream_key("psp")  # type: ignore[attr-defined,no-any-return]

    def perform_create(self, serializer: ChargeSerializer) -> None:
        data = serializer.validated_data
        reference = psp.charge(
            data["amount"], data["currency"], idempotency_key=self.provider_key()
        )
        serializer.save(user=self.request.user, psp_reference=reference)


class ChargeView(IdempotencyMixin, ChargeViewBase):
    idempotency_required = True


def api_user_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Accept the same API tokens as the DRF views (or a session) on a plain view."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            found = TokenAuthentication().authenticate(request)  # type: ignore[arg-type]
        except exceptions.AuthenticationFailed as exc:
            return JsonResponse({"detail": str(exc.detail)}, status=401)
        if found is not None:
            request.user = found[0]
        if not request.user.is_authenticated:
            return JsonResponse(
                {"detail": "Authentication credentials were not provided."}, status=401
            )
        return view(request, *args, **kwargs)

    return wrapper


@csrf_exempt
@require_POST
@api_user_required
@idempotent(required=True)
def refund(request: HttpRequest) -> JsonResponse:
    """A plain Django view: POST {"charge": id, "amount": n} refunds part of a charge."""
    try:
        payload = json.loads(request.body or b"{}")
        charge_id = int(payload["charge"])
        amount = int(payload["amount"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": 'Send {"charge": <id>, "amount": <int>}.'}, status=400)
    charge = Charge.objects.filter(pk=charge_id, user=request.user).first()
    if charge is None:
        return JsonResponse({"detail": "No such charge."}, status=404)
    if amount < 1 or amount > charge.amount:
        return JsonResponse({"detail": "Amount out of range."}, status=400)
    refund = Refund.objects.create(charge=charge, amount=amount)
    return JsonResponse({"id": refund.pk, "charge": charge.pk, "amount": amount}, status=201)


# -- a charge in steps (docs/steps.md) ---------------------------------------------------------


#: Steps run under ``db`` and ``advisory_lock`` (docs/steps.md#strategies): under the
#: project's ``STRATEGY`` when it is one of them, else (``redis``, ``hybrid``) under ``db``,
#: a strategy of the view's own (check E091 refuses to start otherwise).
STEPS_STRATEGY = (
    None if settings.IDEMPOTENCY.get("STRATEGY", "db") in ("db", "advisory_lock") else "db"
)


@csrf_exempt
@require_POST
@api_user_required
@idempotent(required=True, steps=True, completer=True, strategy=STEPS_STRATEGY)
def stepped_charge(request: HttpRequest) -> JsonResponse:
    """POST {"amount": n, "currency": "EUR"}: a charge in four steps, each done once per
    key however often the request is retried and wherever it crashed: the charge row, the
    provider's call (with a key of its own), the provider's answer, the receipt. A charge
    whose client does not come back is finished by the completer
    (``manage.py complete_idempotency_keys``)."""
    try:
        payload = json.loads(request.body or b"{}")
        amount, currency = int(payload["amount"]), str(payload["currency"])[:3]
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": 'Send {"amount": <int>, "currency": "EUR"}.'}, status=400)
    steps = request.idempotency.steps  # type: ignore[attr-defined]
    return JsonResponse(charge_in_steps(steps, request.user.pk, amount, currency), status=201)
