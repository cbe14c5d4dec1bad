"""docs/testing.md's race: duplicates of one request on real threads, run under
each strategy (``strategy`` below), against the quick start's viewset
(tests/examples/drf_viewset.py)."""

# --8<-- [start:example]
import threading

import pytest
from django.contrib.auth.models import User
from django.db import connections
from rest_framework.test import APIClient

from . import psp
from .models import Charge

DUPLICATES = 8


@pytest.mark.django_db(
    transaction=True
)  # the threads see what the test commits
def test_duplicates_sent_at_once_charge_once(monkeypatch):
    user = User.objects.create_user("payer")
    answers = []
    duplicates_answered = threading.Event()
    real_charge = psp.charge

    def held_charge(*args, **kwargs):
        # The request that runs holds its side effect until every duplicate
        # has had its answer: they arrive while it runs, however fast or
        # loaded the machine.
        assert duplicates_answered.wait(timeout=60), (
            "the duplicates were not answered"
        )
        return real_charge(*args, **kwargs)

    monkeypatch.setattr(psp, "charge", held_charge)
    start = threading.Barrier(DUPLICATES)

    def send():
        client = APIClient()
        client.force_authenticate(user)
        start.wait()  # every thread sends at the same moment
        try:
            response = client.post(
                "/ex/viewset/charges/",
                {"amount": 500, "currency": "eur"},
                format="json",
                headers={"Idempotency-Key": "order-1"},
            )
            answers.append(response.status_code)
            if answers.count(409) == DUPLICATES - 1:
                duplicates_answered.set()
        finally:
            connections.close_all()  # this thread's own database connections

    threads = [threading.Thread(target=send) for _ in range(DUPLICATES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(answers) == [201] + [409] * (DUPLICATES - 1)
    assert Charge.objects.count() == 1  # the side effect ran once


# --8<-- [end:example]


@pytest.fixture(autouse=True, params=["db", "redis", "hybrid"])
def strategy(request: pytest.FixtureRequest):
    """In the docs the project's settings name the strategy; here each one in
    turn."""
    from django.test import override_settings

    from tests.support import services

    request.applymarker(
        pytest.mark.postgres
    )  # the threads need a database server
    if request.param == "db":
        yield "db"
        return
    request.applymarker(pytest.mark.redis)
    value = {
        "STRATEGY": request.param,
        "REDIS_URL": services.REDIS_URL,
        "REDIS_KEY_PREFIX": "docs",
    }
    with override_settings(IDEMPOTENCY=value):
        yield request.param
