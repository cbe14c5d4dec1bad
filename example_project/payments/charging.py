"""A charge in four steps, shared by the stepped view (``views.stepped_charge``) and the
Celery task (``tasks.charge_in_steps``): the charge row, the provider's call (with a key of
its own, derived from the request's or the task's), the provider's answer, the receipt. Each
is done once per key however often the work is retried and wherever it crashed
(docs/steps.md)."""

from __future__ import annotations

from typing import Any

from django_idempotency.protocol.steps import Steps

from . import psp
from .models import Charge, ProviderAnswer, Receipt


def create_charge(user_id: int, amount: int, currency: str) -> int:
    return Charge.objects.create(user_id=user_id, amount=amount, currency=currency).pk


def call_provider(idempotency_key: str, amount: int, currency: str) -> str:
    return psp.charge(amount, currency, idempotency_key=idempotency_key)


def record_answer(charge_id: int, reference: str) -> None:
    ProviderAnswer.objects.create(charge_id=charge_id, reference=reference)
    Charge.objects.filter(pk=charge_id).update(psp_reference=reference)


def send_receipt(charge_id: int) -> int:
    return Receipt.objects.create(charge_id=charge_id).pk


def charge_in_steps(steps: Steps, user_id: int, amount: int, currency: str) -> dict[str, Any]:
    """The four steps, in order; what the charge came to."""
    charge_id = steps.local("create_charge", create_charge, user_id, amount, currency)
    reference = steps.remote("call_provider", call_provider, amount, currency)
    steps.local("record_answer", record_answer, charge_id, reference)
    receipt = steps.local("send_receipt", send_receipt, charge_id)
    return {
        "id": charge_id,
        "amount": amount,
        "currency": currency,
        "psp_reference": reference,
        "receipt": receipt,
    }
