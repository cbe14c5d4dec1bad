"""A gunicorn worker killed between the ``redis`` strategy's completion and its COMMIT.

The example payments API runs under gunicorn with the ``redis`` strategy on a private
``redis-server`` and PostgreSQL. The worker is killed (``tests/support/crash.py``) at one
of two points around the view's COMMIT:

* just after the response reached Redis and before COMMIT: the charge never committed, so
  the retry must not be replayed the response of a charge that does not exist (the model's
  counterexample 4, docs/how-it-works.md): the view runs again, and one charge commits;
* just after COMMIT, before the record in Redis is confirmed: the charge committed, so the
  retry is replayed and the view's body does not run again.

The payment provider's calls (``PSP_CALL_LOG``, one line per run of the view's body, outside
every transaction) and the charges are counted. A retry may meet the killed worker's
transaction before PostgreSQL has noticed its connection is gone (its outcome is then still
unknown): it is answered ``409`` and sent again.
"""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any

import pytest

from ..support.crash import kill_hook
from ..support.databases import count_rows
from ..support.example import example_server, is_replay, request, scratch_database
from ..support.redis_servers import RedisServer
from ..support.waiting import wait_until

pytestmark = [
    pytest.mark.server,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=False),
]

CHARGE = {"amount": 1999, "currency": "EUR"}


def _answered(url: str, key: str) -> tuple[int, Any]:
    """The retry's answer once it is not ``409`` (the outcome still being settled)."""
    answers: list[tuple[int, Any]] = []

    def settled() -> bool:
        answers.append(request(url, key=key, body=CHARGE, timeout=30))
        return answers[-1][0] != 409

    wait_until(settled, timeout=30)
    return answers[-1]


@pytest.mark.parametrize(
    ("point", "after", "committed"),
    [
        ("strategies.redis.strategy.RedisClaim.store", True, False),
        ("strategies.redis.strategy.RedisClaim.after_commit", False, True),
    ],
    ids=["before-commit", "after-commit"],
)
def test_a_worker_killed_around_its_commit_is_never_replayed_unless_it_committed(
    tmp_path: Path, point: str, after: bool, committed: bool
) -> None:
    flag, calls = tmp_path / "kill", tmp_path / "calls.log"
    calls.touch()
    with (
        RedisServer().start() as redis_server,
        scratch_database("postgres") as db,
        example_server(
            db,
            strategy="redis",
            lock_timeout=1,
            workers=1,
            threads=2,
            env={
                "REDIS_URL": redis_server.url,
                "PSP_CALL_LOG": str(calls),
                **kill_hook(tmp_path, point, after=after),
            },
        ) as server,
    ):
        url = server.url + "/api/charges/"
        assert request(url, key="warm", body=CHARGE)[0] == 201
        flag.touch()
        # The connection dies with the worker.
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            request(url, key="pay-1", body=CHARGE, timeout=30)
        assert not flag.exists(), server.log()
        assert len(calls.read_text().splitlines()) == 2
        assert count_rows(db, "payments_charge") == (2 if committed else 1)

        retry = _answered(url, "pay-1")
        assert retry[0] == 201, (retry, server.log())
        assert is_replay(retry) == committed, (retry, server.log())
        runs = 2 if committed else 3
        assert len(calls.read_text().splitlines()) == runs, "the body ran again only if needed"
        assert count_rows(db, "payments_charge") == 2, "one charge for pay-1"
        # And from then on, the key replays.
        again = request(url, key="pay-1", body=CHARGE, timeout=30)
        assert again[0] == 201 and is_replay(again), again
        assert again[1]["id"] == retry[1]["id"]
