"""The Redis store against real Redis servers: the shared one (DB 15, a prefix per test)
and a private ``redis-server`` for what must not happen to the shared one."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.status import COMPLETED, IN_PROGRESS
from django_idempotency.strategies.redis import store as redis_store
from django_idempotency.strategies.redis.store import (
    RedisRecord,
    RedisStore,
    RedisUnavailable,
    decode_record,
    encode_record,
    get_client,
    get_store,
)

from ...support.redis_servers import Blackhole, RedisServer, closed_port_url
from ...support.threads import in_background, run_at_once
from ...support.waiting import wait_until

pytestmark = pytest.mark.redis

RESPONSE = StoredResponse(
    status=201,
    headers={"Content-Type": "application/json", "Location": "/charges/7/"},
    body=b'{"id": 7}\x00\xff binary tail',
)


def _client(url: str, timeout: float = 0.25) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


@pytest.fixture
def store(shared_redis_url: str, redis_prefix: str) -> RedisStore:
    return RedisStore(_client(shared_redis_url, 2), redis_prefix)


@pytest.fixture(params=[True, False], ids=["set-nx-get", "set-nx-then-get"])
def either_store(request: pytest.FixtureRequest, store: RedisStore) -> RedisStore:
    """Both claim paths: ``SET NX GET`` (Redis 7) and ``SET NX`` followed by ``GET``."""
    store._set_nx_get = None if request.param else False
    return store


def _token() -> str:
    return uuid.uuid4().hex


# -- claim, replay, mismatch, in progress ------------------------------------------------------


def test_first_claim_wins_and_a_duplicate_sees_the_holder(either_store: RedisStore) -> None:
    store = either_store
    first, second = _token(), _token()
    assert store.claim("user:1", "k1", "fp-a", first, 5000) == (True, None)
    won, record = store.claim("user:1", "k1", "fp-a", second, 5000)
    assert not won
    assert record == RedisRecord(IN_PROGRESS, "fp-a", first, None)
    # The lease is the PX of the one SET.
    assert 4000 < store.pttl("user:1", "k1") <= 5000


def test_completed_key_is_replayed_with_the_stored_response(either_store: RedisStore) -> None:
    store = either_store
    token = _token()
    assert store.claim("user:1", "k2", "fp", token, 5000)[0]
    assert store.complete("user:1", "k2", token, RESPONSE, 60_000)
    won, record = store.claim("user:1", "k2", "fp", _token(), 5000)
    assert not won and record is not None
    assert record.status == COMPLETED and record.completed
    assert record.response == RESPONSE  # binary body and headers survive
    assert record.fingerprint == "fp"
    # The completed record lives the TTL, not the lease.
    assert 55_000 < store.pttl("user:1", "k2") <= 60_000
    assert store.get("user:1", "k2") == record


def test_a_different_request_sees_the_original_fingerprint(store: RedisStore) -> None:
    token = _token()
    store.claim("user:1", "k3", "fp-original", token, 5000)
    _, record = store.claim("user:1", "k3", "fp-other", _token(), 5000)
    assert record is not None and record.fingerprint == "fp-original"


def test_scopes_do_not_share_keys(store: RedisStore) -> None:
    assert store.claim("user:1", "same", "fp", _token(), 5000)[0]
    assert store.claim("user:2", "same", "fp", _token(), 5000)[0]
    assert store.record_key("user:1", "same") != store.record_key("user:2", "same")


def test_get_of_an_unknown_key_is_none(store: RedisStore) -> None:
    assert store.get("user:1", "never-claimed") is None
    assert store.pttl("user:1", "never-claimed") == -2


def test_put_completed_refills_a_record(store: RedisStore) -> None:
    store.put_completed("user:1", "refill", "fp", RESPONSE, 30_000)
    record = store.get("user:1", "refill")
    assert record is not None and record.completed and record.response == RESPONSE
    # Unconditional: it overwrites an in-progress claim too.
    token = _token()
    store.claim("user:1", "refill2", "fp", token, 5000)
    store.put_completed("user:1", "refill2", "fp", RESPONSE, 30_000)
    assert store.get("user:1", "refill2").completed  # type: ignore[union-attr]
    assert not store.complete("user:1", "refill2", token, RESPONSE, 30_000)


# -- token fencing ----------------------------------------------------------------------------


def test_renew_extends_only_the_holders_lease(store: RedisStore) -> None:
    token = _token()
    store.claim("user:1", "renew", "fp", token, 1000)
    assert not store.renew("user:1", "renew", _token(), 60_000)
    assert store.pttl("user:1", "renew") <= 1000
    assert store.renew("user:1", "renew", token, 60_000)
    assert store.pttl("user:1", "renew") > 50_000
    # A completed record is not shortened back to a lease by a late heartbeat.
    assert store.complete("user:1", "renew", token, RESPONSE, 600_000)
    assert not store.renew("user:1", "renew", token, 1000)
    assert store.pttl("user:1", "renew") > 500_000


def _claim_checking(store: RedisStore, key: str, token: str, held_ms: int = 60_000) -> Any:
    return store.claim_checking_loss(
        "user:1",
        key,
        "fp",
        token,
        1000,
        loss_keys=store.loss_keys(),
        window_ms=60_000,
        interval_ms=60_000,
        held_ms=held_ms,
    )


def test_a_claim_that_takes_a_key_over_is_told_by_the_held_mark(either_store: RedisStore) -> None:
    """The claim script writes the key's held mark, and a later claim that wins the key
    while the mark lives (the first owner's lease lapsed, or it released) answers 3, where a
    new key answers 0; the holder's renewal extends the mark, another token's does not."""
    store = either_store
    _claim_checking(store, "warm", _token())  # the marker written (a first check: 2)
    store.client.delete(store.loss_keys()[2])  # and no suspicion window: a quiet server
    first = _token()
    won, _record, check = _claim_checking(store, "held", first, held_ms=1500)
    assert won and check.verdict == 0
    held = store.held_key("user:1", "held")
    assert 0 < store.client.pttl(held) <= 1500
    assert not store.renew("user:1", "held", _token(), 1000, held_ms=600_000)
    assert store.client.pttl(held) <= 1500
    assert store.renew("user:1", "held", first, 1000, held_ms=600_000)
    assert store.client.pttl(held) > 500_000
    store.client.delete(store.record_key("user:1", "held"))  # the lease lapsed
    won, _record, check = _claim_checking(store, "held", _token())
    assert won and check.verdict == 3
    assert store.client.pttl(held) > 50_000  # written again by this claim


def test_complete_and_release_need_the_claim_token(store: RedisStore) -> None:
    token = _token()
    store.claim("user:1", "cas", "fp", token, 5000)
    assert not store.complete("user:1", "cas", _token(), RESPONSE, 60_000)
    assert not store.release("user:1", "cas", _token())
    assert store.get("user:1", "cas") == RedisRecord(IN_PROGRESS, "fp", token, None)
    assert store.release("user:1", "cas", token)
    assert store.get("user:1", "cas") is None
    assert not store.complete("user:1", "cas", token, RESPONSE, 60_000), "nothing to complete"


def test_release_never_deletes_a_completed_record(store: RedisStore) -> None:
    token = _token()
    store.claim("user:1", "done", "fp", token, 5000)
    assert store.complete("user:1", "done", token, RESPONSE, 60_000)
    assert not store.release("user:1", "done", token), "a completed record is not released"
    record = store.get("user:1", "done")
    assert record is not None and record.completed and record.response == RESPONSE


def test_a_completion_sent_again_finds_its_own_work_done(store: RedisStore) -> None:
    """The completion of a claim whose first reply never came (its outcome unknown) is sent
    again: it answers success, and the record keeps what the first one stored."""
    token = _token()
    store.claim("user:1", "twice", "fp", token, 5000)
    assert store.complete("user:1", "twice", token, RESPONSE, 60_000)
    other = StoredResponse(status=500, body=b"not this one")
    assert store.complete("user:1", "twice", token, other, 60_000)
    record = store.get("user:1", "twice")
    assert record is not None and record.completed and record.response == RESPONSE
    assert not store.complete("user:1", "twice", _token(), RESPONSE, 60_000), "another token"


def test_an_owner_can_discard_its_own_completion(store: RedisStore) -> None:
    token = _token()
    store.claim("user:1", "undo", "fp", token, 5000)
    assert store.complete("user:1", "undo", token, RESPONSE, 60_000)
    assert not store.complete("user:1", "undo", _token(), RESPONSE, 60_000)
    assert not store.discard("user:1", "undo", _token())
    assert store.discard("user:1", "undo", token)
    assert store.get("user:1", "undo") is None


def test_stale_owner_is_fenced_off_after_expiry_and_takeover(store: RedisStore) -> None:
    old, new = _token(), _token()
    assert store.claim("user:1", "fence", "fp", old, 100)[0]
    time.sleep(0.25)  # the old owner stalls past its lease
    assert store.get("user:1", "fence") is None
    assert store.claim("user:1", "fence", "fp", new, 5000)[0]
    stale = StoredResponse(status=201, body=b"stale")
    assert not store.renew("user:1", "fence", old, 5000)
    assert not store.complete("user:1", "fence", old, stale, 60_000)
    assert not store.release("user:1", "fence", old)
    assert store.get("user:1", "fence") == RedisRecord(IN_PROGRESS, "fp", new, None)
    assert store.complete("user:1", "fence", new, RESPONSE, 60_000)
    assert not store.release("user:1", "fence", old)
    record = store.get("user:1", "fence")
    assert record is not None and record.response == RESPONSE and record.token == new


def test_racing_claims_and_completions_have_one_winner(
    shared_redis_url: str, redis_prefix: str
) -> None:
    # A client per thread: separate connections, so the commands really interleave in Redis.
    stores = [RedisStore(_client(shared_redis_url, 2), redis_prefix) for _ in range(20)]
    tokens = [_token() for _ in stores]
    claims = run_at_once(20, lambda i: stores[i].claim("user:1", "race", "fp", tokens[i], 5000))
    winners = [i for i, (won, _) in enumerate(claims) if won]
    assert len(winners) == 1
    assert all(
        record is not None and record.token == tokens[winners[0]]
        for won, record in claims
        if not won
    )
    responses = [StoredResponse(status=201, body=str(i).encode()) for i in range(20)]
    done = run_at_once(
        20, lambda i: stores[i].complete("user:1", "race", tokens[i], responses[i], 60_000)
    )
    assert [i for i, ok in enumerate(done) if ok] == winners
    record = stores[0].get("user:1", "race")
    assert record is not None and record.response == responses[winners[0]]


# -- keys and values -----------------------------------------------------------------------------


def test_record_key_carries_one_hash_tag_per_scope_and_key(store: RedisStore) -> None:
    name = store.record_key("user:1", "k")
    prefix, tag, suffix = (
        name.partition("{")[0],
        name[name.index("{") : name.index("}") + 1],
        name.rpartition("}")[2],
    )
    assert prefix == f"{store.prefix}:" and suffix == ":rec"
    assert len(tag) == 34 and all(c in "0123456789abcdef" for c in tag[1:-1])
    # Every key of this (scope, key) hashes to the slot of its tag alone...
    assert key_slot(name.encode()) == key_slot(tag.encode())
    assert key_slot(f"{store.prefix}:{tag}:outbox".encode()) == key_slot(name.encode())
    # ... and the key is stable for any prefix, different for another scope or key.
    assert RedisStore(store.client, "other").record_key("user:1", "k").endswith(tag + ":rec")
    assert store.record_key("user:2", "k") != name and store.record_key("user:1", "k2") != name


def test_values_are_compact_json_that_round_trips() -> None:
    record = RedisRecord(COMPLETED, "f" * 64, "t" * 32, RESPONSE)
    raw = encode_record(record)
    assert b" " not in raw.replace(b"binary tail", b"")
    assert raw.startswith(b'{"s":"completed","f":"')
    assert decode_record(raw) == record
    assert decode_record(raw.decode()) == record
    assert decode_record(b"not json") is None
    assert decode_record(b'{"s": 1}') is None


def test_a_foreign_value_under_the_key_is_never_overwritten(store: RedisStore) -> None:
    name = store.record_key("user:1", "foreign")
    store.client.set(name, b"something else", px=5000)
    assert store.claim("user:1", "foreign", "fp", _token(), 5000) == (False, None)
    assert not store.complete("user:1", "foreign", "", RESPONSE, 5000)
    assert not store.release("user:1", "foreign", "")
    assert store.client.get(name) == b"something else"


# -- clients from the settings -----------------------------------------------------------------


def test_get_client_is_built_once_per_url_with_the_socket_timeout(
    settings: Any, shared_redis_url: str, redis_prefix: str
) -> None:
    settings.IDEMPOTENCY = {
        "REDIS_URL": shared_redis_url,
        "REDIS_SOCKET_TIMEOUT": 0.3,
        "REDIS_KEY_PREFIX": redis_prefix,
    }
    try:
        client = get_client()
        assert isinstance(client, redis.Redis)
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 0.3 and kwargs["socket_connect_timeout"] == 0.3
        assert get_client() is client
        assert get_store() is get_store() and get_store().prefix == redis_prefix
        assert client.ping()
    finally:
        redis_store.reset_clients()


def test_a_changed_socket_timeout_gets_a_client_of_its_own(
    settings: Any, shared_redis_url: str, redis_prefix: str
) -> None:
    """A client built before (by any earlier request of the process) is not handed out
    under another ``REDIS_SOCKET_TIMEOUT``: the timeout is part of what makes a client."""
    settings.IDEMPOTENCY = {"REDIS_URL": shared_redis_url, "REDIS_SOCKET_TIMEOUT": 0.25}
    try:
        before = get_client()
        settings.IDEMPOTENCY = {"REDIS_URL": shared_redis_url, "REDIS_SOCKET_TIMEOUT": 0.3}
        after = get_client()
        assert isinstance(before, redis.Redis) and isinstance(after, redis.Redis)
        assert after is not before
        assert after.connection_pool.connection_kwargs["socket_timeout"] == 0.3
        assert before.connection_pool.connection_kwargs["socket_timeout"] == 0.25
    finally:
        redis_store.reset_clients()


def test_clients_for_a_hung_cluster_are_built_side_by_side(settings: Any) -> None:
    """A Cluster client reads the topology when it is built. With the cluster hung (its
    port accepts, nothing answers), requests arriving together each wait for their own
    attempt, side by side, not for the attempts of every request before them one after
    the other (a lock held while connecting would make the n-th wait n timeouts). Seen
    on the hung port: four connections open at once."""
    hole = Blackhole()
    settings.IDEMPOTENCY = {
        "REDIS_URL": hole.url,
        "REDIS_CLUSTER": True,
        "REDIS_SOCKET_TIMEOUT": 60,
    }
    attempts = [in_background(get_client) for _ in range(4)]
    seen = [0]
    try:

        def all_connected() -> bool:
            seen[0] += hole.connections()
            return seen[0] >= 4

        wait_until(all_connected, timeout=50)
    finally:
        hole.close()  # every attempt fails now: its connection is closed, the port refuses
        for attempt in attempts:
            with pytest.raises(RedisUnavailable):
                attempt.result(timeout=60)
        redis_store.reset_clients()


def test_get_client_uses_a_django_redis_cache(
    settings: Any, shared_redis_url: str, redis_prefix: str
) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "idem": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": shared_redis_url},
    }
    settings.IDEMPOTENCY = {"REDIS_CACHE_ALIAS": "idem", "REDIS_KEY_PREFIX": redis_prefix}
    try:
        from django_redis import get_redis_connection

        client = get_client()
        assert client is get_redis_connection("idem")
        store = get_store()
        token = _token()
        assert store.claim("user:1", "via-cache", "fp", token, 5000)[0]
        assert store.complete("user:1", "via-cache", token, RESPONSE, 5000)
        assert store.get("user:1", "via-cache").response == RESPONSE  # type: ignore[union-attr]
    finally:
        redis_store.reset_clients()


@pytest.mark.parametrize("config", ["url", "django-cache"])
def test_url_and_djangos_own_redis_cache_need_no_django_redis(
    config: str,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    shared_redis_url: str,
    redis_prefix: str,
) -> None:
    """``REDIS_URL`` and a cache of Django's built-in Redis backend work with redis-py alone
    (the ``[redis]`` extra): django_redis cannot be imported here."""
    monkeypatch.setitem(sys.modules, "django_redis", None)  # `import django_redis` fails
    if config == "url":
        settings.IDEMPOTENCY = {"REDIS_URL": shared_redis_url, "REDIS_KEY_PREFIX": redis_prefix}
    else:
        # Two servers: Django's backend writes to the first and reads from the others; the
        # store must get the write client (the second one has nothing listening).
        settings.CACHES = {
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "idem": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": f"{shared_redis_url},{closed_port_url()}",
                "OPTIONS": {"socket_timeout": 0.4, "socket_connect_timeout": 0.4},
            },
        }
        settings.IDEMPOTENCY = {"REDIS_CACHE_ALIAS": "idem", "REDIS_KEY_PREFIX": redis_prefix}
    try:
        client = get_client()
        assert isinstance(client, redis.Redis)
        assert get_client() is client
        if config == "django-cache":
            kwargs = client.connection_pool.connection_kwargs
            assert kwargs["socket_timeout"] == 0.4  # the cache's own OPTIONS
        store = get_store()
        token = _token()
        assert store.claim("user:1", "builtin", "fp", token, 5000) == (True, None)
        assert store.renew("user:1", "builtin", token, 5000)
        assert store.complete("user:1", "builtin", token, RESPONSE, 5000)
        assert store.get("user:1", "builtin").response == RESPONSE  # type: ignore[union-attr]
    finally:
        redis_store.reset_clients()


def test_get_client_without_settings_is_improperly_configured(settings: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    settings.IDEMPOTENCY = {"STRATEGY": "redis"}
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL"):
        get_client()


# -- when Redis fails --------------------------------------------------------------------------


def _every_operation(store: RedisStore) -> list[Callable[[], Any]]:
    return [
        lambda: store.claim("s", "k", "fp", "t", 1000),
        lambda: store.renew("s", "k", "t", 1000),
        lambda: store.complete("s", "k", "t", RESPONSE, 1000),
        lambda: store.release("s", "k", "t"),
        lambda: store.put_completed("s", "k", "fp", RESPONSE, 1000),
        lambda: store.get("s", "k"),
    ]


def test_refused_connection_raises_redis_unavailable_at_once() -> None:
    store = RedisStore(_client(closed_port_url()), "down")
    for operation in _every_operation(store):
        started = time.monotonic()
        with pytest.raises(RedisUnavailable) as info:
            operation()
        # Refused is answered without a wait: no retry with back-off, no socket timeout (a
        # wide bound, which only a wait would break, not a busy machine).
        assert time.monotonic() - started < 10
        assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_a_hung_server_costs_one_socket_timeout_per_call() -> None:
    """Each call waits for the socket timeout, once: one connection, never retried (the
    count, not a stopwatch, says so; the waiting is at least the timeout)."""
    hole = Blackhole()
    try:
        store = RedisStore(_client(hole.url, 0.2), "hung")
        for operation in _every_operation(store):
            started = time.monotonic()
            with pytest.raises(RedisUnavailable):
                operation()
            assert time.monotonic() - started >= 0.2
            assert hole.connections() == 1, operation
    finally:
        hole.close()


def test_killed_server_then_restarted_without_persistence(
    running_private_redis: RedisServer,
) -> None:
    server = running_private_redis
    store = RedisStore(_client(server.url), "restart")
    token = _token()
    assert store.claim("user:1", "k", "fp", token, 60_000)[0]
    server.kill()
    with pytest.raises(RedisUnavailable):
        store.complete("user:1", "k", token, RESPONSE, 60_000)
    server.start()
    # The same client reconnects; the key is gone with the unsaved data.
    assert store.get("user:1", "k") is None
    assert not store.complete("user:1", "k", token, RESPONSE, 60_000)
    assert store.claim("user:1", "k", "fp", _token(), 60_000)[0]


def test_scripts_are_loaded_again_after_script_flush(running_private_redis: RedisServer) -> None:
    client = _client(running_private_redis.url)
    store = RedisStore(client, "scripts")
    token = _token()
    store.claim("user:1", "k", "fp", token, 5000)
    assert store.renew("user:1", "k", token, 5000)
    client.script_flush()
    assert client.script_exists(store._renew.sha) == [False]
    assert store.renew("user:1", "k", token, 5000)  # NOSCRIPT -> SCRIPT LOAD -> EVALSHA
    assert store.complete("user:1", "k", token, RESPONSE, 5000)
    assert client.script_exists(store._renew.sha, store._complete.sha) == [True, True]
