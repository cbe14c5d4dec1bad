"""The completer's Celery task, run through Celery's own call path (``apply``: in this
process, without a broker; the completer itself is tested in ``tests/test_completer.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from django_idempotency.completer_tasks import complete_requests
from django_idempotency.models import IdempotencyKey
from django_idempotency.tasks import COMPLETE_TASK, beat_schedule

from . import test_completer
from .testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_task_finishes_a_due_request_and_beat_can_schedule_it(settings: Any) -> None:
    settings.ROOT_URLCONF = test_completer.__name__
    settings.IDEMPOTENCY = {"STRATEGY": "db", "COMPLETER_AFTER": 0}
    user = get_user_model().objects.create_user("task-payer", password="x")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    test_completer.FAIL[:] = ["record"]
    body = json.dumps({"label": "task"})
    response = client.post("/c/", body, "application/json", headers={"Idempotency-Key": "t1"})
    assert response.status_code == 500

    counts = complete_requests.apply(kwargs={"limit": 10}).get()

    assert counts["completed"] == 1
    assert IdempotencyKey.objects.get(key="t1").status == IdempotencyKey.Status.COMPLETED
    assert SideEffect.objects.filter(label="task:record").count() == 1
    assert complete_requests.name == COMPLETE_TASK
    entry = beat_schedule(complete_every=30)["django-idempotency-complete-requests"]
    assert entry["task"] == COMPLETE_TASK and entry["schedule"] == 30.0
    assert "django-idempotency-complete-requests" not in beat_schedule()
