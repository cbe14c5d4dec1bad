"""A completion the ``redis`` strategy finds *prepared*: settled with the database.

The records are written as the strategy writes them before COMMIT (``RedisStore.complete``
with ``prepared``), naming transactions of a second PostgreSQL session of the test's own:
committed, rolled back, or still open. Only a committed one is replayed; a rolled-back one
is deleted and the key claimed again; an open one is in progress; one whose outcome the
database cannot tell is a 503 with ``Retry-After``, never a replay or a run.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from rest_framework.test import APIClient

from django_idempotency.errors import StoreUnavailable
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.sql import xact
from django_idempotency.strategies.base import Attempt, InProgress, Mismatch, Replay
from django_idempotency.strategies.redis.store import get_store, new_token, redis_scope, to_ms
from django_idempotency.strategies.redis.strategy import RedisClaim, RedisStrategy

from ...support import services
from ...support.api import post_json
from ...support.redis_servers import RedisServer
from ...support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

_URL = services.POSTGRES_URL.replace("postgres://", "postgresql://", 1)
RESPONSE = StoredResponse(201, {"Content-Type": "application/json"}, b'{"id": 7}')


@pytest.fixture
def on_shared_redis(redis_settings: Any, shared_redis_url: str) -> dict[str, Any]:
    return redis_settings(shared_redis_url)


@pytest.fixture
def other_session() -> Iterator[psycopg.Connection[Any]]:
    """A second session on the cluster (transaction ids are the cluster's)."""
    with psycopg.connect(_URL) as conn:
        yield conn


def _attempt(fingerprint: str = "fp") -> Attempt:
    return Attempt(
        scope="user:1",
        key=uuid.uuid4().hex,
        fingerprint=fingerprint,
        ttl=60,
        lock_timeout=5,
        method="POST",
        path="/t/",
        atomic=True,
    )


def _xid(session: psycopg.Connection[Any], end: str | None) -> int:
    """The id of a transaction of ``session``, then ended with ``end`` (None: left open)."""
    row = session.execute("SELECT txid_current()").fetchone()
    assert row is not None
    if end == "commit":
        session.commit()
    elif end == "rollback":
        session.rollback()
    return int(row[0])


def _prepare(attempt: Attempt, xid: int | None, fingerprint: str = "fp") -> str:
    """A prepared record of ``attempt``'s key, as an owner leaves it before its COMMIT."""
    store, token = get_store(), new_token()
    assert store.claim(redis_scope(attempt), attempt.key, fingerprint, token, 5000)[0]
    assert store.complete(
        redis_scope(attempt), attempt.key, token, RESPONSE, to_ms(60), prepared=True, xid=xid
    )
    return token


def test_a_committed_transaction_is_replayed_and_confirmed(
    on_shared_redis: Any, other_session: psycopg.Connection[Any]
) -> None:
    attempt = _attempt()
    _prepare(attempt, _xid(other_session, "commit"))
    outcome = RedisStrategy().claim(attempt)
    assert isinstance(outcome, Replay) and outcome.response == RESPONSE
    record = get_store().get(redis_scope(attempt), attempt.key)
    assert record is not None and record.completed, "confirmed for the next retry"
    assert 0 < get_store().pttl(redis_scope(attempt), attempt.key) <= 60_000


def test_a_rolled_back_transaction_is_deleted_and_the_key_claimed_again(
    on_shared_redis: Any, other_session: psycopg.Connection[Any]
) -> None:
    attempt = _attempt()
    token = _prepare(attempt, _xid(other_session, "rollback"))
    outcome = RedisStrategy().claim(attempt)
    assert isinstance(outcome, RedisClaim) and outcome.token != token
    assert outcome.release()


def test_a_session_that_died_before_its_commit_counts_as_rolled_back(
    on_shared_redis: Any,
) -> None:
    from django.db import connection

    attempt = _attempt()
    dead = psycopg.connect(_URL)
    xid = _xid(dead, None)
    dead.close()  # the session ends with its transaction open (no COMMIT is sent)
    _prepare(attempt, xid)
    # Once its backend has exited, PostgreSQL counts the transaction as rolled back.
    wait_until(lambda: xact.transaction_outcome(connection, xid) != xact.IN_PROGRESS)
    assert isinstance(RedisStrategy().claim(attempt), RedisClaim)


def test_an_open_transaction_is_in_progress(
    on_shared_redis: Any, other_session: psycopg.Connection[Any]
) -> None:
    attempt = _attempt()
    _prepare(attempt, _xid(other_session, None))
    assert isinstance(RedisStrategy().claim(attempt), InProgress)
    assert isinstance(RedisStrategy().claim(_attempt_like(attempt, "other")), Mismatch)
    other_session.commit()
    assert isinstance(RedisStrategy().claim(attempt), Replay)


def _attempt_like(attempt: Attempt, fingerprint: str) -> Attempt:
    return Attempt(**{**attempt.__dict__, "fingerprint": fingerprint})


def test_an_outcome_the_database_cannot_tell_is_a_503_not_a_replay(on_shared_redis: Any) -> None:
    attempt = _attempt()
    _prepare(attempt, None)
    with pytest.raises(StoreUnavailable) as raised:
        RedisStrategy().claim(attempt)
    assert raised.value.retry_after is not None
    record = get_store().get(redis_scope(attempt), attempt.key)
    assert record is not None and record.prepared, "kept: it may have committed"


def test_the_transaction_outcome_on_postgresql(other_session: psycopg.Connection[Any]) -> None:
    from django.db import connection

    committed, rolled_back = _xid(other_session, "commit"), _xid(other_session, "rollback")
    assert xact.transaction_outcome(connection, committed) == xact.COMMITTED
    assert xact.transaction_outcome(connection, rolled_back) == xact.ABORTED
    assert xact.transaction_outcome(connection, _xid(other_session, None)) == xact.IN_PROGRESS
    assert xact.transaction_outcome(connection, None) == xact.UNKNOWN


def _calls(client: redis.Redis) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


@pytest.mark.parametrize("wait", [0, 2])
def test_what_a_new_key_costs_in_redis(
    api: APIClient, redis_settings: Any, running_private_redis: RedisServer, wait: float
) -> None:
    """A new key: three round trips, the claim (``SET``), the prepared completion and its
    confirmation (two ``EVALSHA``); with ``WAIT``, the confirmation publishes the wake-up in
    its script (no round trip of its own). Counted by the private server (``INFO
    commandstats``), which counts the scripts' own commands too: the completion's ``GET``
    and ``SET``, the confirmation's ``GET`` and ``SET`` (and ``PUBLISH``)."""
    redis_settings(running_private_redis.url, WAIT=wait)
    client = redis.Redis.from_url(running_private_redis.url)
    assert post_json(api, uuid.uuid4().hex, {"amount": 1}).status_code == 201  # scripts loaded
    client.config_resetstat()
    assert post_json(api, uuid.uuid4().hex, {"amount": 1}).status_code == 201
    calls = _calls(client)
    calls.pop("info", None)  # ours
    calls.pop("config|resetstat", None)
    commands = {name: n for name, n in calls.items() if not name.startswith(("client", "hello"))}
    in_scripts = {"get": 2, "set": 2, **({"publish": 1} if wait else {})}
    sent = Counter(commands) - Counter(in_scripts)
    assert sent == {"set": 1, "evalsha": 2}, calls
    assert Counter(commands) - sent == in_scripts, calls
    client.close()


def _stored_in(atomic_work: Any) -> tuple[Any, int | None]:
    """A claim completed as the lifecycle does at the end of a view run in a transaction
    with ``atomic_work`` done in it: (the record in Redis before COMMIT, the id PostgreSQL
    gave that transaction, None if none)."""
    from django.db import connection, transaction

    attempt = _attempt()
    claim = RedisStrategy().claim(attempt)
    assert isinstance(claim, RedisClaim)
    with transaction.atomic():
        atomic_work()
        claim.store(RESPONSE, commit=True)
        record = get_store().get(redis_scope(attempt), attempt.key)
        with connection.cursor() as cursor:
            cursor.execute("SELECT txid_current_if_assigned()")
            xid = cursor.fetchone()[0]
    claim.after_commit()
    confirmed = get_store().get(redis_scope(attempt), attempt.key)
    assert confirmed is not None and confirmed.completed
    return record, xid


def test_a_transaction_that_wrote_is_named_by_the_prepared_record(on_shared_redis: Any) -> None:
    from ...testapp.models import SideEffect

    record, xid = _stored_in(lambda: SideEffect.objects.create(label="written"))
    assert record.prepared and xid is not None and record.xid == xid


def test_a_transaction_that_wrote_nothing_is_completed_at_once_and_given_no_id(
    on_shared_redis: Any,
) -> None:
    """Nothing for its COMMIT to make durable or lose: the record is stored completed, and
    the transaction is not made a write (no id, no commit record) to name it."""
    from ...testapp.models import SideEffect

    record, xid = _stored_in(lambda: SideEffect.objects.exists())
    assert record.completed and xid is None
