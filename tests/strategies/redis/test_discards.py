"""Pending deletions of the ``redis`` strategy's uncommitted records, on the shared Redis (a
prefix per test): kept while Redis does not answer, sent once it does, fenced by the token."""

from __future__ import annotations

import uuid

import pytest
import redis

from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.strategies.redis.discards import Discards
from django_idempotency.strategies.redis.store import RedisStore

from ...support.redis_servers import closed_port_url

pytestmark = pytest.mark.redis


def _store(url: str, prefix: str) -> RedisStore:
    return RedisStore(redis.Redis.from_url(url, socket_timeout=2), prefix)


def test_a_deletion_waits_for_redis_and_spares_another_claim(
    shared_redis_url: str, redis_prefix: str
) -> None:
    store = _store(shared_redis_url, redis_prefix)
    ours, theirs = uuid.uuid4().hex, uuid.uuid4().hex
    store.claim("s", "mine", "fp", ours, 60_000)
    assert store.complete("s", "mine", ours, StoredResponse(201, {}, b"uncommitted"), 60_000)
    store.claim("s", "other", "fp", theirs, 60_000)
    discards = Discards()
    discards.retry_interval = 3600.0  # "not yet" holds for the whole test
    discards.add("s", "mine", ours, 60)
    discards.add("s", "other", ours, 60)  # another claim holds it now: left alone
    discards.add("s", "old", ours, -1)  # its record expired anyway
    assert discards.pending
    assert discards.due("s", "anything")
    assert not discards.flush(_store(closed_port_url(), redis_prefix))
    assert discards.pending, "kept until Redis answers"
    # Not tried again before ``retry_interval``, but at once before a claim of their keys.
    assert not discards.due("s", "anything") and discards.due("s", "mine")
    assert discards.flush(store)
    assert not discards.pending
    assert store.get("s", "mine") is None
    other = store.get("s", "other")
    assert other is not None and other.token == theirs


def test_a_confirmation_waits_for_redis_too(shared_redis_url: str, redis_prefix: str) -> None:
    """A COMMIT that landed while Redis did not answer its confirmation: confirmed once it
    does, never deleted."""
    store = _store(shared_redis_url, redis_prefix)
    token = uuid.uuid4().hex
    store.claim("s", "paid", "fp", token, 60_000)
    response = StoredResponse(201, {}, b"committed")
    assert store.complete("s", "paid", token, response, 60_000, prepared=True, xid=42)
    record = store.get("s", "paid")
    assert record is not None and record.prepared and record.xid == 42
    discards = Discards()
    discards.add("s", "paid", token, 60, confirm=True)
    assert not discards.flush(_store(closed_port_url(), redis_prefix))
    assert discards.flush(store)
    assert not discards.pending
    record = store.get("s", "paid")
    assert record is not None and record.completed and record.response == response
