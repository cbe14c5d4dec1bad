"""A fake payment service provider: it takes PSP_DELAY_MS and deduplicates by key,
as real providers do with the idempotency key they are handed."""

from __future__ import annotations

import fcntl
import os
import threading
import time

from django.conf import settings


class ProviderError(Exception):
    """The provider did not answer (an unhandled exception: the view's 500)."""


_seen: dict[str, str] = {}
_lock = threading.Lock()


#: How long a call waits at most for the hold marker to go (a test that never removes it).
HOLD_LIMIT = 120.0


def _held(marker: str) -> None:
    """While the file ``marker`` exists, the call does not answer (a test decides when the
    provider call ends)."""
    deadline = time.monotonic() + HOLD_LIMIT
    while marker and os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.01)  # polling interval


def charge(amount: int, currency: str, *, idempotency_key: str) -> str:
    calls = getattr(settings, "PSP_CALL_LOG", "")
    if calls:
        with open(calls, "a") as log:  # which worker process made the call (tests)
            log.write(f"{os.getpid()}\n")
    delay = settings.PSP_DELAY_MS / 1000
    if delay:
        time.sleep(delay)
    _held(getattr(settings, "PSP_HOLD_MARKER", ""))
    marker = getattr(settings, "PSP_FAIL_MARKER", "")
    if marker:
        try:
            os.unlink(marker)  # one call in all the processes wins it
        except FileNotFoundError:
            pass
        else:
            raise ProviderError("the payment provider failed (PSP_FAIL_MARKER)")
    ledger = getattr(settings, "PSP_LEDGER", "")
    if ledger:
        return _ledger_charge(ledger, idempotency_key)
    with _lock:
        return _seen.setdefault(idempotency_key, f"psp_{idempotency_key[:24]}")


def _ledger_charge(path: str, idempotency_key: str) -> str:
    """The provider's charges kept in the file ``path`` (PSP_LEDGER), one line per key, so
    that the provider remembers a key across the processes of a test (a killed worker's
    charge too): a key seen before gets its first answer, and no second charge."""
    with open(path, "a+") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)
        ledger.seek(0)
        for line in ledger:
            seen, _, reference = line.strip().partition(" ")
            if seen == idempotency_key:
                return reference
        reference = f"psp_{idempotency_key[:24]}"
        ledger.write(f"{idempotency_key} {reference}\n")
        return reference
