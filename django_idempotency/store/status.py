"""The two statuses of a key's record, in one place (see docs/how-it-works.md).

``Status`` gives ``IdempotencyKey.status`` its choices; ``IN_PROGRESS`` and ``COMPLETED``
are its values as plain strings, as the SQL, the Redis records and the strategies use them.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Status(models.TextChoices):
    IN_PROGRESS = "in_progress", _("in progress")
    COMPLETED = "completed", _("completed")


IN_PROGRESS: str = Status.IN_PROGRESS.value
COMPLETED: str = Status.COMPLETED.value
