"""Redis fixtures (a pytest plugin loaded by ``tests/conftest.py``).

* ``redis_prefix``: a key prefix unique to the test; its keys are deleted afterwards
  (the shared Redis is never flushed).
* ``shared_redis_url``: the shared test Redis (DB 15).
* ``private_redis``: a private ``redis-server`` for the session, which tests may kill and
  restart (``private_redis.kill()`` / ``.start()``); it is stopped at the end.
* ``redis_cluster``: a private 6-node Redis Cluster (3 primaries, 3 replicas) for the session.
* ``proxied_redis_cluster``: another, whose clients reach each node through a proxy.
* ``redis_settings``: a callable that points ``IDEMPOTENCY`` at a Redis and returns the dict.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from . import services
from .redis_servers import RedisClusterNodes, RedisServer, delete_prefix


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    prefix = f"idemtest-{uuid.uuid4().hex[:12]}"
    yield prefix
    delete_prefix(services.REDIS_URL, prefix)


@pytest.fixture(scope="session")
def shared_redis_url() -> str:
    return services.REDIS_URL


@pytest.fixture(scope="session")
def private_redis() -> Iterator[RedisServer]:
    with RedisServer().start() as server:
        yield server


@pytest.fixture
def running_private_redis(private_redis: RedisServer) -> RedisServer:
    """The private server, started again if an earlier test killed it."""
    if not private_redis.running:
        private_redis.start()
    return private_redis


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterNodes]:
    cluster = RedisClusterNodes().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def proxied_redis_cluster() -> Iterator[RedisClusterNodes]:
    """A cluster whose clients reach each node through a proxy (``silenced()``)."""
    cluster = RedisClusterNodes(proxied=True).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_settings(settings: Any, redis_prefix: str) -> Iterator[Callable[..., dict[str, Any]]]:
    """``redis_settings(url, **more)`` sets IDEMPOTENCY for the redis strategy on ``url``."""
    from django_idempotency.strategies.redis import store as redis_store

    def apply(url: str, **more: Any) -> dict[str, Any]:
        value: dict[str, Any] = {
            "STRATEGY": "redis",
            "REDIS_URL": url,
            "REDIS_KEY_PREFIX": redis_prefix,
            "REDIS_SOCKET_TIMEOUT": 0.25,
            **more,
        }
        settings.IDEMPOTENCY = value
        return value

    yield apply
    redis_store.reset_clients()
