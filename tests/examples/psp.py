"""``from . import psp`` in the docs' examples: the payment provider's client
of "their own app", the example project's, looked up at each call (a test that
replaces ``example_project.payments.psp.charge``, or this module's, is
followed)."""

from typing import Any

from example_project.payments import psp as _provider


def charge(amount: int, currency: str, *, idempotency_key: str) -> Any:
    return _provider.charge(amount, currency, idempotency_key=idempotency_key)
