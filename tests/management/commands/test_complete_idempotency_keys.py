"""``manage.py complete_idempotency_keys``: the completer's counts by outcome, and silence
at ``-v 0``. What the completer does is
tested in ``tests/test_completer.py``; the command in its own process, against a killed
worker, in ``tests/system/test_steps_crash.py``."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from ... import test_completer

pytestmark = pytest.mark.django_db(transaction=True)


def complete(*args: str) -> str:
    out = io.StringIO()
    call_command("complete_idempotency_keys", *args, stdout=out)
    return out.getvalue()


def test_prints_how_many_keys_had_each_outcome(settings: Any, django_user_model: Any) -> None:
    settings.ROOT_URLCONF = test_completer.__name__
    settings.IDEMPOTENCY = {"STRATEGY": "db", "COMPLETER_AFTER": 0}
    client = Client(raise_request_exception=False)
    client.force_login(django_user_model.objects.create_user("cmd-payer", password="x"))
    test_completer.FAIL[:] = ["record"]
    assert test_completer.post(client, "cmd-1", "cmd").status_code == 500

    out = complete("--limit", "10")

    assert "1 completed, 0 failed, 0 dead-lettered, 0 taken by a retry first" in out
    assert complete("-v", "0") == ""
