from rest_framework import status
from rest_framework.decorators import permission_classes
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from django_idempotency.drf import idempotent_api_view

from . import psp
from .serializers import ChargeSerializer


# In place of @api_view(["POST"]); DRF's policy decorators go below it.
@idempotent_api_view(["POST"], required=True)
@permission_classes([IsAuthenticated])
def create_charge(request):
    """Charge the caller through the payment provider."""
    serializer = ChargeSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    reference = psp.charge(
        data["amount"],
        data["currency"],
        # The same for every retry of this request: the provider
        # deduplicates too.
        idempotency_key=request.idempotency.downstream_key("psp"),
    )
    serializer.save(user=request.user, psp_reference=reference)
    return Response(serializer.data, status=status.HTTP_201_CREATED)
