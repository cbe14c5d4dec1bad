from rest_framework import generics
from rest_framework.permissions import IsAuthenticated

from django_idempotency.mixins import IdempotencyMixin

from . import psp
from .serializers import ChargeSerializer


# IdempotencyMixin first: before APIView (or any DRF view class) in the bases.
class ChargeCreateView(IdempotencyMixin, generics.CreateAPIView):
    """Charge the caller through the payment provider."""

    serializer_class = ChargeSerializer
    permission_classes = [IsAuthenticated]
    idempotency_required = True

    def perform_create(self, serializer):
        data = serializer.validated_data
        reference = psp.charge(
            data["amount"],
            data["currency"],
            # The same for every retry of this request: the provider
            # deduplicates too.
            idempotency_key=self.request.idempotency.downstream_key("psp"),
        )
        serializer.save(user=self.request.user, psp_reference=reference)
