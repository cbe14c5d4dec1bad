import json

from django.http import JsonResponse
from django.views.decorators.http import require_POST

from django_idempotency.decorators import idempotent

from . import psp
from .models import Charge


# Authentication (here Django's session, through AuthenticationMiddleware)
# happens before @idempotent claims the key: a decorator that sets request.user
# goes above it.
@require_POST
@idempotent(required=True)
def create_charge(request):
    """Charge the signed-in user through the payment provider."""
    if not request.user.is_authenticated:
        return JsonResponse({"detail": "Sign in first."}, status=401)
    try:
        payload = json.loads(request.body)
        amount, currency = (
            int(payload["amount"]),
            str(payload["currency"]).upper(),
        )
    except (ValueError, KeyError, TypeError):
        return JsonResponse(
            {"detail": 'Send {"amount": <int>, "currency": "EUR"}.'}, status=400
        )
    reference = psp.charge(
        amount,
        currency,
        # The same for every retry of this request: the provider
        # deduplicates too.
        idempotency_key=request.idempotency.downstream_key("psp"),
    )
    charge = Charge.objects.create(
        user=request.user,
        amount=amount,
        currency=currency,
        psp_reference=reference,
    )
    return JsonResponse(
        {"id": charge.pk, "amount": amount, "currency": currency}, status=201
    )
