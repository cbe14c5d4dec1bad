"""The completer alone (docs/steps.md, "The completer") finishes a charge whose gunicorn
worker was SIGKILLed at every step boundary, for real, with no retry from its client.

The example's ``/api/stepped/charges/`` declares ``completer=True``; the worker kills itself
where the flag file says (``test_steps_crash.HOOK``), the test waits for its lease (1 s) to
lapse on the database's clock, and ``manage.py complete_idempotency_keys`` runs in a process
of its own (``COMPLETER_AFTER = 0``) until the key is completed: one row of each local step,
the steps recorded in order, one provider charge per key, and the client's later request is
a replay. A charge killed before its first step (nothing done, nothing kept) is left to its
client. Then the completer racing the client's retries on one charge killed mid-way.
"""

from __future__ import annotations

import functools
import http.client
from pathlib import Path
from typing import Any

import pytest

from ..support.databases import query_scalar
from ..support.example import is_replay, manage, request, server_settings
from ..support.threads import run_at_once
from ..support.waiting import wait_until
from .test_steps_crash import ONE_EACH, POINTS, STEPS, effects, killing_server, retry, steps_of

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.django_db(transaction=False)]


def _status(db: str, key: str) -> str:
    sql = "SELECT status FROM django_idempotency_idempotencykey WHERE key = %s"
    return str(query_scalar(db, sql, (key,)))


def _lapsed(db: str, key: str) -> bool:
    """Whether the key's lease (1 s) has lapsed, on the database's clock; True when it has
    no row (under ``advisory_lock`` the claim's row commits with the first step)."""
    return bool(
        query_scalar(
            db,
            "SELECT coalesce(bool_and(locked_at < now() - interval '1 second'), true) "
            "FROM django_idempotency_idempotencykey WHERE key = %s",
            (key,),
        )
    )


@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
def test_the_completer_alone_finishes_a_charge_killed_at_every_step_boundary(
    tmp_path: Path, strategy: str
) -> None:
    with killing_server(tmp_path, strategy) as killing:
        db, server, flag, ledger = killing.db, killing.server, killing.flag, killing.ledger
        completer = server_settings(
            strategy, 0, 1, {**killing.psp, "IDEMPOTENCY_COMPLETER_AFTER": "0"}
        )
        url = server.url + "/api/stepped/charges/"

        def killed_at(point: str, key: str, body: dict[str, Any]) -> None:
            flag.write_text(point)
            with pytest.raises((ConnectionError, http.client.HTTPException)):
                request(url, key=key, body=body, timeout=60)
            assert not flag.exists(), (point, server.log())
            wait_until(lambda: _lapsed(db, key), timeout=60)

        def completed(key: str) -> bool:
            manage(db, "complete_idempotency_keys", env=completer)
            return _status(db, key) == "completed"

        for index, point in enumerate(POINTS):
            key, body = f"c-{strategy}-{point}", {"amount": 2000 + index, "currency": "EUR"}
            killed_at(point, key, body)
            if point == "before:create_charge":
                # Nothing done, nothing kept: the completer leaves it to its client.
                assert not completed(key)
                status, _answer = retry(url, key, body)
                assert status == 201, (point, server.log())
            else:
                wait_until(functools.partial(completed, key), timeout=120, interval=0.2)
            assert effects(db, 2000 + index) == ONE_EACH, point
            assert steps_of(db, key) == STEPS, point
            replay = request(url, key=key, body=body, timeout=30)
            assert replay[0] == 201 and is_replay(replay), (point, replay)

        # The completer racing the client's retries, on one charge killed mid-way.
        key, body = f"c-{strategy}-race", {"amount": 2999, "currency": "EUR"}
        killed_at("before:record_answer", key, body)

        def work(index: int) -> Any:
            if index == 0:
                return manage(db, "complete_idempotency_keys", env=completer)
            return request(url, key=key, body=body, timeout=60)[0]

        results = run_at_once(4, work)
        assert set(results[1:]) <= {201, 409}, results
        wait_until(lambda: completed(key), timeout=120, interval=0.2)
        assert effects(db, 2999) == ONE_EACH
        assert steps_of(db, key) == STEPS
        # One provider charge per key (the call is made twice for two points, with the
        # first call's key, as with client retries).
        lines = ledger.read_text().splitlines()
        assert len(lines) == len(set(lines)) == len(POINTS) + 1
