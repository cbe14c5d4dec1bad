"""Keys a server handled without Redis outlive that server, for real.

The example payments API runs under gunicorn with the ``hybrid`` strategy and the default
``HYBRID_DB_CHECK = "after_loss"``. A first server cannot reach Redis (its URL is a closed
port, while the private ``redis-server`` runs on, losing nothing): its charges fall back to
the ``db`` strategy and complete in PostgreSQL. It stops before it ever reaches Redis again,
taking what it remembered with it. A new server that reaches Redis gets the retries: they
must be replayed from PostgreSQL (the ``IdempotencySuspect`` rows the first server wrote),
not run again. The payment provider's calls (``PSP_CALL_LOG``, one line per run of the
view's body, outside every transaction) and the charges are counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from ..support.databases import count_rows
from ..support.example import example_server, is_replay, request, scratch_database
from ..support.redis_servers import RedisServer, closed_port_url
from .test_publish_crash import CHARGE, _quiet

pytestmark = [
    pytest.mark.server,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=False),
]

SUSPECTS = "django_idempotency_idempotencysuspect"


def test_keys_that_fell_back_are_replayed_by_the_server_started_after(tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    calls.touch()
    keys = ["pay-1", "pay-2"]
    with RedisServer().start() as redis_server, scratch_database("postgres") as db:
        env = {"REDIS_URL": redis_server.url, "PSP_CALL_LOG": str(calls)}
        client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
        with example_server(db, strategy="hybrid", workers=1, threads=2, env=env) as server:
            assert request(server.url + "/api/charges/", key="warm", body=CHARGE)[0] == 201
        _quiet(client)  # Redis lost nothing: the loss check has nothing to report

        refused = {**env, "REDIS_URL": closed_port_url()}
        with example_server(db, strategy="hybrid", workers=2, threads=2, env=refused) as server:
            first = {
                key: request(server.url + "/api/charges/", key=key, body=CHARGE) for key in keys
            }
        assert all(answer[0] == 201 for answer in first.values()), first
        assert count_rows(db, SUSPECTS) == 2, "noted in the database"

        with example_server(db, strategy="hybrid", workers=2, threads=2, env=env) as server:
            for key in keys:
                retry = request(server.url + "/api/charges/", key=key, body=CHARGE)
                assert retry[0] == 201 and is_replay(retry), (retry, server.log())
                assert retry[1]["id"] == first[key][1]["id"]
        assert len(calls.read_text().splitlines()) == 3, "each charge's body ran once"
        assert count_rows(db, "payments_charge") == 3
        assert count_rows(db, SUSPECTS) == 0, "marked in Redis, then deleted"
        client.close()
