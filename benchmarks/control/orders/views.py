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
