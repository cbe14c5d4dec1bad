"""The hybrid strategy's suspect keys: remembered in the process, marked in Redis (the shared
server, a prefix per test) once it answers, and kept pending while it does not."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis

from django_idempotency.store.suspects import SuspectRow
from django_idempotency.strategies.redis.store import RedisStore
from django_idempotency.strategies.redis.suspects import Suspects

from ...support.redis_servers import closed_port_url

pytestmark = pytest.mark.redis


def _store(url: str, prefix: str) -> RedisStore:
    return RedisStore(redis.Redis.from_url(url, socket_timeout=2), prefix)


def test_a_key_is_held_for_its_time_and_never_for_less_than_before() -> None:
    suspects = Suspects()
    assert not suspects.holds("s", "k") and not suspects.pending
    suspects.add("s", "k", 60)
    assert suspects.holds("s", "k") and suspects.pending
    assert not suspects.holds("s", "other")
    suspects.add("s", "k", 0)  # a shorter time does not shorten it
    assert suspects.holds("s", "k")
    suspects.add("s", "gone", -1)
    assert not suspects.holds("s", "gone")
    suspects.forget()
    assert not suspects.holds("s", "k") and not suspects.pending


def test_marks_wait_for_redis_and_then_live_as_long_as_their_keys(
    shared_redis_url: str, redis_prefix: str
) -> None:
    suspects = Suspects()
    suspects.add("s", "k", 60)
    down = _store(closed_port_url(), redis_prefix)
    assert not suspects.flush(down)
    assert suspects.pending, "kept until Redis takes them"
    store = _store(shared_redis_url, redis_prefix)
    assert suspects.flush(store)
    assert not suspects.pending
    assert 0 < store.client.pttl(store.suspect_key("s", "k")) <= 60_000
    assert suspects.holds("s", "k"), "the process still remembers it"
    assert suspects.flush(store), "nothing to write"


def test_the_rows_are_read_once_an_interval_by_the_process_clock() -> None:
    now = [100.0]
    suspects = Suspects(clock=lambda: now[0])
    assert suspects.read_due(), "a new process reads at its first claim"
    assert not suspects.read_due()
    now[0] += suspects.read_interval - 0.001
    assert not suspects.read_due()
    now[0] += 0.001
    assert suspects.read_due()
    suspects.forget()
    assert suspects.read_due(), "a new process again"


def test_a_row_is_settled_once_its_mark_is_written_and_a_known_key_is_marked_again(
    shared_redis_url: str, redis_prefix: str
) -> None:
    suspects = Suspects()
    store = _store(shared_redis_url, redis_prefix)
    suspects.add("s", "k", 60)
    assert suspects.flush(store) and suspects.settled() == []
    row = SuspectRow("default", "digest", datetime.now(UTC))
    suspects.add("s", "k", 30, row=row)  # read from the database: known, with a row
    assert suspects.pending, "its mark is written again, then its row deleted"
    assert not suspects.flush(_store(closed_port_url(), redis_prefix))
    assert suspects.settled() == [], "not while Redis refuses the mark"
    assert suspects.flush(store)
    assert suspects.settled() == [row]
    assert suspects.settled() == []
