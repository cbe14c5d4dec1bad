"""A view in steps whose gunicorn worker is SIGKILLed at every step boundary, for real.

The example's ``/api/stepped/charges/`` runs four steps (docs/steps.md): ``create_charge``
(a Charge row), ``call_provider`` (the fake provider, whose ledger file remembers each
downstream key across processes, as a real provider does), ``record_answer`` (a
ProviderAnswer row) and ``send_receipt`` (a Receipt row). A gunicorn config file of the
test's own wraps ``Steps.local``, ``Steps.remote`` and the provider's call in the worker
(``tests/support/kill_points.py``): when the flag file names the point reached, the worker
sends itself SIGKILL there. For each
point a fresh key is sent, the worker dies, and the retry (served by the worker gunicorn
starts in its place, once the lease has lapsed for ``db``, at once for ``advisory_lock``,
whose session lock died with the connection) must finish the charge: one row of each step,
in order, one provider charge, and a replay after that. Then duplicates of one key race from
threads on two workers. The same killed worker with no retry, finished by the completer
alone: ``tests/system/test_completer_crash.py``.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..support import kill_points
from ..support.databases import count_rows, query_scalar
from ..support.example import (
    ExampleServer,
    example_server,
    is_replay,
    race,
    request,
    scratch_database,
)
from ..support.waiting import wait_until

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.django_db(transaction=False)]

STEPS = ["create_charge", "call_provider", "record_answer", "send_receipt"]
#: One row of each local step (the remote one is counted in the provider's ledger).
ONE_EACH = {"create_charge": 1, "record_answer": 1, "send_receipt": 1}

#: Where the worker is killed: before each step (after the one before it committed), inside
#: the remote step before and after the provider's call, and after the last step (before
#: the completion).
POINTS = list(kill_points.POINTS)

#: The gunicorn config file: the worker installs the kill points once it has loaded the app.
HOOK = """
def post_worker_init(worker):
    from tests.support.kill_points import install

    install()
"""


def steps_of(db: str, key: str) -> list[str]:
    stored = query_scalar(
        db, "SELECT steps::text FROM django_idempotency_idempotencykey WHERE key = %s", (key,)
    )
    return [step["name"] for step in json.loads(stored)["done"]]


def retry(url: str, key: str, body: dict[str, Any]) -> tuple[int, Any]:
    """The retry, sent again while the key is in progress (409: the killed worker's lease
    has not lapsed yet)."""
    answers: list[tuple[int, Any]] = []

    def answered() -> bool:
        answers.append(request(url, key=key, body=body, timeout=30))
        return answers[-1][0] != 409

    wait_until(answered, timeout=60)
    return answers[-1]


def effects(db: str, amount: int) -> dict[str, int]:
    """The rows of each local step for the charges of ``amount`` (one amount per point)."""
    charges = f"SELECT id FROM payments_charge WHERE amount = {amount}"
    return {
        "create_charge": count_rows(db, "payments_charge", f"amount = {amount}"),
        "record_answer": count_rows(db, "payments_provideranswer", f"charge_id IN ({charges})"),
        "send_receipt": count_rows(db, "payments_receipt", f"charge_id IN ({charges})"),
    }


@dataclass
class Killing:
    """A scratch database and the example served by one gunicorn worker that kills itself
    where ``flag`` says (``HOOK``), with the fake provider's call log and ledger."""

    db: str
    server: ExampleServer
    flag: Path
    calls: Path
    ledger: Path
    psp: dict[str, str]


@contextmanager
def killing_server(tmp_path: Path, strategy: str) -> Iterator[Killing]:
    hook, flag = tmp_path / "hook.py", tmp_path / "kill"
    calls, ledger = tmp_path / "calls.log", tmp_path / "ledger"
    hook.write_text(HOOK)
    calls.touch()
    ledger.touch()
    psp = {"PSP_CALL_LOG": str(calls), "PSP_LEDGER": str(ledger)}
    with (
        scratch_database("postgres") as db,
        example_server(
            db,
            strategy=strategy,
            lock_timeout=1,
            workers=1,
            threads=2,
            env={**psp, "STEPS_KILL_FLAG": str(flag), "GUNICORN_CMD_ARGS": f"--config {hook}"},
        ) as server,
    ):
        yield Killing(db, server, flag, calls, ledger, psp)


@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
def test_a_worker_killed_at_every_step_boundary_leaves_one_effect_per_step(
    tmp_path: Path, strategy: str
) -> None:
    with killing_server(tmp_path, strategy) as killing:
        db, server, flag, ledger = killing.db, killing.server, killing.flag, killing.ledger
        calls = killing.calls
        url = server.url + "/api/stepped/charges/"
        for index, point in enumerate(POINTS):
            key, body = f"{strategy}-{point}", {"amount": 1000 + index, "currency": "EUR"}
            flag.write_text(point)
            with pytest.raises((ConnectionError, http.client.HTTPException)):
                request(url, key=key, body=body, timeout=60)
            assert not flag.exists(), (point, server.log())
            status, answer = retry(url, key, body)
            assert status == 201, (point, answer, server.log())
            assert effects(db, 1000 + index) == ONE_EACH, point
            assert steps_of(db, key) == STEPS, point
            reference = answer["psp_reference"]
            assert (
                query_scalar(
                    db, "SELECT psp_reference FROM payments_charge WHERE id = %s", (answer["id"],)
                )
                == reference
            )
            replay = request(url, key=key, body=body, timeout=30)
            assert replay[0] == 201 and is_replay(replay), (point, replay)
            assert replay[1]["id"] == answer["id"]
        # One provider charge per key. The call is made twice for two points only, the
        # second time with the first call's key: killed after the provider answered, and
        # killed before record_answer, whose commit records the provider's answer.
        lines = ledger.read_text().splitlines()
        assert len(lines) == len(set(lines)) == len(POINTS)
        assert len(calls.read_text().splitlines()) == len(POINTS) + 2


@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
def test_duplicates_racing_on_one_key_run_each_step_once(tmp_path: Path, strategy: str) -> None:
    ledger = tmp_path / "ledger"
    ledger.touch()
    with (
        scratch_database("postgres") as db,
        example_server(
            db,
            strategy=strategy,
            lock_timeout=30,
            workers=2,
            threads=4,
            psp_delay_ms=200,
            env={"PSP_LEDGER": str(ledger)},
        ) as server,
    ):
        url = server.url + "/api/stepped/charges/"
        body = {"amount": 4242, "currency": "EUR"}
        results = race(url, key="race-1", n=16, body=body)
        statuses = [status for status, _ in results]
        assert set(statuses) <= {201, 409}, results
        assert statuses.count(201) >= 1
        ids = {answer["id"] for status, answer in results if status == 201}
        assert len(ids) == 1, results
        assert effects(db, 4242) == ONE_EACH
        assert len(ledger.read_text().splitlines()) == 1
        assert steps_of(db, "race-1") == STEPS
