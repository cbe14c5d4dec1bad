# --8<-- [start:views]
import json

from django.db import transaction
from django.http import JsonResponse
from django.views.decorators.http import require_POST
from rest_framework import generics
from rest_framework.permissions import IsAuthenticated

from django_idempotency.decorators import idempotent
from django_idempotency.mixins import IdempotencyMixin

from .models import Charge
from .receipts import send_receipt
from .serializers import ChargeSerializer


class ReceiptChargeView(IdempotencyMixin, generics.CreateAPIView):
    """Charge the caller; the receipt goes out once the charge has committed."""

    serializer_class = ChargeSerializer
    permission_classes = [IsAuthenticated]
    idempotency_required = True

    def perform_create(self, serializer):
        charge = serializer.save(
            user=self.request.user, psp_reference="psp-test"
        )
        transaction.on_commit(
            lambda: send_receipt(charge.pk)
        )  # the view's one callback


@require_POST
@idempotent(required=True)
def receipt_charge(request):
    """The same with ``@idempotent`` on a plain view."""
    if not request.user.is_authenticated:
        return JsonResponse({"detail": "Sign in first."}, status=401)
    payload = json.loads(request.body)
    charge = Charge.objects.create(
        user=request.user,
        amount=int(payload["amount"]),
        currency=str(payload["currency"]).upper(),
        psp_reference="psp-test",
    )
    transaction.on_commit(lambda: send_receipt(charge.pk))
    return JsonResponse({"id": charge.pk}, status=201)


# --8<-- [end:views]
