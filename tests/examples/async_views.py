"""The example of docs/async.md; tests/test_decorators_async.py runs it."""

# --8<-- [start:view]
import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_idempotency.decorators import idempotent

from .models import Charge


@csrf_exempt
@require_POST
@idempotent(required=True)
async def create_charge(request: HttpRequest) -> JsonResponse:
    user = await request.auser()
    if not user.is_authenticated:
        return JsonResponse({"detail": "Log in first."}, status=401)
    payload = json.loads(request.body)
    # The async ORM runs in the thread that holds the claim's transaction:
    # this row commits together with the stored response, or not at all.
    charge = await Charge.objects.acreate(
        user=user,
        amount=int(payload["amount"]),
        currency=payload["currency"],
    )
    return JsonResponse({"id": charge.pk, "amount": charge.amount}, status=201)


# --8<-- [end:view]
