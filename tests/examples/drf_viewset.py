from rest_framework import viewsets
from rest_framework.permissions import IsAuthenticated
from rest_framework.routers import DefaultRouter

from django_idempotency.mixins import IdempotencyMixin

from . import psp
from .models import Charge
from .serializers import ChargeSerializer


# IdempotencyMixin first, before the viewset. With the default METHODS,
# ("POST", "PATCH"), create (POST) and partial_update (PATCH) honour the key,
# and require it here: either without one is a 400. list, retrieve, update
# (PUT) and destroy (DELETE) run as usual.
class ChargeViewSet(IdempotencyMixin, viewsets.ModelViewSet):
    serializer_class = ChargeSerializer
    permission_classes = [IsAuthenticated]
    idempotency_required = True

    def get_queryset(self):
        return Charge.objects.filter(user=self.request.user)

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


# urls.py: path("api/", include(router.urls)) serves /api/charges/ and
# /api/charges/<pk>/
router = DefaultRouter()
router.register("charges", ChargeViewSet, basename="charge")
