"""The examples of docs/middleware.md; tests/test_middleware.py runs them."""

# --8<-- [start:views]
import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from django_idempotency.decorators import idempotency_exempt, idempotency_opt_in

from .models import Charge


@csrf_exempt
@idempotency_opt_in(required=True)
def create_charge(request: HttpRequest) -> JsonResponse:
    """Protected by the middleware: the header is required on POST and PATCH."""
    user = (
        request.user
    )  # set by AuthenticationMiddleware, before IdempotencyMiddleware
    if not user.is_authenticated:
        return JsonResponse({"detail": "Log in first."}, status=401)
    payload = json.loads(request.body)
    charge = Charge.objects.create(
        user=user,
        amount=int(payload["amount"]),
        currency=payload["currency"],
    )
    return JsonResponse({"id": charge.pk}, status=201)


@csrf_exempt
@idempotency_opt_in
async def acreate_charge(request: HttpRequest) -> JsonResponse:
    """The same, async; the header is optional here."""
    user = await request.auser()
    if not user.is_authenticated:
        return JsonResponse({"detail": "Log in first."}, status=401)
    payload = json.loads(request.body)
    charge = await Charge.objects.acreate(
        user=user,
        amount=int(payload["amount"]),
        currency=payload["currency"],
    )
    return JsonResponse({"id": charge.pk}, status=201)


@csrf_exempt
@idempotency_exempt
def provider_webhook(request: HttpRequest) -> JsonResponse:
    """Never handled, even with MIDDLEWARE_DEFAULT = "all"."""
    Charge.objects.filter(pk=json.loads(request.body)["id"]).update(
        psp_reference="settled"
    )
    return JsonResponse({}, status=200)


# --8<-- [end:views]


@csrf_exempt
def unmarked(request: HttpRequest) -> JsonResponse:
    """No mark: handled only with MIDDLEWARE_DEFAULT = "all"."""
    user = request.user
    assert user.is_authenticated
    charge = Charge.objects.create(user=user, amount=1, currency="EUR")
    return JsonResponse({"id": charge.pk}, status=201)
