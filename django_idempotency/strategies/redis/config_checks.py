"""System checks of how the ``redis`` and ``hybrid`` strategies connect: a django-redis
Sentinel cache without its connection factory (E080), TLS files that do not exist (E081),
TLS without certificate verification (W080), a cache whose client would wait for a
reply for ever (E082), and one whose client sends a command again by itself (E083).
Nothing here connects to Redis or imports redis-py or django-redis; see docs/redis.md
("Connecting", "Sentinel", "TLS").

Without these, each mistake would surface only at the first request: django-redis
raises ``ImproperlyConfigured`` inside the request for a Sentinel client without the
Sentinel factory, and a missing CA file makes every connection fail, so that every
request falls back to the database or gets 503 for as long as the process runs.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from ...conf import conf

ID = "django_idempotency."
REDIS_STRATEGIES = {"redis", "hybrid"}
SENTINEL_FACTORY = "django_redis.pool.SentinelConnectionFactory"
#: redis-py's connection parameters that name a file to read.
TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def check_redis_connection(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E080, E081, E082, E083, W080. One of the settings' validators
    (``checks.settings.SETTINGS_VALIDATORS``): listed by the system check and, for the
    errors, enforced at start-up."""
    if not isinstance(getattr(settings, "IDEMPOTENCY", None) or {}, Mapping):
        return []  # E001 reports it
    if conf.STRATEGY not in REDIS_STRATEGIES:
        return []
    messages = _check_sentinel_cache() + _check_cache_timeouts() + _check_cache_retries()
    for where, name, value in _tls_parameters():
        messages.extend(_check_tls_parameter(where, name, value))
    return messages


def _alias_cache() -> Mapping[str, Any]:
    """The CACHES entry REDIS_CACHE_ALIAS names, or {} (E012 reports a wrong alias)."""
    alias = conf.REDIS_CACHE_ALIAS
    if not alias:
        return {}
    cache = getattr(settings, "CACHES", {}).get(alias, {})
    return cache if isinstance(cache, Mapping) else {}


def _alias_backend() -> tuple[Mapping[str, Any], Mapping[str, Any], bool] | None:
    """The cache REDIS_CACHE_ALIAS names, its OPTIONS, and whether it is django-redis's;
    None without a cache whose backend and OPTIONS can be read (E012 reports the alias)."""
    cache = _alias_cache()
    options = cache.get("OPTIONS") or {}
    if not cache.get("BACKEND") or not isinstance(options, Mapping):
        return None
    return cache, options, str(cache["BACKEND"]).startswith("django_redis.")


def _pool_kwargs(options: Mapping[str, Any], django_redis: bool) -> Mapping[str, Any]:
    """What the cache hands redis-py's connections as it is: django-redis's
    ``CONNECTION_POOL_KWARGS``, Django's own backend's ``OPTIONS``."""
    kwargs = options.get("CONNECTION_POOL_KWARGS") if django_redis else options
    return kwargs if isinstance(kwargs, Mapping) else {}


def _check_sentinel_cache() -> list[CheckMessage]:
    """E080: a django-redis ``SentinelClient`` cache needs the Sentinel connection factory
    (in its OPTIONS or DJANGO_REDIS_CONNECTION_FACTORY) and a SENTINELS list."""
    cache = _alias_cache()
    options = cache.get("OPTIONS") or {}
    if not str(cache.get("BACKEND", "")).startswith("django_redis."):
        return []
    if not str(options.get("CLIENT_CLASS", "")).endswith("SentinelClient"):
        return []
    factory = str(
        options.get("CONNECTION_FACTORY")
        or getattr(settings, "DJANGO_REDIS_CONNECTION_FACTORY", "")
        or "django_redis.pool.ConnectionFactory"
    )
    problems = []
    if not factory.endswith("SentinelConnectionFactory"):
        problems.append(f"its connection factory is {factory!r}")
    if not options.get("SENTINELS"):
        problems.append("it has no OPTIONS['SENTINELS']")
    if not problems:
        return []
    return [
        Error(
            f"The cache {conf.REDIS_CACHE_ALIAS!r} (REDIS_CACHE_ALIAS) uses django-redis's "
            f"SentinelClient, but {' and '.join(problems)}: every request would fail.",
            hint=f"Set OPTIONS['CONNECTION_FACTORY'] = {SENTINEL_FACTORY!r} and "
            "OPTIONS['SENTINELS'] = [(host, port), ...] (docs/redis.md, 'Sentinel').",
            id=ID + "E080",
        )
    ]


def _check_cache_timeouts() -> list[CheckMessage]:
    """E082: the client of the cache REDIS_CACHE_ALIAS names must time out. redis-py waits
    for a reply, and for a connection, for ever by default: a Redis that accepts
    connections and answers nothing (stopped, swapping, a half-open network path) would
    hold every request, and neither the fallback to the database nor the 503 of
    ``REDIS_FAILURE_MODE`` would ever happen. A ``REDIS_URL`` client always has
    ``REDIS_SOCKET_TIMEOUT``; a cache's has what its ``OPTIONS`` or ``LOCATION`` say."""
    found = _alias_backend()
    if found is None:
        return []
    cache, options, django_redis = found
    missing = []
    if not _cache_times_out(cache, options, django_redis):
        missing.append("no socket timeout for Redis")
    sentinel_kwargs = options.get("SENTINEL_KWARGS")
    sentinel = django_redis and str(options.get("CLIENT_CLASS", "")).endswith("SentinelClient")
    # Without SENTINEL_KWARGS, redis-py gives the sentinels the socket_* options above.
    if (
        sentinel
        and isinstance(sentinel_kwargs, Mapping)
        and not _positive(sentinel_kwargs.get("socket_timeout"))
    ):
        missing.append("no socket_timeout in OPTIONS['SENTINEL_KWARGS'] for the sentinels")
    if not missing:
        return []
    read, connect = (
        ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT")
        if django_redis
        else ("socket_timeout", "socket_connect_timeout")
    )
    return [
        Error(
            f"The cache {conf.REDIS_CACHE_ALIAS!r} (REDIS_CACHE_ALIAS) sets "
            f"{' and '.join(missing)}: a Redis that accepts connections and does not answer "
            "would hold every request for ever, and REDIS_FAILURE_MODE would never apply.",
            hint=f"Set OPTIONS[{read!r}] and OPTIONS[{connect!r}] of the cache to a few "
            "hundred milliseconds, e.g. 0.25 (docs/redis.md, 'Connecting').",
            id=ID + "E082",
        )
    ]


def _cache_times_out(
    cache: Mapping[str, Any], options: Mapping[str, Any], django_redis: bool
) -> bool:
    """Whether the cache's client reads with a socket timeout: from its OPTIONS
    (django-redis's ``SOCKET_TIMEOUT`` or ``CONNECTION_POOL_KWARGS``, Django's
    ``socket_timeout``), or from the query of every URL of its LOCATION (redis-py reads
    ``socket_timeout`` there). redis-py's connect timeout falls back to it."""
    if _positive(_pool_kwargs(options, django_redis).get("socket_timeout")) or (
        django_redis and _positive(options.get("SOCKET_TIMEOUT"))
    ):
        return True
    locations = _locations(cache)
    return bool(locations) and all(
        _positive(_query(location).get("socket_timeout")) for location in locations
    )


def _check_cache_retries() -> list[CheckMessage]:
    """E083: the client of the cache REDIS_CACHE_ALIAS names must not send a command again
    by itself. redis-py's retry sends a command whose reply timed out once more; when that
    try fails while connecting, its error is all the store sees, and the first try's
    command, which Redis may have applied, passes for one never sent: the request would
    run under the database fallback beside a claim that Redis holds. The strategies send a
    command whose outcome is unknown again themselves, with the same claim token (a
    ``REDIS_URL`` client is built without retries for this)."""
    found = _alias_backend()
    if found is None:
        return []
    cache, options, django_redis = found
    sources = [_pool_kwargs(options, django_redis)]
    sources += [_query(location) for location in _locations(cache)]
    if not any(_resends(kwargs) for kwargs in sources):
        return []
    return [
        Error(
            f"The cache {conf.REDIS_CACHE_ALIAS!r} (REDIS_CACHE_ALIAS) sends a command to "
            "Redis again by itself (retry_on_timeout, retry_on_error or a retry with "
            "retries): when the second try fails while connecting, the first one, which "
            "Redis may have applied, passes for a command never sent, and a request could "
            "run under the database fallback beside a claim that Redis holds.",
            hint="Remove them from the cache's connection options (or set 'retry': "
            "Retry(NoBackoff(), 0)): the strategies send a command whose outcome is unknown "
            "once more themselves, with the same claim token (docs/redis.md, 'Connecting').",
            id=ID + "E083",
        )
    ]


def _resends(kwargs: Mapping[str, Any]) -> bool:
    """Whether redis-py's connection made with ``kwargs`` (or a URL query's text) retries:
    a ``retry`` with retries, or, without one, ``retry_on_timeout`` or ``retry_on_error``."""
    retry = kwargs.get("retry")
    if retry is not None:
        retries = getattr(retry, "get_retries", None)
        return callable(retries) and retries() > 0
    on_timeout = kwargs.get("retry_on_timeout")
    if isinstance(on_timeout, str):
        on_timeout = on_timeout.strip().upper() not in ("", "0", "F", "FALSE", "N", "NO")
    return bool(on_timeout) or bool(kwargs.get("retry_on_error"))


def _locations(cache: Mapping[str, Any]) -> list[str]:
    """The URLs of the cache's LOCATION (a list, or a string of them separated by , or ;)."""
    locations = cache.get("LOCATION")
    if isinstance(locations, str):
        return [part for part in re.split("[;,]", locations) if part.strip()]
    if isinstance(locations, (list, tuple)):
        return [str(location) for location in locations]
    return []


def _positive(value: Any) -> bool:
    """Whether ``value`` is a positive, finite number of seconds (or its text)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return False
    return 0 < seconds < math.inf


def _query(url: Any) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query)) if isinstance(url, str) else {}


def _tls_parameters() -> Iterator[tuple[str, str, Any]]:
    """(where, name, value) of every ssl_* connection parameter the store will use: the
    query of REDIS_URL, or the cache's LOCATION query, its django-redis
    CONNECTION_POOL_KWARGS and (Django's own backend) its OPTIONS."""
    cache = _alias_cache()
    if cache:
        alias = conf.REDIS_CACHE_ALIAS
        for location in _locations(cache):
            for name, value in _query(location).items():
                yield f"CACHES[{alias!r}]['LOCATION']", name, value
        options = cache.get("OPTIONS") or {}
        pool_kwargs = options.get("CONNECTION_POOL_KWARGS") or {}
        for name, value in {**options, **pool_kwargs}.items():
            yield f"CACHES[{alias!r}]['OPTIONS']", str(name), value
    elif not conf.REDIS_CACHE_ALIAS:
        for name, value in _query(conf.REDIS_URL).items():
            yield "IDEMPOTENCY['REDIS_URL']", name, value


def _check_tls_parameter(where: str, name: str, value: Any) -> list[CheckMessage]:
    """E081: a TLS file that cannot be read; W080: certificates not verified."""
    readable = isinstance(value, str) and os.path.isfile(value) and os.access(value, os.R_OK)
    if name in TLS_FILES and isinstance(value, str) and not readable:
        return [
            Error(
                f"{name}={value!r} in {where} is not a readable file: every "
                "connection to Redis would fail its TLS handshake.",
                hint="Name the PEM file of the CA (ssl_ca_certs) or of the client's "
                "certificate and key (ssl_certfile, ssl_keyfile) as this process "
                "can read it.",
                id=ID + "E081",
            )
        ]
    # "none" in a URL, or ssl.CERT_NONE (a VerifyMode, whose name says it) in OPTIONS.
    if name == "ssl_cert_reqs" and str(getattr(value, "name", value)).lower() in {
        "none",
        "0",
        "cert_none",
    }:
        return [
            Warning(
                f"ssl_cert_reqs={value!r} in {where}: the Redis server's certificate is "
                "not verified, so anyone on the network path can answer for Redis (and "
                "replay, or refuse, any idempotency key).",
                hint="Remove ssl_cert_reqs (the default is 'required') and give the CA "
                "that signed the server's certificate in ssl_ca_certs.",
                id=ID + "W080",
            )
        ]
    return []
