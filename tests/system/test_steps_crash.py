"""A view in steps whose gunicorn worker is SIGKILLed at every step boundary, for real.

The example's ``/api/stepped/charges/`` runs four steps (docs/steps.md): ``create_charge``
(a Charge row), ``call_provider`` (the fake provider, whose ledger file remembers each
downstream key across processes, as a real provider does), ``record_answer`` (a
ProviderAnswer row) and ``send_receipt`` (a Receipt row). A gunicorn config file of the
test's own wraps ``Steps.local``, ``Steps.remote`` and the provider's call in the worker:
when the flag file names the point reached, the worker sends itself SIGKILL there. For each
point a fresh key is sent, the worker dies, and the retry (served by the worker gunicorn
starts in its place, once the lease has lapsed for ``db``, at once for ``advisory_lock``,
whose session lock died with the connection) must finish the charge: one row of each step,
in order, one provider charge, and a replay after that. Then the same with no retry: the
completer (``manage.py complete_idempotency_keys``, in a process of its own) finishes each
charge alone, and once racing the client's retries. Then duplicates of one key race from
threads on two workers.
"""

from __future__ import annotations

import functools
import http.client
import json
from pathlib import Path
from typing import Any

import pytest

from ..support.databases import count_rows, query_scalar
from ..support.example import (
    example_server,
    is_replay,
    manage,
    race,
    request,
    scratch_database,
    server_settings,
)
from ..support.threads import run_at_once
from ..support.waiting import wait_until

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.django_db(transaction=False)]

STEPS = ["create_charge", "call_provider", "record_answer", "send_receipt"]
#: One row of each local step (the remote one is counted in the provider's ledger).
ONE_EACH = {"create_charge": 1, "record_answer": 1, "send_receipt": 1}

#: Where the worker is killed: before each step (after the one before it committed), inside
#: the remote step before and after the provider's call, and after the last step (before
#: the completion).
POINTS = [
    "before:create_charge",
    "before:call_provider",
    "provider:before",
    "provider:after",
    "before:record_answer",
    "before:send_receipt",
    "after:send_receipt",
]

HOOK = """
import os
import signal
from pathlib import Path

FLAG = Path(os.environ["STEPS_KILL_FLAG"])


def _kill_at(point):
    try:
        if FLAG.read_text() != point:
            return
    except FileNotFoundError:
        return
    FLAG.unlink()
    os.kill(os.getpid(), signal.SIGKILL)


def post_worker_init(worker):
    from django_idempotency.protocol.steps import Steps
    from example_project.payments import psp

    def wrapped(method):
        def step(self, name, fn, *args, **kwargs):
            _kill_at("before:" + name)
            result = method(self, name, fn, *args, **kwargs)
            _kill_at("after:" + name)
            return result

        return step

    Steps.local = wrapped(Steps.local)
    Steps.remote = wrapped(Steps.remote)
    charge = psp.charge

    def killed_charge(*args, **kwargs):
        _kill_at("provider:before")
        result = charge(*args, **kwargs)
        _kill_at("provider:after")
        return result

    psp.charge = killed_charge
"""


def _steps_of(db: str, key: str) -> list[str]:
    stored = query_scalar(
        db, "SELECT steps::text FROM django_idempotency_idempotencykey WHERE key = %s", (key,)
    )
    return [step["name"] for step in json.loads(stored)["done"]]


def _retry(url: str, key: str, body: dict[str, Any]) -> tuple[int, Any]:
    """The retry, sent again while the key is in progress (409: the killed worker's lease
    has not lapsed yet)."""
    answers: list[tuple[int, Any]] = []

    def answered() -> bool:
        answers.append(request(url, key=key, body=body, timeout=30))
        return answers[-1][0] != 409

    wait_until(answered, timeout=60)
    return answers[-1]


def _effects(db: str, amount: int) -> dict[str, int]:
    """The rows of each local step for the charges of ``amount`` (one amount per point)."""
    charges = f"SELECT id FROM payments_charge WHERE amount = {amount}"
    return {
        "create_charge": count_rows(db, "payments_charge", f"amount = {amount}"),
        "record_answer": count_rows(db, "payments_provideranswer", f"charge_id IN ({charges})"),
        "send_receipt": count_rows(db, "payments_receipt", f"charge_id IN ({charges})"),
    }


@pytest.mark.parametrize("strategy", ["db", "advisory_lock"])
def test_a_worker_killed_at_every_step_boundary_leaves_one_effect_per_step(
    tmp_path: Path, strategy: str
) -> None:
    hook, flag = tmp_path / "hook.py", tmp_path / "kill"
    calls, ledger = tmp_path / "calls.log", tmp_path / "ledger"
    hook.write_text(HOOK)
    calls.touch()
    ledger.touch()
    with (
        scratch_database("postgres") as db,
        example_server(
            db,
            strategy=strategy,
            lock_timeout=1,
            workers=1,
            threads=2,
            env={
                "PSP_CALL_LOG": str(calls),
                "PSP_LEDGER": str(ledger),
                "STEPS_KILL_FLAG": str(flag),
                "GUNICORN_CMD_ARGS": f"--config {hook}",
            },
        ) as server,
    ):
        url = server.url + "/api/stepped/charges/"
        for index, point in enumerate(POINTS):
            key, body = f"{strategy}-{point}", {"amount": 1000 + index, "currency": "EUR"}
            flag.write_text(point)
            with pytest.raises((ConnectionError, http.client.HTTPException)):
                request(url, key=key, body=body, timeout=60)
            assert not flag.exists(), (point, server.log())
            status, answer = _retry(url, key, body)
            assert status == 201, (point, answer, server.log())
            assert _effects(db, 1000 + index) == ONE_EACH, point
            assert _steps_of(db, key) == STEPS, point
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
        assert _effects(db, 4242) == ONE_EACH
        assert len(ledger.read_text().splitlines()) == 1
        assert _steps_of(db, "race-1") == STEPS


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
    hook, flag = tmp_path / "hook.py", tmp_path / "kill"
    calls, ledger = tmp_path / "calls.log", tmp_path / "ledger"
    hook.write_text(HOOK)
    calls.touch()
    ledger.touch()
    psp = {"PSP_CALL_LOG": str(calls), "PSP_LEDGER": str(ledger)}
    completer = server_settings(strategy, 0, 1, {**psp, "IDEMPOTENCY_COMPLETER_AFTER": "0"})
    with (
        scratch_database("postgres") as db,
        example_server(
            db,
            strategy=strategy,
            lock_timeout=1,
            workers=1,
            threads=2,
            env={
                **psp,
                "STEPS_KILL_FLAG": str(flag),
                "GUNICORN_CMD_ARGS": f"--config {hook}",
            },
        ) as server,
    ):
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
                status, _answer = _retry(url, key, body)
                assert status == 201, (point, server.log())
            else:
                wait_until(functools.partial(completed, key), timeout=120, interval=0.2)
            assert _effects(db, 2000 + index) == ONE_EACH, point
            assert _steps_of(db, key) == STEPS, point
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
        assert _effects(db, 2999) == ONE_EACH
        assert _steps_of(db, key) == STEPS
        # One provider charge per key (the call is made twice for two points, with the
        # first call's key, as with client retries).
        lines = ledger.read_text().splitlines()
        assert len(lines) == len(set(lines)) == len(POINTS) + 1
