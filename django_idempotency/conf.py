"""Settings, read lazily from ``settings.IDEMPOTENCY``.

Each value is computed on first use and kept until a setting changes (Django's
``setting_changed`` signal, which ``override_settings`` and pytest-django's
``settings`` fixture send), so ``override_settings(IDEMPOTENCY={...})`` takes effect
at once, in tests too, and a request reads each value as one attribute lookup. No
default is ever written back into ``settings``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

#: Every key of the ``IDEMPOTENCY`` dict, with its default.
DEFAULTS: Mapping[str, Any] = {
    # Which strategy claims keys: "db", "advisory_lock", "redis", "hybrid",
    # or the dotted path of a Strategy subclass.
    "STRATEGY": "db",
    # The database alias that holds IdempotencyKey (and the view's writes).
    "DATABASE": "default",
    # Every alias that holds keys when the data is sharded over several databases (DATABASE
    # among them); None: DATABASE alone.
    "KEY_DATABASES": None,
    # How a request's key database is chosen among KEY_DATABASES: None (always DATABASE),
    # "router" (DATABASE_ROUTERS' db_for_write for IdempotencyKey), or the dotted path of a
    # callable ``(request) -> alias``.
    "DATABASE_ROUTING": None,
    # Other aliases a protected view may write to outside the protection (writes there
    # commit on their own); a write to any other alias is refused (503).
    "UNPROTECTED_DATABASES": (),
    # The request header that carries the key.
    "HEADER": "Idempotency-Key",
    # A top-level field of a JSON request body that carries the key too ("idempotency_key",
    # as Square's API takes it); None: the key is read from the header only.
    "KEY_BODY_FIELD": None,
    # HTTP methods that honour the header, unless a view says otherwise.
    "METHODS": ("POST", "PATCH"),
    # Whether a missing header is a 400 on those methods.
    "REQUIRED": False,
    # How long a completed key is kept and replayed, in seconds.
    "TTL": 24 * 60 * 60,
    # PostgreSQL only: the key table is partitioned by expiry, one partition per this many
    # seconds (a whole number), and expired keys are purged by dropping whole partitions;
    # None: a plain table. See docs/operations.md ("Time partitions").
    "PARTITION_INTERVAL": None,
    # How far (seconds) the partitions reach past the longest of TTL and LOCK_TIMEOUT: the
    # purge creates them ahead, and must run again before they run out.
    "PARTITION_AHEAD": 24 * 60 * 60,
    # A lease older than this (seconds) was left by a crashed worker and may be taken over.
    "LOCK_TIMEOUT": 60,
    # How often (seconds) a running view renews its lease; None means LOCK_TIMEOUT / 3.
    "HEARTBEAT_INTERVAL": None,
    # PostgreSQL: seconds a statement of the library's may wait for the server before its
    # connection is cut (its outcome is then unknown: a 503); None: no bound.
    "DATABASE_TIMEOUT": 30,
    # Seconds a duplicate waits for the first request's answer instead of a 409; 0: no wait.
    "WAIT": 0,
    # Duplicates that may wait at the same time in one process; the next one gets the 409.
    "WAIT_MAX_WAITERS": 16,
    # Seconds between a waiter's claims when no notification came (the fallback poll).
    "WAIT_POLL_INTERVAL": 0.5,
    # Where the waiters' listener LISTENs: a DATABASES alias or a libpq DSN/URI of a direct
    # connection to the keys' PostgreSQL; None: the keys' database, if proven direct.
    "WAIT_LISTEN_DATABASE": None,
    # Retry-After (seconds) sent with a 409 for a request still in progress; None: derived.
    "RETRY_AFTER": None,
    # Run the view and the key's completion in one database transaction.
    "ATOMIC": True,
    # Store and replay 5xx responses instead of releasing the key.
    "STORE_SERVER_ERRORS": False,
    # Response headers that are stored and replayed (case-insensitive); all others are dropped.
    "STORED_HEADERS": (
        "Content-Type",
        "Content-Language",
        "Content-Location",
        "Location",
        "Cache-Control",
        "ETag",
        "Last-Modified",
        "Link",
        "Retry-After",
    ),
    # Headers never stored, even when listed above.
    "NEVER_STORED_HEADERS": (
        "Set-Cookie",
        "Authorization",
        "Proxy-Authorization",
        "Proxy-Authenticate",
        "WWW-Authenticate",
        "Cookie",
        "Connection",
        "Keep-Alive",
        "Transfer-Encoding",
        "Upgrade",
        "TE",
        "Trailer",
        "Content-Length",
    ),
    # Largest response body (bytes) that is stored; a larger one completes the key without it.
    "MAX_STORED_BODY_SIZE": 1024 * 1024,
    # Callable (dotted path) ``(request) -> str`` giving the default scope; None: per user.
    "SCOPE_FUNCTION": None,
    # Secret for derived downstream keys; None: settings.SECRET_KEY.
    "DOWNSTREAM_KEY_SECRET": None,
    # Register IdempotencyKey in the Django admin.
    "ADMIN_ENABLED": True,
    # Export Prometheus metrics (needs `pip install django-idempotency[prometheus]`).
    "METRICS": False,
    # redis / hybrid strategies: a django-redis cache alias or a URL, and timeouts.
    "REDIS_CACHE_ALIAS": None,
    "REDIS_URL": None,
    "REDIS_CLUSTER": False,
    "REDIS_KEY_PREFIX": "idem",
    "REDIS_SOCKET_TIMEOUT": 0.25,
    # What to do when Redis fails: "db" (fall back to the db strategy) or "fail_closed" (503).
    "REDIS_FAILURE_MODE": "db",
    # hybrid: check PostgreSQL for a key that is new in Redis "always" or "after_loss".
    "HYBRID_DB_CHECK": "after_loss",
    # hybrid: seconds a completed record stays in Redis (at most TTL); None: TTL.
    "HYBRID_REDIS_TTL": None,
    # hybrid: rows drained per outbox transaction.
    "OUTBOX_BATCH_SIZE": 1000,
    # Request headers that carry credentials: a request with one whose user is still
    # anonymous at the claim is refused (400 credentials-not-authenticated).
    "CREDENTIAL_HEADERS": ("Authorization",),
    # Cookies that identify an anonymous caller, who is scoped by a keyed hash of the
    # cookie instead of sharing "anonymous"; None: settings.SESSION_COOKIE_NAME.
    "CREDENTIAL_COOKIES": None,
    # Where a problem document's ``type`` URI points: this base followed by the slug.
    "PROBLEM_BASE_URI": "https://django-idempotency.readthedocs.io/en/latest/problems/",
    # Callable (dotted path) ``(error, request) -> HttpResponse`` that renders this app's
    # errors in a project's own format; None: RFC 9457 application/problem+json.
    "PROBLEM_RENDERER": None,
    # IdempotencyMiddleware: protect the views marked @idempotency_opt_in ("opt_in"), or
    # every view that is not marked @idempotency_exempt ("all"); never DRF views.
    "MIDDLEWARE_DEFAULT": "opt_in",
    # Under a test runner (the pytest plugin, ``manage.py test``), each test's Redis
    # records under a prefix of its own (django_idempotency.testing); False: shared.
    "TEST_ISOLATION": True,
}


class IdempotencySettings:
    """Typed, lazy access to ``settings.IDEMPOTENCY``; each value is cached on the
    instance until :meth:`reload` (on any ``setting_changed``)."""

    def reload(self) -> None:
        """Forget every cached value (they are computed again on next use), and whether
        the settings were validated."""
        self.__dict__.clear()

    @property
    def validated(self) -> bool:
        """Whether the current settings were validated (:meth:`ensure_valid`)."""
        return "_valid" in self.__dict__

    def mark_validated(self) -> None:
        self.__dict__["_valid"] = True

    def ensure_valid(self) -> None:
        """Raise ``InvalidConfiguration`` (the system checks' messages) when the current
        settings have an error; once per settings, then one dictionary lookup.
        ``AppConfig.ready()`` validates at start-up; the request path and the tasks call
        this on first use, so that a setting changed later is validated before it is
        used. The validators are the checks' (:func:`validate_with`): whoever validates
        imports this module, never ``checks``."""
        enforce = _VALIDATORS.get("settings")
        if enforce is not None and not self.validated:
            enforce()
            self.mark_validated()

    def validate_view(self, view: Any, **options: Any) -> None:
        """Raise ``InvalidConfiguration`` where ``view`` (a function or a class)
        declares an option the checks call an error (at decoration, class creation,
        ``as_view()``)."""
        validate = _VALIDATORS.get("view")
        if validate is not None:
            validate(view, **options)

    def _get(self, name: str) -> Any:
        user = getattr(settings, "IDEMPOTENCY", None) or {}
        if name in user:
            return user[name]
        return DEFAULTS[name]

    @property
    def user_settings(self) -> Mapping[str, Any]:
        value = getattr(settings, "IDEMPOTENCY", None)
        return value if isinstance(value, Mapping) else {}

    @cached_property
    def STRATEGY(self) -> str:
        return str(self._get("STRATEGY"))

    @cached_property
    def DATABASE(self) -> str:
        return str(self._get("DATABASE"))

    @cached_property
    def KEY_DATABASES(self) -> tuple[str, ...]:
        value = self._get("KEY_DATABASES")
        if value is None:
            return (self.DATABASE,)
        if isinstance(value, str):  # check E035; one alias, not its letters
            return (value,)
        return tuple(dict.fromkeys(str(alias) for alias in value))

    @cached_property
    def DATABASE_ROUTING(self) -> str | None:
        value = self._get("DATABASE_ROUTING")
        return None if value is None else str(value)

    @cached_property
    def UNPROTECTED_DATABASES(self) -> frozenset[str]:
        value = self._get("UNPROTECTED_DATABASES")
        if isinstance(value, str):  # check E031; one alias, not its letters
            return frozenset({value})
        return frozenset(str(alias) for alias in value or ())

    @cached_property
    def HEADER(self) -> str:
        return str(self._get("HEADER"))

    @cached_property
    def KEY_BODY_FIELD(self) -> str | None:
        value = self._get("KEY_BODY_FIELD")
        return None if value is None else str(value)

    @cached_property
    def METHODS(self) -> frozenset[str]:
        return frozenset(str(m).upper() for m in self._get("METHODS"))

    @cached_property
    def REQUIRED(self) -> bool:
        return bool(self._get("REQUIRED"))

    @cached_property
    def TTL(self) -> float:
        return float(self._get("TTL"))

    @cached_property
    def LOCK_TIMEOUT(self) -> float:
        return float(self._get("LOCK_TIMEOUT"))

    @cached_property
    def HEARTBEAT_INTERVAL(self) -> float:
        value = self._get("HEARTBEAT_INTERVAL")
        if value is None:
            return self.LOCK_TIMEOUT / 3
        return float(value)

    @cached_property
    def DATABASE_TIMEOUT(self) -> float | None:
        value = self._get("DATABASE_TIMEOUT")
        return None if value is None else float(value)

    @cached_property
    def WAIT(self) -> float:
        return float(self._get("WAIT"))

    @cached_property
    def WAIT_MAX_WAITERS(self) -> int:
        return int(self._get("WAIT_MAX_WAITERS"))

    @cached_property
    def WAIT_POLL_INTERVAL(self) -> float:
        return float(self._get("WAIT_POLL_INTERVAL"))

    @cached_property
    def WAIT_LISTEN_DATABASE(self) -> str | None:
        value = self._get("WAIT_LISTEN_DATABASE")
        return None if value is None else str(value)

    @cached_property
    def RETRY_AFTER(self) -> int | None:
        value = self._get("RETRY_AFTER")
        return None if value is None else int(value)

    @cached_property
    def ATOMIC(self) -> bool:
        return bool(self._get("ATOMIC"))

    @cached_property
    def STORE_SERVER_ERRORS(self) -> bool:
        return bool(self._get("STORE_SERVER_ERRORS"))

    @cached_property
    def STORED_HEADERS(self) -> frozenset[str]:
        return _lower_set(self._get("STORED_HEADERS"))

    @cached_property
    def NEVER_STORED_HEADERS(self) -> frozenset[str]:
        return _lower_set(self._get("NEVER_STORED_HEADERS"))

    @cached_property
    def MAX_STORED_BODY_SIZE(self) -> int:
        return int(self._get("MAX_STORED_BODY_SIZE"))

    @cached_property
    def SCOPE_FUNCTION(self) -> str | None:
        value = self._get("SCOPE_FUNCTION")
        return None if value is None else str(value)

    @cached_property
    def DOWNSTREAM_KEY_SECRET(self) -> str:
        value = self._get("DOWNSTREAM_KEY_SECRET")
        return str(settings.SECRET_KEY if value is None else value)

    @cached_property
    def ADMIN_ENABLED(self) -> bool:
        return bool(self._get("ADMIN_ENABLED"))

    @cached_property
    def METRICS(self) -> bool:
        return bool(self._get("METRICS"))

    @cached_property
    def REDIS_CACHE_ALIAS(self) -> str | None:
        value = self._get("REDIS_CACHE_ALIAS")
        return None if value is None else str(value)

    @cached_property
    def REDIS_URL(self) -> str | None:
        value = self._get("REDIS_URL")
        return None if value is None else str(value)

    @cached_property
    def REDIS_CLUSTER(self) -> bool:
        return bool(self._get("REDIS_CLUSTER"))

    @cached_property
    def REDIS_KEY_PREFIX(self) -> str:
        return str(self._get("REDIS_KEY_PREFIX"))

    @cached_property
    def REDIS_SOCKET_TIMEOUT(self) -> float:
        return float(self._get("REDIS_SOCKET_TIMEOUT"))

    @cached_property
    def REDIS_FAILURE_MODE(self) -> str:
        return str(self._get("REDIS_FAILURE_MODE"))

    @cached_property
    def HYBRID_DB_CHECK(self) -> str:
        return str(self._get("HYBRID_DB_CHECK"))

    @cached_property
    def HYBRID_REDIS_TTL(self) -> float | None:
        value = self._get("HYBRID_REDIS_TTL")
        return None if value is None else float(value)

    @cached_property
    def PARTITION_INTERVAL(self) -> int | None:
        value = self._get("PARTITION_INTERVAL")
        return None if value is None else int(value)

    @cached_property
    def PARTITION_AHEAD(self) -> float:
        return float(self._get("PARTITION_AHEAD"))

    @cached_property
    def OUTBOX_BATCH_SIZE(self) -> int:
        return int(self._get("OUTBOX_BATCH_SIZE"))

    @cached_property
    def CREDENTIAL_HEADERS(self) -> tuple[str, ...]:
        return tuple(str(h) for h in self._get("CREDENTIAL_HEADERS"))

    @cached_property
    def CREDENTIAL_COOKIES(self) -> tuple[str, ...]:
        value = self._get("CREDENTIAL_COOKIES")
        if value is None:
            return (str(settings.SESSION_COOKIE_NAME),)
        return tuple(str(c) for c in value)

    @cached_property
    def PROBLEM_BASE_URI(self) -> str:
        return str(self._get("PROBLEM_BASE_URI"))

    @cached_property
    def PROBLEM_RENDERER(self) -> str | None:
        value = self._get("PROBLEM_RENDERER")
        return None if value is None else str(value)

    @cached_property
    def MIDDLEWARE_DEFAULT(self) -> str:
        return str(self._get("MIDDLEWARE_DEFAULT"))

    @cached_property
    def TEST_ISOLATION(self) -> bool:
        return bool(self._get("TEST_ISOLATION"))


def _lower_set(values: Sequence[str]) -> frozenset[str]:
    return frozenset(str(v).lower() for v in values)


conf = IdempotencySettings()

#: The validators :meth:`IdempotencySettings.ensure_valid` and
#: :meth:`IdempotencySettings.validate_view` run, handed over by ``checks.settings``.
_VALIDATORS: dict[str, Callable[..., None]] = {}


def validate_with(settings: Callable[[], None], view: Callable[..., None]) -> None:
    """Hand over the validators of the settings (raises ``InvalidConfiguration``) and of a
    view's options (``view(view, **options)``, the same); ``checks.settings`` does when it
    is imported, which the app's ``apps.py`` does before any view can be declared."""
    _VALIDATORS.update(settings=settings, view=view)


def _reload(**kwargs: Any) -> None:
    # Any setting: a few values depend on SECRET_KEY and SESSION_COOKIE_NAME too.
    conf.reload()


setting_changed.connect(_reload, dispatch_uid="django_idempotency.conf")
