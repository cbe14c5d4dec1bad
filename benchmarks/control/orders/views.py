"""The control view (``OrderList``), the same with the mixin, and the round-trip floors."""

from __future__ import annotations

from django.db import connection, transaction
from rest_framework import generics, serializers

from django_idempotency.mixins import IdempotencyMixin

from .models import Order


class OrderSerializer(serializers.ModelSerializer):
    class Meta:
        model = Order
        fields = ["id", "amount", "currency", "description", "created"]


class OrderList(generics.ListCreateAPIView):
    serializer_class = OrderSerializer

    def get_queryset(self):
        return Order.objects.filter(owner=self.request.user).order_by("-id")[:20]

    def perform_create(self, serializer):
        serializer.save(owner=self.request.user)


class IdempotentOrderList(IdempotencyMixin, OrderList):
    idempotency_required = True


class RoundTripFloor(OrderList):
    """The plain view plus the round trips of a new key under the ``db`` strategy, with no
    library code: one autocommit statement before the view (the claim's), the view in a
    transaction, and a last statement that also commits it (the completion's). What is
    left between this route and ``db`` is the library's own work."""

    #: The transaction's last query; with ``COMMIT`` in it, Django's own COMMIT has nothing
    #: left to do.
    last_statement = "SELECT 1; COMMIT"

    def create(self, request, *args, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        with transaction.atomic():
            response = super().create(request, *args, **kwargs)
            with connection.cursor() as cursor:
                cursor.execute(self.last_statement)
        return response


class RoundTripFloorSeparateCommit(RoundTripFloor):
    """:class:`RoundTripFloor` with Django's COMMIT sent on its own after the last statement
    (one round trip more): what carrying the COMMIT in the completion saves."""

    last_statement = "SELECT 1"
