"""Duplicates that wait for the first request's answer (``WAIT``), through real servers.

Each strategy (``redis`` and ``hybrid`` on a node and on a Redis Cluster too) runs the
example payments API under gunicorn (3 workers x 8 threads) with a 500 ms payment call,
and every test counts the charges committed afterwards:

* 20 concurrent duplicates with ``WAIT=30``: one execution, 19 replays, no 409, none
  answered before the first request's payment call could have ended (``WAIT`` bounds a
  hang, not the machine's speed: a duplicate still waiting when it runs out gets a 409);
* the first request fails (the provider raises: a 500): one waiter runs the view, the
  others get its answer;
* ``WAIT=0.1``: the 409s as without waiting;
* the first request's worker is killed: the waiters get the takeover (or the 409) after
  the lock timeout, never a hang past ``WAIT``.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ..support.databases import count_rows
from ..support.example import (
    example_server,
    is_replay,
    race,
    race_summary,
    request,
    scratch_database,
    split_race,
)
from ..support.threads import run_at_once

pytestmark = [pytest.mark.server, pytest.mark.django_db(transaction=False)]

CHARGE = {"amount": 1999, "currency": "EUR"}
CLIENTS = 20

SETUPS = [
    pytest.param("postgres", "db", marks=pytest.mark.postgres, id="postgres-db"),
    pytest.param("postgres", "redis", marks=[pytest.mark.postgres, pytest.mark.redis], id="redis"),
    pytest.param(
        "postgres", "hybrid", marks=[pytest.mark.postgres, pytest.mark.redis], id="hybrid"
    ),
    pytest.param("sqlite", "db", id="sqlite-db"),
    pytest.param(
        "postgres", "advisory_lock", marks=pytest.mark.postgres, id="postgres-advisory_lock"
    ),
    pytest.param(
        "postgres",
        "redis-cluster",
        marks=[pytest.mark.postgres, pytest.mark.redis_cluster],
        id="redis-cluster",
    ),
    pytest.param(
        "postgres",
        "hybrid-cluster",
        marks=[pytest.mark.postgres, pytest.mark.redis_cluster],
        id="hybrid-cluster",
    ),
]


#: What the servers wait for a Redis reply, in place of the default 0.25 s (for a Redis
#: next door). On a busy machine a reply can take longer; the claim's outcome is then
#: unknown and the duplicate gets a 503 (the documented answer), which is no claim about
#: waiting.
PATIENT = "10"


def redis_env(request: pytest.FixtureRequest, strategy: str) -> dict[str, str]:
    prefix = {
        "IDEMPOTENCY_REDIS_PREFIX": "wait-" + uuid.uuid4().hex,
        "IDEMPOTENCY_REDIS_SOCKET_TIMEOUT": PATIENT,
    }
    if strategy.endswith("-cluster"):
        cluster = request.getfixturevalue("redis_cluster")
        # The wake-ups are a PUBLISH the cluster forwards to every node; the drain messages
        # go to a private server.
        private = request.getfixturevalue("running_private_redis")
        return {"REDIS_CLUSTER_URL": cluster.url, "CELERY_BROKER_URL": private.url, **prefix}
    if strategy not in ("redis", "hybrid"):
        return {}
    private = request.getfixturevalue("running_private_redis")
    return {"REDIS_URL": private.url, **prefix}


@contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="idem-wait-") as tmp:
        yield Path(tmp)


def timed_race(url: str, key: str) -> tuple[list[tuple[int, Any]], list[float]]:
    """:func:`race` of ``CLIENTS`` duplicates; also when (``time.monotonic()``) each got
    its answer."""
    answered = [0.0] * CLIENTS

    def client(index: int) -> tuple[int, Any]:
        result = request(url, key=key, body=CHARGE)
        answered[index] = time.monotonic()
        return result

    return run_at_once(CLIENTS, client, timeout=120), answered


def assert_one_answer(results: list[tuple[int, Any]]) -> Any:
    """One fresh 201, every other 201 its replay; returns the fresh body."""
    fresh, replays, _conflicts = split_race(results)
    assert len(fresh) == 1, race_summary(results)
    for body in replays:
        assert (body["id"], body["psp_reference"]) == (fresh[0]["id"], fresh[0]["psp_reference"])
    return fresh[0]


@pytest.mark.parametrize(("backend", "strategy"), SETUPS)
def test_duplicates_wait_for_the_answer(
    request: pytest.FixtureRequest, backend: str, strategy: str
) -> None:
    env = redis_env(request, strategy)
    name = strategy.removesuffix("-cluster")
    with scratch_database(backend) as db, scratch_dir() as tmp:
        marker = tmp / "fail-once"
        wait_env = {**env, "IDEMPOTENCY_WAIT": "30", "PSP_FAIL_MARKER": str(marker)}
        with example_server(db, strategy=name, psp_delay_ms=500, env=wait_env) as server:
            url = server.url + "/api/charges/"
            # 20 duplicates at once: one execution, 19 replays, no 409, each answered after
            # the first request's payment call (0.5 s) could have ended.
            released = time.monotonic()
            results, answered = timed_race(url, key="wait-ok")
            summary = race_summary(results)
            assert summary == {"201": 1, "201 replay": CLIENTS - 1}, summary
            assert_one_answer(results)
            assert count_rows(db, "payments_charge") == 1
            assert min(answered) - released >= 0.5, summary

            # The first execution fails: one waiter runs the view, the rest get its answer.
            marker.touch()
            results = race(url, n=CLIENTS, key="wait-fail", body=CHARGE)
            summary = race_summary(results)
            assert not marker.exists(), "the provider's failure did not happen"
            assert summary["500"] == 1, summary
            assert set(summary) == {"500", "201", "201 replay"}, summary
            assert summary["201 replay"] == CLIENTS - 2, summary
            assert_one_answer(results)
            assert count_rows(db, "payments_charge") == 2  # one per key, at most
            assert "409" not in summary
            log = server.log()
        # The provider's exception is the only traceback.
        assert log.count("Traceback") <= 1, log

        # A short wait: the 409s as without waiting. The provider takes 3 s, so that on a
        # loaded machine the duplicates still arrive while the first request runs.
        short_env = {**env, "IDEMPOTENCY_WAIT": "0.1"}
        with example_server(db, strategy=name, psp_delay_ms=3000, env=short_env) as server:
            results = race(server.url + "/api/charges/", n=CLIENTS, key="wait-short", body=CHARGE)
            summary = race_summary(results)
            assert summary["409"] > 0, summary
            assert set(summary) <= {"201", "201 replay", "409"}, summary
            assert_one_answer(results)
            for status, body in results:
                if status == 409:
                    assert "retry-after" in body["_headers"]
            assert count_rows(db, "payments_charge") == 3
            assert "Traceback" not in server.log()


WAIT_KILLED = 6.0
#: The killed test's payment call, in seconds.
PSP_KILLED = 2.5
#: Seconds a waiter's answer may take past its wait and the view it may run after a
#: takeover, for requests queued on a busy machine: a bound that tells a hang (the client's
#: 30 s timeout) from an answer, not a claim about speed.
HANG_MARGIN = 10.0
#: The provider's call log of the running test (which worker made each call).
CALLS: list[Path] = [Path()]

KILLED = [
    pytest.param("postgres", "db", marks=pytest.mark.postgres, id="postgres-db"),
    pytest.param("postgres", "redis", marks=[pytest.mark.postgres, pytest.mark.redis], id="redis"),
    pytest.param(
        "postgres", "hybrid", marks=[pytest.mark.postgres, pytest.mark.redis], id="hybrid"
    ),
]


@pytest.mark.parametrize(("backend", "strategy"), KILLED)
def test_waiters_survive_a_killed_first_request(
    request: pytest.FixtureRequest, backend: str, strategy: str
) -> None:
    """``kill -9`` of the worker running the first request (a 2.5 s payment call) while
    duplicates wait in another worker: once the dead lease is stale (lock timeout 1 s) one
    waiter takes the key over and the others replay its answer, or get the 409 when their
    wait runs out; none hangs past ``WAIT``."""
    with scratch_database(backend) as db, scratch_dir() as tmp:
        calls = CALLS[0] = tmp / "calls"
        env = {
            **redis_env(request, strategy),
            "IDEMPOTENCY_WAIT": str(WAIT_KILLED),
            "PSP_CALL_LOG": str(calls),
        }
        with example_server(
            db, strategy=strategy, psp_delay_ms=int(PSP_KILLED * 1000), lock_timeout=1, env=env
        ) as server:
            # gunicorn may hand every duplicate to the worker that is killed: then try again
            # with a fresh key, until some waited in a surviving worker.
            for attempt in range(1, 4):
                calls.write_text("")
                if killed_while_waiting(server.url + "/api/charges/", f"killed-{attempt}", db):
                    break
                assert count_rows(db, "payments_charge") == attempt
            else:
                pytest.fail("in three attempts every duplicate was in the killed worker")


def killed_while_waiting(url: str, key: str, db: str, wait: float = WAIT_KILLED) -> bool:
    """One run of the scenario; False when no duplicate waited outside the killed worker."""
    before = count_rows(db, "payments_charge")
    first: list[object] = []

    def doomed() -> None:
        try:
            first.append(request_(url, key))
        except OSError as exc:
            first.append(exc)

    runner = threading.Thread(target=doomed)
    runner.start()
    deadline = time.monotonic() + 60  # a hang, not a slow machine
    while not CALLS[0].read_text().strip():
        assert time.monotonic() < deadline, "the first request did not reach the view"
        time.sleep(0.02)
    victim = int(CALLS[0].read_text().split()[0])

    answers: list[tuple[float, object]] = []
    lock = threading.Lock()

    def duplicate() -> None:
        started = time.monotonic()
        try:
            answer: object = request_(url, key)
        except OSError as exc:
            answer = exc
        with lock:
            answers.append((time.monotonic() - started, answer))

    duplicates = [threading.Thread(target=duplicate) for _ in range(12)]
    for thread in duplicates:
        thread.start()
    time.sleep(0.3)  # they wait now
    os.kill(victim, signal.SIGKILL)
    runner.join(30)
    for thread in duplicates:
        thread.join(30)
    assert isinstance(first[0], OSError) or first[0][0] >= 500  # type: ignore[index]
    got: list[tuple[int, Any]] = []
    for seconds, answer in answers:
        if isinstance(answer, OSError):
            continue  # it waited in the killed worker
        assert seconds < wait + PSP_KILLED + HANG_MARGIN, f"a waiter hung for {seconds:.1f}s"
        assert isinstance(answer, tuple)
        assert answer[0] in (201, 409), answer
        got.append(answer)
    fresh = [body for code, body in got if code == 201 and not is_replay((code, body))]
    assert len(fresh) <= 1
    assert count_rows(db, "payments_charge") <= before + 1
    # A retry afterwards sees what committed (after gunicorn replaced the killed worker).
    deadline = time.monotonic() + 60  # a hang, not a slow machine
    while True:
        try:
            retry_status, retry_body = request_(url, key)
            break
        except OSError:
            assert time.monotonic() < deadline, "gunicorn did not replace the killed worker"
            time.sleep(0.2)
    assert retry_status == 201
    assert count_rows(db, "payments_charge") == before + 1
    if fresh:
        assert retry_body["id"] == fresh[0]["id"]
    return bool(got)


def request_(url: str, key: str) -> tuple[int, Any]:
    return request(url, key=key, body=CHARGE, timeout=30)
