"""The example's Celery task in steps, its worker SIGKILLed at every step boundary, for real.

``payments.charge_in_steps`` (example_project/payments/tasks.py) runs the stepped view's four
steps: the charge row, the fake provider's call (its ledger file remembers each downstream
key across processes, as a real provider does), the provider's answer, the receipt. A real
``celery worker`` started with ``--include tests.support.kill_points`` kills itself where
the flag file says, and another one is started in its place. Two ways back, each at every
point: the broker's redelivery alone (a private Redis, visibility timeout 2 s), and that
redelivery with the same message published again while no worker ran (a client's retry:
the same task id, the task's key), which then arrives first. The delivery that gets the key
takes it over once the dead worker's lease (2 s) has lapsed on the database's clock and
resumes after the last step that committed; the other gets the stored result. Counted for
every point: one row of each local step, one provider charge, the steps recorded in order,
and the provider called again only when the kill came after its call and before its answer
was recorded (with the same key).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.result import AsyncResult
from django.contrib.auth import get_user_model

from django_idempotency.models import IdempotencyKey
from django_idempotency.store.status import COMPLETED
from example_project.payments.models import Charge, ProviderAnswer, Receipt

from ..support.kill_points import POINTS
from ..support.task_workers import PATIENCE, wait_for
from ..support.workers import Worker

pytestmark = [pytest.mark.celery, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TASK = "payments.charge_in_steps"
STEPS = ["create_charge", "call_provider", "record_answer", "send_receipt"]
#: The kill came after the provider's call and before its answer was recorded: the
#: resumed run calls it again, with the same key.
CALLED_TWICE = {"provider:after", "before:record_answer"}


def effects(amount: int) -> dict[str, int]:
    """The rows of each local step for the charge of ``amount`` (one amount per point)."""
    charges = Charge.objects.filter(amount=amount)
    return {
        "create_charge": charges.count(),
        "record_answer": ProviderAnswer.objects.filter(charge__in=charges).count(),
        "send_receipt": Receipt.objects.filter(charge__in=charges).count(),
    }


@pytest.mark.parametrize("published_again", [False, True], ids=["redelivered", "and-retried"])
def test_the_example_task_killed_at_every_step_boundary_takes_each_step_once(
    workers: Callable[..., Worker], producer: Celery, tmp_path: Path, published_again: bool
) -> None:
    ledger, calls = tmp_path / "ledger", tmp_path / "calls.log"
    ledger.touch()
    calls.touch()
    env = {
        "STEPS_KILL_FLAG": str(tmp_path / "kill"),
        "STEPS_KILL_CELERY": "1",
        "PSP_LEDGER": str(ledger),
        "PSP_CALL_LOG": str(calls),
        "TEST_CELERY_VISIBILITY_TIMEOUT": "2",
        "TEST_IDEMPOTENCY_LOCK_TIMEOUT": "2",
    }
    user = get_user_model().objects.create(username=f"payer-{uuid.uuid4().hex[:8]}")
    worker = workers("first", include=INCLUDE, **env)
    for index, point in enumerate(POINTS):
        before = len(calls.read_text().splitlines())
        arguments = [user.pk, 1000 + index, "EUR"]
        worker, sent = _killed_and_resumed(
            workers, producer, worker, point, arguments, env, published_again
        )
        called = len(calls.read_text().splitlines()) - before
        assert called == (2 if point in CALLED_TWICE else 1), (point, called)
        _assert_one_effect_per_step(sent, 1000 + index, point, worker)

    charged = ledger.read_text().splitlines()
    assert len(charged) == len({line.split()[0] for line in charged}) == len(POINTS)


#: The worker's start-up imports the kill points (Celery's ``--include``).
INCLUDE = ("tests.support.kill_points",)


def _killed_and_resumed(
    workers: Callable[..., Worker],
    producer: Celery,
    worker: Worker,
    point: str,
    arguments: list[Any],
    env: dict[str, str],
    published_again: bool,
) -> tuple[Worker, AsyncResult]:
    """The task sent to ``worker``, which dies at ``point``; if ``published_again``, the
    same message published again while no worker runs; a new worker, which gets the
    deliveries. That worker, once they have ended, and the task's result."""
    flag = Path(env["STEPS_KILL_FLAG"])
    flag.write_text(point)
    sent = producer.send_task(TASK, args=arguments)
    wait_for(worker.exited, f"the worker to die at {point}", worker)
    assert not flag.exists(), point
    if published_again:  # a client's retry
        producer.send_task(TASK, args=arguments, task_id=sent.id)
    again = workers(f"after-{point}", include=INCLUDE, **env)
    sent.get(timeout=PATIENCE)
    deliveries = 2 if published_again else 1
    wait_for(
        lambda: again.log().count(f"{sent.id}] succeeded") == deliveries,
        f"the deliveries of the charge killed at {point}",
        again,
    )
    return again, sent


def _assert_one_effect_per_step(sent: AsyncResult, amount: int, point: str, worker: Worker) -> None:
    local = ["create_charge", "record_answer", "send_receipt"]
    assert effects(amount) == dict.fromkeys(local, 1), (point, worker.log())
    charge = Charge.objects.get(amount=amount)
    result = sent.get(timeout=PATIENCE)
    assert result["id"] == charge.pk and result["psp_reference"] == charge.psp_reference
    assert result["receipt"] == Receipt.objects.get(charge=charge).pk
    row = IdempotencyKey.objects.get(scope=f"task:{TASK}", key=sent.id)
    assert row.status == COMPLETED and row.recovery_point == "send_receipt", point
    assert row.steps is not None
    assert [step["name"] for step in row.steps["done"]] == STEPS, point
