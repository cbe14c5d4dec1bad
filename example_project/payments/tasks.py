"""The example's Celery task: a charge in the same four steps as the stepped view
(``charging.charge_in_steps``), for work queued instead of requested.

The task's id is its key: a message delivered again (a worker killed mid-task, the
broker's ``acks_late`` redelivery) or published again with the same ``task_id`` resumes after
the last step that committed, and a duplicate of a finished charge gets its stored result
without running a step (docs/celery.md)."""

from __future__ import annotations

# --8<-- [start:task]
from typing import Any

from django_idempotency.idempotent_tasks import idempotent_task

from .charging import charge_in_steps


@idempotent_task(
    name="payments.charge_in_steps",
    bind=True,
    steps=True,
    ignore_result=False,
)
def charge_task(
    self: Any,
    user_id: int,
    amount: int,
    currency: str,
) -> dict[str, Any]:
    """Charge ``amount`` (minor units) in ``currency`` for user ``user_id``;
    what the charge came to (its id, the provider's reference, the receipt)."""
    return charge_in_steps(self.steps, user_id, amount, currency)


# --8<-- [end:task]
