"""A gunicorn worker killed between its COMMIT and the Redis publication, for real.

The example payments API runs under gunicorn with the ``hybrid`` strategy and the default
``HYBRID_DB_CHECK = "after_loss"`` on a private ``redis-server``. The worker is killed
(``tests/support/crash.py``) at ``HybridClaim.publish``, right after the view's COMMIT and
before the completed record reaches Redis. Redis lost nothing and no fallback episode was
noted; the claim's in-progress record lapses with its lease. The retry, served by the worker
gunicorn starts in its place, must be replayed from PostgreSQL: the payment provider's calls
(``PSP_CALL_LOG``, one line per run of the view's body, outside every transaction) and the
charges are counted.
"""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest
import redis

from ..support.crash import in_progress, kill_hook
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


def _quiet(client: redis.Redis) -> None:
    """No suspicion window: a server that lost nothing (the first claim found no marker)."""
    for name in client.scan_iter(match="*{hybrid}:suspect"):
        client.delete(name)


def test_a_worker_killed_after_its_commit_leaves_a_replay_not_a_second_charge(
    tmp_path: Path,
) -> None:
    flag, calls = tmp_path / "kill", tmp_path / "calls.log"
    calls.touch()
    with (
        RedisServer().start() as redis_server,
        scratch_database("postgres") as db,
        example_server(
            db,
            strategy="hybrid",
            lock_timeout=1,
            workers=1,
            threads=2,
            env={
                "REDIS_URL": redis_server.url,
                "PSP_CALL_LOG": str(calls),
                **kill_hook(tmp_path, "strategies.hybrid.HybridClaim.publish"),
            },
        ) as server,
    ):
        url = server.url + "/api/charges/"
        client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
        assert request(url, key="warm", body=CHARGE)[0] == 201  # the marker written
        _quiet(client)
        flag.touch()
        # The connection dies with the worker.
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            request(url, key="pay-1", body=CHARGE, timeout=30)
        assert not flag.exists(), server.log()
        assert count_rows(db, "payments_charge") == 2, "the killed worker's charge committed"
        assert len(calls.read_text().splitlines()) == 2
        # Its claim, in progress, lapses with its lease (LOCK_TIMEOUT 1 s).
        wait_until(lambda: in_progress(client) == 0, timeout=15)

        retry = request(url, key="pay-1", body=CHARGE, timeout=30)
        assert retry[0] == 201 and is_replay(retry), (retry, server.log())
        assert len(calls.read_text().splitlines()) == 2, "the view body ran once"
        assert count_rows(db, "payments_charge") == 2
        client.close()
