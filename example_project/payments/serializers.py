from rest_framework import serializers

from .models import Charge


class ChargeSerializer(serializers.ModelSerializer):
    amount = serializers.IntegerField(min_value=1, max_value=100_000_000)
    currency = serializers.RegexField(r"^[A-Za-z]{3}$", max_length=3)

    class Meta:
        model = Charge
        fields = ["id", "amount", "currency", "psp_reference", "created_at"]
        read_only_fields = ["id", "psp_reference", "created_at"]

    def validate_currency(self, value: str) -> str:
        return value.upper()
