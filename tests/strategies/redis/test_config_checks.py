"""The system checks of the Redis connection
(django_idempotency.strategies.redis.config_checks): a Sentinel cache without its factory
(E080), unreadable TLS files (E081), unverified TLS (W080), a cache without a socket
timeout (E082), a cache whose client sends a command again by itself (E083).
The recipes of docs/redis.md pass them."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.checks import CheckMessage, run_checks
from django.test import override_settings
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError
from redis.retry import Retry

from django_idempotency.checks.settings import ensure_valid
from django_idempotency.strategies.redis.config_checks import check_redis_connection

from ...support.docs import recipe


def ids(messages: list[CheckMessage]) -> list[str]:
    return [m.id or "" for m in messages]


def checked(idempotency: dict[str, Any], caches: dict[str, Any] | None = None) -> list[str]:
    more = {} if caches is None else {"CACHES": {"default": {}, **caches}}
    with override_settings(IDEMPOTENCY=idempotency, **more):
        messages = check_redis_connection()
    assert all(m.hint for m in messages)
    return ids(messages)


def sentinel_cache(**options: Any) -> dict[str, Any]:
    """The docs' Sentinel cache, its OPTIONS changed by ``options`` (None removes one)."""
    cache = recipe("redis.md", "Sentinel", 0)["CACHES"]["idempotency"]
    merged = {**cache["OPTIONS"], **options}
    cache["OPTIONS"] = {k: v for k, v in merged.items() if v is not None}
    return cache


ALIAS = {"STRATEGY": "redis", "REDIS_CACHE_ALIAS": "idempotency"}


def test_the_sentinel_recipe_passes() -> None:
    namespace = recipe("redis.md", "Sentinel", 0)
    assert checked(namespace["IDEMPOTENCY"], namespace["CACHES"]) == []


def test_e080_sentinel_client_without_the_sentinel_factory() -> None:
    assert checked(ALIAS, {"idempotency": sentinel_cache(CONNECTION_FACTORY=None)}) == [
        "django_idempotency.E080"
    ]


def test_e080_is_satisfied_by_the_global_django_redis_factory(settings: Any) -> None:
    settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
    assert checked(ALIAS, {"idempotency": sentinel_cache(CONNECTION_FACTORY=None)}) == []


def test_e080_sentinel_client_without_sentinels() -> None:
    assert checked(ALIAS, {"idempotency": sentinel_cache(SENTINELS=None)}) == [
        "django_idempotency.E080"
    ]


def test_e080_only_for_the_redis_strategies() -> None:
    caches = {"idempotency": sentinel_cache(CONNECTION_FACTORY=None)}
    assert checked({**ALIAS, "STRATEGY": "db"}, caches) == []


def test_e080_stops_manage_py_check(settings: Any) -> None:
    """A Sentinel cache without the factory would fail every request; the check makes
    start-up fail instead (run_checks is what runserver, migrate and check call)."""
    caches = {**settings.CACHES, "idempotency": sentinel_cache(CONNECTION_FACTORY=None)}
    with override_settings(IDEMPOTENCY=ALIAS, CACHES=caches):
        assert "django_idempotency.E080" in ids(run_checks())


def test_the_tls_recipes_pass_when_their_files_exist(tmp_path: Path) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("PEM")
    for index in range(3):
        namespace = recipe("redis.md", "TLS", index, {"/etc/redis/tls/": f"{tmp_path}/"})
        assert checked(namespace["IDEMPOTENCY"], namespace.get("CACHES")) == [], index


@pytest.mark.parametrize("index", [0, 1, 2], ids=["url", "django-redis", "django"])
def test_e081_a_tls_file_that_does_not_exist(tmp_path: Path, index: int) -> None:
    (tmp_path / "ca.pem").write_text("PEM")
    (tmp_path / "client.pem").write_text("PEM")  # client.key is missing
    namespace = recipe("redis.md", "TLS", index, {"/etc/redis/tls/": f"{tmp_path}/"})
    assert checked(namespace["IDEMPOTENCY"], namespace.get("CACHES")) == ["django_idempotency.E081"]


def test_e081_in_a_cache_location_query(tmp_path: Path) -> None:
    cache = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"rediss://r:6380/0?ssl_ca_certs={tmp_path}/nowhere.pem",
        "OPTIONS": {"SOCKET_TIMEOUT": 0.25},
    }
    assert checked(ALIAS, {"idempotency": cache}) == ["django_idempotency.E081"]


@pytest.mark.parametrize("value", ["none", "NONE", ssl.CERT_NONE])
def test_w080_certificates_not_verified(value: Any) -> None:
    cache = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "rediss://r:6380/0",
        "OPTIONS": {"ssl_cert_reqs": value, "socket_timeout": 0.25},
    }
    assert checked(ALIAS, {"idempotency": cache}) == ["django_idempotency.W080"]
    url = {"STRATEGY": "hybrid", "REDIS_URL": "rediss://r:6380/0?ssl_cert_reqs=none"}
    assert checked(url) == ["django_idempotency.W080"]


def test_the_url_is_ignored_when_a_cache_alias_wins(tmp_path: Path) -> None:
    cache = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://r:6379/0",
        "OPTIONS": {"SOCKET_TIMEOUT": 0.25},
    }
    settings = {**ALIAS, "REDIS_URL": f"rediss://r/0?ssl_ca_certs={tmp_path}/nowhere.pem"}
    assert checked(settings, {"idempotency": cache}) == []


def test_e080_stops_the_process_like_the_other_settings_errors() -> None:
    """The Redis connection's errors are enforced with the settings' (start-up, first use):
    a Sentinel cache without its factory would otherwise fail every request with a 500."""
    from django_idempotency.errors import InvalidConfiguration

    caches = {"default": {}, "idempotency": sentinel_cache(CONNECTION_FACTORY=None)}
    with (
        override_settings(CACHES=caches, IDEMPOTENCY=dict(ALIAS)),
        pytest.raises(InvalidConfiguration, match=r"django_idempotency\.E080"),
    ):
        ensure_valid()
    ensure_valid()  # the test settings again: valid


# -- E082: a cache whose client would wait for ever ------------------------------------------

DJANGO_REDIS = "django_redis.cache.RedisCache"
DJANGO_CACHE = "django.core.cache.backends.redis.RedisCache"

#: Caches whose client reads with a socket timeout, in each place redis-py takes it from
#: (a host each: django-redis keeps one pool per URL in the process).
TIMED = {
    "django-redis-options": {
        "BACKEND": DJANGO_REDIS,
        "LOCATION": "redis://timed-1:6379/0",
        "OPTIONS": {"SOCKET_TIMEOUT": 0.25},
    },
    "django-redis-pool-kwargs": {
        "BACKEND": DJANGO_REDIS,
        "LOCATION": "redis://timed-2:6379/0",
        "OPTIONS": {"CONNECTION_POOL_KWARGS": {"socket_timeout": 0.25}},
    },
    "django-redis-query": {
        "BACKEND": DJANGO_REDIS,
        "LOCATION": "redis://timed-3:6379/0?socket_timeout=0.25",
    },
    "django-options": {
        "BACKEND": DJANGO_CACHE,
        "LOCATION": "redis://timed-4:6379/0",
        "OPTIONS": {"socket_timeout": 0.25},
    },
    "django-queries": {
        "BACKEND": DJANGO_CACHE,
        "LOCATION": "redis://timed-5:6379/0?socket_timeout=0.25,redis://timed-6:6379/0?socket_timeout=0.5",
    },
}


def _cache(backend: str, host: str = "r", **options: Any) -> dict[str, Any]:
    return {"BACKEND": backend, "LOCATION": f"redis://{host}:6379/0", "OPTIONS": options}


#: Caches whose client would wait for a reply for ever.
UNTIMED = {
    "django-redis-bare": {"BACKEND": DJANGO_REDIS, "LOCATION": "redis://r:6379/0"},
    # django-redis's names in Django's backend, and the other way round, are not read.
    "django-redis-lowercase": _cache(DJANGO_REDIS, socket_timeout=0.25),
    "django-uppercase": _cache(DJANGO_CACHE, SOCKET_TIMEOUT=0.25),
    "connect-timeout-only": _cache(DJANGO_REDIS, SOCKET_CONNECT_TIMEOUT=0.25),
    "zero": _cache(DJANGO_CACHE, socket_timeout=0),
    "one-of-two-locations": {
        "BACKEND": DJANGO_CACHE,
        "LOCATION": ["redis://r:6379/0?socket_timeout=0.25", "redis://s:6379/0"],
    },
}


@pytest.mark.parametrize("name", sorted(TIMED))
def test_a_cache_with_a_socket_timeout_passes(name: str) -> None:
    assert checked(ALIAS, {"idempotency": TIMED[name]}) == []


@pytest.mark.parametrize("name", sorted(UNTIMED))
def test_e082_a_cache_without_a_socket_timeout(name: str) -> None:
    assert checked(ALIAS, {"idempotency": UNTIMED[name]}) == ["django_idempotency.E082"]
    assert checked({**ALIAS, "STRATEGY": "hybrid"}, {"idempotency": UNTIMED[name]}) == [
        "django_idempotency.E082"
    ]
    assert checked({**ALIAS, "STRATEGY": "db"}, {"idempotency": UNTIMED[name]}) == []


@pytest.mark.parametrize("name", sorted(TIMED))
def test_what_e082_accepts_is_what_redis_py_reads(name: str) -> None:
    """The client the store takes from each accepted cache (built, not connected) has the
    timeout: the check reads the settings as django-redis, Django and redis-py do."""
    from django.core.cache import caches

    from django_idempotency.strategies.redis.store import _cache_client

    with override_settings(CACHES={"default": {}, "idempotency": TIMED[name]}):
        try:
            client = _cache_client("idempotency")
            assert isinstance(client, redis.Redis)
            timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
            assert timeout is not None and timeout > 0
        finally:
            caches["idempotency"].close()


def test_e082_the_sentinels_need_a_timeout_of_their_own_when_given_kwargs() -> None:
    """Without SENTINEL_KWARGS redis-py gives the sentinels the cache's socket options; with
    them, only theirs: a sentinel that hangs would hold every discovery of the master."""
    untimed = {"socket_connect_timeout": 0.25}
    assert checked(ALIAS, {"idempotency": sentinel_cache(SENTINEL_KWARGS=untimed)}) == [
        "django_idempotency.E082"
    ]
    assert checked(ALIAS, {"idempotency": sentinel_cache(SENTINEL_KWARGS=None)}) == []
    bare = sentinel_cache(SOCKET_TIMEOUT=None, SOCKET_CONNECT_TIMEOUT=None)
    assert checked(ALIAS, {"idempotency": bare}) == ["django_idempotency.E082"]


def test_e082_stops_the_process_like_the_other_settings_errors() -> None:
    from django_idempotency.errors import InvalidConfiguration

    caches = {"default": {}, "idempotency": UNTIMED["django-redis-bare"]}
    with (
        override_settings(CACHES=caches, IDEMPOTENCY=dict(ALIAS)),
        pytest.raises(InvalidConfiguration, match=r"django_idempotency\.E082"),
    ):
        ensure_valid()
    ensure_valid()


# -- E083: a cache whose client sends a command again by itself --------------------------------


def _with(backend: str, host: str = "r", **connection: Any) -> dict[str, Any]:
    """A cache of ``backend`` with a socket timeout and ``connection`` options where the
    backend passes them to redis-py's connections."""
    if backend == DJANGO_REDIS:
        return _cache(backend, host, SOCKET_TIMEOUT=0.25, CONNECTION_POOL_KWARGS=connection)
    return _cache(backend, host, socket_timeout=0.25, **connection)


RESENDING: dict[str, dict[str, Any]] = {
    "retry-on-timeout": {"retry_on_timeout": True},
    "retry-on-error": {"retry_on_error": [ConnectionError]},
    "a-retry-with-retries": {"retry": Retry(ExponentialBackoff(), 3)},
}


@pytest.mark.parametrize("backend", [DJANGO_REDIS, DJANGO_CACHE])
@pytest.mark.parametrize("name", sorted(RESENDING))
def test_e083_a_cache_whose_client_sends_a_command_again(backend: str, name: str) -> None:
    cache = _with(backend, **RESENDING[name])
    assert checked(ALIAS, {"idempotency": cache}) == ["django_idempotency.E083"]


@pytest.mark.parametrize("backend", [DJANGO_REDIS, DJANGO_CACHE])
def test_e083_a_retry_without_retries_passes(backend: str) -> None:
    """The docs' advice: ``Retry(NoBackoff(), 0)`` sends nothing twice, even with
    ``retry_on_timeout`` beside it."""
    cache = _with(backend, retry=Retry(NoBackoff(), 0), retry_on_timeout=True)
    assert checked(ALIAS, {"idempotency": cache}) == []
    assert checked(ALIAS, {"idempotency": _with(backend, retry_on_timeout=False)}) == []


@pytest.mark.parametrize("query", ["retry_on_timeout=true", "retry_on_error=TimeoutError"])
def test_e083_in_a_location_query(query: str) -> None:
    cache = {"BACKEND": DJANGO_CACHE, "LOCATION": f"redis://r:6379/0?socket_timeout=0.25&{query}"}
    assert checked(ALIAS, {"idempotency": cache}) == ["django_idempotency.E083"]
    cache["LOCATION"] = "redis://r:6379/0?socket_timeout=0.25&retry_on_timeout=false"
    assert checked(ALIAS, {"idempotency": cache}) == []


@pytest.mark.parametrize("name", sorted(RESENDING))
def test_what_e083_refuses_redis_py_retries(name: str) -> None:
    """The connection redis-py makes for each refused cache (built, not connected) retries
    a failed command, and the one it makes for an accepted cache does not: the check reads
    the options as redis-py does."""
    from django.core.cache import caches

    from django_idempotency.strategies.redis.store import _cache_client

    # django-redis keeps one pool per URL in the process: a host of this test's own.
    host = f"e083-{name}"
    for cache, resends in [
        (_with(DJANGO_CACHE, host, **RESENDING[name]), True),
        (_with(DJANGO_REDIS, host, **RESENDING[name]), True),
        (_with(DJANGO_CACHE, host, retry=Retry(NoBackoff(), 0), retry_on_timeout=True), False),
        (TIMED["django-options"], False),
    ]:
        with override_settings(CACHES={"default": {}, "idempotency": cache}):
            try:
                client = _cache_client("idempotency")
                assert isinstance(client, redis.Redis)
                connection = client.connection_pool.make_connection()
                retries = connection.retry.get_retries()  # type: ignore[attr-defined]
                assert (retries > 0) is resends, cache
            finally:
                caches["idempotency"].close()
