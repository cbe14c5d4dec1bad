"""Routes that exist only with EXAMPLE_BASELINE_ROUTES=1.

* ``PlainChargeView``: the charge view without the mixin (the benchmark baseline).
* ``NaiveChargeView``: the SELECT-then-INSERT idempotency that most hand-written
  code does. It double-charges under concurrency; the race tests use it to show
  that their harness can catch a double charge.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import IntegrityError
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from django_idempotency.models import IdempotencyKey

from .views import ChargeViewBase


class PlainChargeView(ChargeViewBase):
    def provider_key(self) -> str:
        return hashlib.sha256(str(timezone.now().timestamp()).encode()).hexdigest()


class NaiveChargeView(PlainChargeView):
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get("Idempotency-Key", "")
        scope = f"naive:{request.user.pk}"
        existing = IdempotencyKey.objects.filter(scope=scope, key=key).first()  # SELECT ...
        if existing is not None:
            return Response(status=existing.response_status or 409)
        response = super().post(request, *args, **kwargs)  # ... then run the side effect
        try:
            now = timezone.now()
            IdempotencyKey.objects.create(  # ... then INSERT
                scope=scope,
                key=key,
                fingerprint="",
                status="completed",
                claim_token="00000000-0000-0000-0000-000000000000",
                response_status=response.status_code,
                expires_at=now + timezone.timedelta(days=1),
            )
        except IntegrityError:
            pass
        return response
