from typing import Any

from django.db.models import QuerySet
from rest_framework import viewsets
from rest_framework.permissions import IsAuthenticated
from rest_framework.routers import DefaultRouter

from django_idempotency.mixins import IdempotencyMixin
from example_project.payments import psp
from example_project.payments.models import Charge
from example_project.payments.serializers import ChargeSerializer


# IdempotencyMixin first, before the viewset. With the default METHODS, ("POST", "PATCH"),
# create (POST) and partial_update (PATCH) honour the key, and require it here: either
# without one is a 400. list, retrieve, update (PUT) and destroy (DELETE) run as usual.
class ChargeViewSet(IdempotencyMixin, viewsets.ModelViewSet[Charge]):
    serializer_class = ChargeSerializer
    permission_classes = [IsAuthenticated]
    idempotency_required = True

    def get_queryset(self) -> QuerySet[Charge]:
        return Charge.objects.filter(user=self.request.user)  # type: ignore[misc]

    def perform_create(self, serializer: Any) -> None:
        data = serializer.validated_data
        reference = psp.charge(
            data["amount"],
            data["currency"],
            # The same for every retry of this request: the provider deduplicates too.
            idempotency_key=self.request.idempotency.downstream_key("psp"),  # type: ignore[attr-defined]
        )
        serializer.save(user=self.request.user, psp_reference=reference)


# urls.py: path("api/", include(router.urls)) serves /api/charges/ and /api/charges/<pk>/
router = DefaultRouter()
router.register("charges", ChargeViewSet, basename="charge")
