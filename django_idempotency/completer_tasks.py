"""The completer as a Celery task (imports ``celery``): ``django_idempotency.complete_requests``.

Schedule it with beat, every minute or so (``tasks.beat_schedule(complete_every=60)`` adds
the entry); see :mod:`django_idempotency.completer` and docs/steps.md, "The completer".
"""

from __future__ import annotations

from celery import shared_task

from .completer import complete_requests as complete
from .tasks import COMPLETE_TASK


@shared_task(name=COMPLETE_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
def complete_requests(limit: int = 100, using: str | None = None) -> dict[str, int]:
    """Finish up to ``limit`` due keys per key database (or on ``using``); how many keys
    had each outcome."""
    return complete(using=using, limit=int(limit)).counts
