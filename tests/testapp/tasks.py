"""Idempotent tasks for tests/test_idempotent_tasks.py, which real workers find here
(``autodiscover_tasks``). Each writes one SideEffect row in its body; ``flags`` is the
URL of the test's private Redis, where a body counts its runs outside any transaction."""

from __future__ import annotations

import uuid
from typing import Any

import redis

from django_idempotency.idempotent_tasks import idempotent_task

from .models import SideEffect


def _runs(flags: str, label: str) -> int:
    client = redis.Redis.from_url(flags)
    try:
        return int(client.incr(f"{label}:runs"))
    finally:
        client.close()


def _charge(order: str, flags: str) -> dict[str, Any]:
    """One charge per order, whoever publishes it; each run answers something new."""
    _runs(flags, order)
    effect = SideEffect.objects.create(label=f"charge-{order}")
    return {"order": order, "effect": effect.pk, "run": uuid.uuid4().hex}


def _order_key(order: str, flags: str) -> str:
    return f"order-{order}"


charge = idempotent_task(name="tests.charge", key=_order_key, ignore_result=False, countdown=0.2)(
    _charge
)
charge_locked = idempotent_task(
    name="tests.charge_locked",
    key=_order_key,
    strategy="advisory_lock",
    ignore_result=False,
    countdown=0.2,
)(_charge)


def _block_once(label: str, flags: str) -> int:
    """Writes its row, then blocks forever on its first run (the test kills its worker
    there); a later run completes."""
    effect = SideEffect.objects.create(label=label)
    if _runs(flags, label) == 1:
        client = redis.Redis.from_url(flags)
        client.blpop([f"{label}:never"], timeout=0)
    return int(effect.pk)


block_once = idempotent_task(name="tests.block_once", lock_timeout=2, countdown=0.5)(_block_once)
block_once_locked = idempotent_task(
    name="tests.block_once_locked", strategy="advisory_lock", lock_timeout=2, countdown=0.5
)(_block_once)


@idempotent_task(name="tests.retry_once", bind=True, ignore_result=False, countdown=0.2)
def retry_once(self: Any, label: str, flags: str) -> int:
    """Writes its row, then asks for a retry on its first run."""
    SideEffect.objects.create(label=label)
    runs = _runs(flags, label)
    if runs == 1:
        raise self.retry(countdown=0)
    return runs


@idempotent_task(
    name="tests.hold",
    key=lambda label, flags: label,
    ignore_result=False,
    countdown=0.2,
)
def hold(label: str, flags: str) -> dict[str, Any]:
    """Writes its row; its first run waits until the test pushes ``<label>:go``."""
    effect = SideEffect.objects.create(label=label)
    if _runs(flags, label) == 1:
        client = redis.Redis.from_url(flags)
        try:
            client.blpop([f"{label}:go"], timeout=0)
        finally:
            client.close()
    return {"effect": effect.pk, "run": uuid.uuid4().hex}


@idempotent_task(name="tests.once", countdown=0.2)
def once(label: str, flags: str) -> int:
    """Keyed by its task id: one row per message, however often it is published."""
    SideEffect.objects.create(label=label)
    return _runs(flags, label)


@idempotent_task(
    name="tests.count_retries",
    key=lambda label, flags: label,
    bind=True,
    ignore_result=False,
    countdown=0.1,
    max_retries=0,
)
def count_retries(self: Any, label: str, flags: str) -> int:
    """Its run's ``self.request.retries``, which waiting for the key leaves as it was."""
    SideEffect.objects.create(label=label)
    _runs(flags, label)
    return int(self.request.retries)


def _stop_once_at(flags: str, label: str, point: str, stop_at: str) -> None:
    """Blocks forever the first time a run reaches ``point`` when it is ``stop_at`` (the
    test kills the worker there); later runs, and other points, go on."""
    if point != stop_at:
        return
    client = redis.Redis.from_url(flags)
    try:
        if int(client.incr(f"{label}:at:{point}")) == 1:
            client.blpop([f"{label}:never"], timeout=0)
    finally:
        client.close()


def _provider(downstream_key: str, flags: str, label: str) -> dict[str, str]:
    """A payment provider's call: each one is listed with the key it carries."""
    client = redis.Redis.from_url(flags)
    try:
        client.rpush(f"{label}:provider", downstream_key)
    finally:
        client.close()
    return {"provider_charge": downstream_key[:16]}


def _charge_in_steps(self: Any, label: str, flags: str, stop_at: str) -> dict[str, Any]:
    """A payment in four steps (docs/steps.md's walk): the charge row, the provider's call,
    the provider's answer recorded, the receipt; ``stop_at``: the step after which the first
    run blocks."""
    steps = self.steps
    _runs(flags, label)

    def row(step: str) -> int:
        return int(SideEffect.objects.create(label=f"{label}:{step}").pk)

    charge_row = steps.local("create_charge", row, "create_charge")
    _stop_once_at(flags, label, "create_charge", stop_at)
    answer = steps.remote("call_provider", _provider, flags, label)
    _stop_once_at(flags, label, "call_provider", stop_at)
    steps.local("record_answer", row, "record_answer")
    _stop_once_at(flags, label, "record_answer", stop_at)
    receipt = steps.local("send_receipt", row, "send_receipt")
    return {"charge": charge_row, "answer": answer, "receipt": receipt}


charge_in_steps = idempotent_task(
    name="tests.charge_in_steps",
    bind=True,
    steps=True,
    lock_timeout=2,
    countdown=0.5,
    ignore_result=False,
)(_charge_in_steps)
charge_in_steps_locked = idempotent_task(
    name="tests.charge_in_steps_locked",
    bind=True,
    steps=True,
    strategy="advisory_lock",
    lock_timeout=2,
    countdown=0.5,
    ignore_result=False,
)(_charge_in_steps)
