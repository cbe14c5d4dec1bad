"""End-to-end races: real gunicorn workers, real databases, real threads on one key.

Every test counts the side effect (rows in ``payments_charge``) afterwards. The
naive SELECT-then-INSERT control runs under the same harness and double-charges,
which shows the harness can catch the bug the app prevents.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ..support.databases import count_rows, query_scalar
from ..support.example import (
    example_server,
    is_replay,
    race,
    race_summary,
    request,
    scratch_database,
)
from ..support.threads import in_background
from ..support.waiting import wait_until

pytestmark = [pytest.mark.server, pytest.mark.django_db(transaction=False)]

CHARGE = {"amount": 1999, "currency": "EUR"}
CLIENTS = 20


BACKENDS = [
    pytest.param("postgres", "db", marks=pytest.mark.postgres, id="postgres-db"),
    pytest.param(
        "postgres", "advisory_lock", marks=pytest.mark.postgres, id="postgres-advisory_lock"
    ),
    pytest.param("sqlite", "db", id="sqlite-db"),
    pytest.param("mariadb", "db", marks=pytest.mark.mariadb, id="mariadb-db"),
]


@pytest.mark.parametrize(("backend", "strategy"), BACKENDS)
def test_concurrent_retries_charge_exactly_once(backend: str, strategy: str) -> None:
    with (
        scratch_database(backend) as db,
        example_server(db, strategy=strategy, psp_delay_ms=300) as server,
    ):
        results = race(server.url + "/api/charges/", n=CLIENTS, key="pay-1", body=CHARGE)
        summary = race_summary(results)
        fresh = [
            body for status, body in results if status == 201 and not is_replay((status, body))
        ]
        assert len(fresh) == 1, summary
        assert set(summary) <= {"201", "201 replay", "409"}, summary
        if strategy == "advisory_lock":
            assert summary["409"] == 0, "duplicates wait for the lock and get the replay"
        # Every replay is the first response, byte for byte in meaning.
        for status, body in results:
            if status == 201:
                assert body["id"] == fresh[0]["id"]
                assert body["psp_reference"] == fresh[0]["psp_reference"]
        # A retry after the race replays too.
        status, body = request(server.url + "/api/charges/", key="pay-1", body=CHARGE)
        assert (status, body["id"]) == (201, fresh[0]["id"])
        assert body["_headers"]["idempotent-replayed"] == "true"
        assert count_rows(db, "payments_charge") == 1
        assert "Traceback" not in server.log()


@pytest.mark.parametrize(
    "backend",
    [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"],
)
def test_naive_select_then_insert_double_charges(backend: str, tmp_path: Path) -> None:
    """The control: the same race against hand-written SELECT-then-INSERT idempotency.
    The provider call holds until two racers have made it (``PSP_HOLD_MARKER``): both
    passed the SELECT before either inserted, however the busy machine spaced them."""
    hold, calls = tmp_path / "hold", tmp_path / "calls"
    hold.touch()
    calls.write_text("")
    env = {"PSP_HOLD_MARKER": str(hold), "PSP_CALL_LOG": str(calls)}
    with scratch_database(backend) as db, example_server(db, env=env) as server:
        url = server.url + "/baseline/naive-charges/"
        racing = in_background(lambda: race(url, n=CLIENTS, key="pay-1", body=CHARGE))
        try:
            wait_until(lambda: len(calls.read_text().split()) >= 2, timeout=60)
        finally:
            hold.unlink()
        racing.result(120)
        charges = count_rows(db, "payments_charge")
    assert charges > 1, "the harness must be able to observe a double charge"


@pytest.mark.postgres
def test_view_slower_than_lock_timeout_is_not_run_twice(tmp_path: Path) -> None:
    """The lease is renewed while the view runs, so a duplicate arriving after the lock
    timeout gets 409 instead of taking the key over and charging again. The provider call
    lasts until the test ends it (``PSP_HOLD_MARKER``), and the duplicates are sent once
    the claim is older than the lock timeout and its lease was renewed since (the
    database's clock), however long a busy machine takes to get there."""
    hold, calls = tmp_path / "hold", tmp_path / "calls"
    hold.touch()
    calls.write_text("")
    env = {"PSP_HOLD_MARKER": str(hold), "PSP_CALL_LOG": str(calls)}
    with (
        scratch_database("postgres") as db,
        example_server(db, lock_timeout=1, env=env) as server,
    ):
        url = server.url + "/api/charges/"
        first: list[tuple[int, Any]] = []
        runner = threading.Thread(
            target=lambda: first.append(request(url, key="slow", body=CHARGE))
        )
        runner.start()
        try:
            wait_until(lambda: bool(calls.read_text().strip()), timeout=60)  # in the view
            wait_until(lambda: _renewed_past_the_lock_timeout(db, "slow", 1), timeout=60)
            during = [request(url, key="slow", body=CHARGE) for _ in range(3)]
        finally:
            hold.unlink()
        runner.join(60)
        after = request(url, key="slow", body=CHARGE)
        # None took the key over: each came while the provider call ran.
        for status, body in during:
            assert status == 409 and body["_headers"].get("retry-after"), (status, body)
        assert first[0][0] == 201 and not is_replay(first[0])
        assert after[0] == 201 and is_replay(after)
        assert after[1]["id"] == first[0][1]["id"]
        assert count_rows(db, "payments_charge") == 1
        assert len(calls.read_text().split()) == 1  # one provider call
        assert "Traceback" not in server.log()


def _renewed_past_the_lock_timeout(db: str, key: str, lock_timeout: float) -> bool:
    """Whether ``key``'s claim is older than ``lock_timeout`` and its lease was renewed
    after the first one would have lapsed: a takeover now would be the bug."""
    return bool(
        query_scalar(
            db,
            "SELECT count(*) FROM django_idempotency_idempotencykey WHERE key = %s "
            "AND created_at < now() - make_interval(secs => %s) "
            "AND locked_at > created_at + make_interval(secs => %s)",
            (key, lock_timeout, lock_timeout),
        )
    )
