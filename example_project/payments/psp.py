"""A fake payment service provider: it takes PSP_DELAY_MS and deduplicates by key,
as real providers do with the idempotency key they are handed."""

from __future__ import annotations

import threading
import time

from django.conf import settings

_seen: dict[str, str] = {}
_lock = threading.Lock()


def charge(amount: int, currency: str, *, idempotency_key: str) -> str:
    delay = settings.PSP_DELAY_MS / 1000
    if delay:
        time.sleep(delay)
    with _lock:
        return _seen.setdefault(idempotency_key, f"psp_{idempotency_key[:24]}")
