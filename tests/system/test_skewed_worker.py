"""An app server whose clock is off, for real: gunicorn under libfaketime.

The example payments API runs under gunicorn with ``LD_PRELOAD`` of Debian's libfaketime and
``FAKETIME="-90s"``: every call of its own to the system clock is 90 s behind, while
PostgreSQL and Redis keep theirs. Under ``hybrid`` with ``TTL`` 60, a completion whose
outbox row was stamped by the worker's clock would be expired at birth; after a Redis
``FLUSHALL`` (which ``hybrid`` is meant to absorb), the retry would find no live record and
charge again. Charges are counted in the database.
"""

from __future__ import annotations

import pytest

from ..support.databases import count_rows
from ..support.example import example_server, is_replay, request, scratch_database
from ..support.faketime import skewed
from ..support.redis_servers import RedisServer

pytestmark = [
    pytest.mark.server,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.faketime,
    pytest.mark.django_db(transaction=False),
]

CHARGE = {"amount": 1999, "currency": "EUR"}


@pytest.mark.parametrize("offset", ["-90s", "+90s"], ids=["worker-behind-90s", "worker-ahead-90s"])
def test_a_skewed_worker_replays_after_a_redis_flush(offset: str) -> None:
    with (
        RedisServer().start() as redis_server,
        scratch_database("postgres") as db,
        example_server(
            db,
            strategy="hybrid",
            workers=1,
            threads=2,
            env={**skewed(offset), "REDIS_URL": redis_server.url, "IDEMPOTENCY_TTL": "60"},
        ) as server,
    ):
        url = server.url + "/api/charges/"
        first = request(url, key="pay-1", body=CHARGE)
        assert first[0] == 201, first
        redis_server.cli("FLUSHALL")
        retry = request(url, key="pay-1", body=CHARGE)
        assert retry[0] == 201 and is_replay(retry), retry
        assert retry[1]["id"] == first[1]["id"]
        again = request(url, key="pay-1", body=CHARGE)  # refilled into Redis for its TTL
        assert again[0] == 201 and is_replay(again), again
        assert count_rows(db, "payments_charge") == 1, server.log()
