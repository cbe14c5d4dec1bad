"""Which failed Redis commands did nothing and which may have been applied, on real servers:
a closed port (refused before anything is sent), a private ``redis-server`` stopped with
SIGSTOP (the command is sent and applied later, the reply never comes), a socket that never
answers (the connection never opens), and an error the server answers with."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from django_idempotency.strategies.redis.outcome import (
    RedisOutcomeUnknown,
    RedisUnavailable,
    failure,
    not_sent,
    resend_once,
)
from django_idempotency.strategies.redis.store import RedisStore, _connect

from ...support.redis_servers import Blackhole, RedisClusterNodes, RedisServer, closed_port_url
from ...support.waiting import wait_until

pytestmark = pytest.mark.redis


def _store(url: str, prefix: str, timeout: float = 0.25) -> RedisStore:
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    return RedisStore(client, prefix)


def _claim(store: RedisStore, key: str, token: str) -> tuple[bool, object]:
    return store.claim("s", key, "fp", token, 60_000)


def test_a_refused_connection_did_nothing(redis_prefix: str) -> None:
    store = _store(closed_port_url(), redis_prefix)
    with pytest.raises(RedisUnavailable) as caught:
        _claim(store, "k", uuid.uuid4().hex)
    assert not isinstance(caught.value, RedisOutcomeUnknown)


def _unknown_and_applied(store: RedisStore, paused: Any) -> str:
    """A claim sent while ``paused`` (a context manager) holds the server: its outcome is
    unknown, and it is applied once the server runs again. Its token."""
    token = uuid.uuid4().hex
    with paused, pytest.raises(RedisOutcomeUnknown):
        _claim(store, "k", token)
    # Not "nothing happened": the server read the claim once it ran again, and applied it.
    wait_until(lambda: store.get("s", "k") is not None)
    record = store.get("s", "k")
    assert record is not None and record.token == token
    return token


def test_a_claim_sent_to_a_stopped_server_is_unknown_and_applied_once_it_runs(
    running_private_redis: RedisServer, redis_prefix: str
) -> None:
    server = running_private_redis
    store = _store(server.url, redis_prefix)
    store.client.ping()  # connected: the claim itself is what is sent to the stopped server
    token = _unknown_and_applied(store, server.paused())
    # Sent again with the same token, the claim finds itself.
    won, found = _claim(store, "k", token)
    assert not won and found is not None and found.token == token  # type: ignore[attr-defined]


@pytest.mark.redis_cluster
def test_a_claim_a_cluster_client_retried_into_a_hung_connect_is_unknown(
    redis_cluster: RedisClusterNodes, redis_prefix: str
) -> None:
    """Every primary hangs: the claim is sent and its reply times out. The Cluster client
    does not send it again on a new connection (whose login would time out too, an error
    from before a command was sent that would pass for the whole outcome): unknown, and
    applied once the primaries run again."""
    client = _connect(("url", redis_cluster.url, True, 0.25))
    try:
        store = RedisStore(client, redis_prefix)
        store.get("s", "k")  # connected: the claim itself is what is sent to the stopped server
        _unknown_and_applied(store, redis_cluster.paused())
    finally:
        client.close()


def _raised_while_handling(earlier: BaseException, error: BaseException) -> BaseException:
    """``error`` as raised inside an ``except`` block that handles ``earlier``."""
    try:
        try:
            raise earlier
        except BaseException:
            raise error  # noqa: B904 (the implicit context is the point)
    except BaseException as raised:
        return raised


def test_an_unknown_outcome_stays_unknown_through_a_later_failure_to_connect() -> None:
    """The chain of errors a client's own retries leave: one sent and unanswered, then one
    while connecting again: unknown. Errors that are not Redis's in the chain (what the
    caller was handling) say nothing of the command."""
    retried = _raised_while_handling(
        TimeoutError("Timeout reading from 127.0.0.1:6379"),
        TimeoutError("Timeout connecting to server"),
    )
    assert not not_sent(retried) and isinstance(failure(retried), RedisOutcomeUnknown)
    refused = _raised_while_handling(
        ValueError("the view's own error, being handled"),
        TimeoutError("Timeout connecting to server"),
    )
    assert not_sent(refused) and not isinstance(failure(refused), RedisOutcomeUnknown)


def test_a_connection_that_never_opens_did_nothing(redis_prefix: str) -> None:
    """A socket that accepts and never answers: the connection's own first exchange times
    out, before the claim is written."""
    hole = Blackhole()
    try:
        with pytest.raises(RedisUnavailable) as caught:
            _claim(_store(hole.url, redis_prefix), "k", uuid.uuid4().hex)
    finally:
        hole.close()
    assert not isinstance(caught.value, RedisOutcomeUnknown)


def test_an_error_the_server_answers_did_nothing(shared_redis_url: str, redis_prefix: str) -> None:
    store = _store(shared_redis_url, redis_prefix, timeout=2)
    store.client.rpush(store.record_key("s", "k"), "not a record")  # WRONGTYPE for SET ... GET
    with pytest.raises(RedisUnavailable) as caught:
        _claim(store, "k", uuid.uuid4().hex)
    assert not isinstance(caught.value, RedisOutcomeUnknown)


@pytest.mark.parametrize(
    ("error", "done"),
    [
        (ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."), False),
        (TimeoutError("Timeout connecting to server"), False),
        (ResponseError("WRONGTYPE Operation against a key"), False),
        (TimeoutError("Timeout reading from 127.0.0.1:6379"), None),
        (ConnectionError("Connection closed by server."), None),
        (ConnectionError("Error 104 while writing to socket. Connection reset by peer."), None),
        (OSError("whatever the socket said"), None),
    ],
)
def test_classification(error: BaseException, done: bool | None) -> None:
    """``done`` False: nothing was done; None: unknown."""
    assert not_sent(error) is (done is False)
    assert isinstance(failure(error), RedisOutcomeUnknown) is (done is None)
    assert isinstance(failure(error), RedisUnavailable)


def test_resend_once_sends_again_only_when_the_outcome_is_unknown() -> None:
    calls: list[int] = []

    def lost_then_answered() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RedisOutcomeUnknown("Timeout reading from socket")
        return "answer"

    assert resend_once(lost_then_answered, "claim") == "answer"
    assert len(calls) == 2

    def refused() -> str:
        calls.append(1)
        raise RedisUnavailable("Connection refused")

    calls.clear()
    with pytest.raises(RedisUnavailable) as caught:
        resend_once(refused, "claim")
    assert not isinstance(caught.value, RedisOutcomeUnknown) and len(calls) == 1

    def lost_then_refused() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RedisOutcomeUnknown("Timeout reading from socket")
        raise RedisUnavailable("Connection refused")

    calls.clear()
    with pytest.raises(RedisOutcomeUnknown):  # the first one's outcome is still unknown
        resend_once(lost_then_refused, "claim")
    assert len(calls) == 2
