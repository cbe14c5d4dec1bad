from django.conf import settings
from django.db import models


class Charge(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="charges"
    )
    amount = models.PositiveIntegerField(help_text="In the currency's minor unit (cents).")
    currency = models.CharField(max_length=3)
    psp_reference = models.CharField(max_length=80, help_text="The payment provider's reference.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.amount} {self.currency} for {self.user}"


class Refund(models.Model):
    charge = models.ForeignKey(Charge, on_delete=models.CASCADE, related_name="refunds")
    amount = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)


class ProviderAnswer(models.Model):
    """What the payment provider answered for a charge, as the stepped view records it."""

    charge = models.ForeignKey(Charge, on_delete=models.CASCADE, related_name="answers")
    reference = models.CharField(max_length=80)
    created_at = models.DateTimeField(auto_now_add=True)


class Receipt(models.Model):
    """A receipt to send for a charge: a row a mailer sends from (an outbox), written in the
    stepped view's last step so that it exists exactly when that step committed."""

    charge = models.ForeignKey(Charge, on_delete=models.CASCADE, related_name="receipts")
    created_at = models.DateTimeField(auto_now_add=True)
