"""Settings, read lazily from ``settings.IDEMPOTENCY``, each declared once.

Every setting is one :class:`Setting` in the body of :class:`IdempotencySettings`: its
default, how its value is read (the type it is converted to, and what ``None`` stands for),
the :class:`Rule` that checks it on its own (the check id and what the check says), the other
checks that guard it, its one-line description and the group of the settings page it belongs
to. From that one declaration come the typed attribute (``conf.TTL``), :data:`DEFAULTS`, the
system checks of each value (``checks.values``) and the settings page, which
``docs/hooks.py`` and ``tests/system/test_docs.py`` hold to it.

Each value is computed on first use and kept until a setting changes (Django's
``setting_changed`` signal, which ``override_settings`` and pytest-django's ``settings``
fixture send), so ``override_settings(IDEMPOTENCY={...})`` takes effect at once, in tests
too, and a request reads each value as one attribute lookup. No default is ever written back
into ``settings``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar, overload

from django.conf import settings
from django.core.signals import setting_changed

T = TypeVar("T")

#: The groups of the settings page, in its order: the settings most projects set first, then
#: the others by feature. A setting names its group; docs/settings.md has a section for each.
COMMON = "The settings most projects set"
DATABASES = "Databases"
KEYS = "Where the key is read"
WAITING = "Duplicates that wait"
STORED = "What is stored"
SCOPES = "Scopes and downstream keys"
ERRORS = "Errors"
REDIS = "Redis and hybrid"
PARTITIONS = "Time partitions"
MIDDLEWARE = "The middleware"
COMPLETER = "The completer"
EXTRAS = "Admin, metrics and tests"
GROUPS: tuple[str, ...] = (
    *(COMMON, DATABASES, KEYS, WAITING, STORED, SCOPES),
    *(ERRORS, REDIS, PARTITIONS, MIDDLEWARE, COMPLETER, EXTRAS),
)

#: The methods ``METHODS`` (and a view's ``methods``) may name.
HTTP_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE", "GET"})
#: An HTTP field name (RFC 9110 section 5.1: a token).
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: The longest ``KEY_BODY_FIELD``.
MAX_FIELD_NAME = 255


# -- what a value must be ----------------------------------------------------------------------


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float (a number, or a string of one, as the settings read it),
    else None: ``nan`` and ``inf`` break every comparison or overflow a date."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _positive(value: Any) -> bool:
    number = finite_number(value)
    return number is not None and number > 0


def _at_least_zero(value: Any) -> bool:
    number = finite_number(value)
    return number is not None and number >= 0


def _whole(least: int) -> Callable[[Any], bool]:
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= least

    return whole


def _methods(value: Any) -> bool:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return False  # a string is letters
    names = {str(m).upper() for m in value}
    return bool(names) and names <= HTTP_METHODS


def _names(value: Any) -> bool:
    return isinstance(value, list | tuple | set | frozenset) and all(
        isinstance(v, str) and v for v in value
    )


def _header_name(value: Any) -> bool:
    return isinstance(value, str) and TOKEN.fullmatch(value) is not None


def _field_name(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_FIELD_NAME and value.isprintable()


def _callable_path(value: Any) -> bool:
    from django.utils.module_loading import import_string

    try:
        return callable(import_string(value)) if isinstance(value, str) else False
    except ImportError:
        return False


def _one_of(*choices: str) -> Callable[[Any], bool]:
    return lambda value: value in choices


@dataclass(frozen=True)
class Rule:
    """A check of one setting's value on its own: its id (``E002``: the system check
    ``django_idempotency.E002``), whether a value passes, and what the check says of one that
    does not. ``message`` and ``hint`` are ``str.format`` templates of ``label`` (who is
    checked: ``IDEMPOTENCY['TTL']``, or a view's option), ``value``, ``name``, ``default``,
    ``example`` (the setting's) and ``defaults`` (:data:`DEFAULTS`)."""

    id: str
    passes: Callable[[Any], bool]
    message: str
    hint: str


POSITIVE = Rule(
    "E002", _positive, "{label} must be a positive number.", "The default is {default!r}."
)
METHOD_LIST = Rule(
    "E004",
    _methods,
    "{label} must list HTTP methods such as POST and PATCH.",
    "The default is ('POST', 'PATCH').",
)
_WAIT_HINT = (
    "WAIT is seconds (0 turns waiting off), WAIT_POLL_INTERVAL a positive number of seconds, "
    "WAIT_MAX_WAITERS a whole number of at least 1; the defaults are {defaults[WAIT]!r}, "
    "{defaults[WAIT_POLL_INTERVAL]!r} and {defaults[WAIT_MAX_WAITERS]!r}."
)
WAIT_SECONDS = Rule("E013", _at_least_zero, "{label} is not valid.", _WAIT_HINT)
WAIT_INTERVAL = Rule("E013", _positive, "{label} is not valid.", _WAIT_HINT)
WAITERS = Rule("E013", _whole(1), "{label} is not valid.", _WAIT_HINT)
BOOLEAN = Rule(
    "E015",
    lambda value: isinstance(value, bool),
    "{label} must be True or False, not {value!r}.",
    "A string such as 'False' counts as true; use the Python constants.",
)
NAMES = Rule(
    "E017", _names, "{label} must be a list of names, not {value!r}.", "For example {example!r}."
)
CALLABLE = Rule(
    "E018",
    _callable_path,
    "{label} is {value!r}, which is not the dotted path of a callable that can be imported.",
    "Name a function as 'package.module.function', or set None.",
)
PARTITIONS_HINT = "See docs/operations.md, 'Time partitions'."


class Setting(Generic[T]):
    """One key of ``settings.IDEMPOTENCY``, declared once in :class:`IdempotencySettings`.

    As an attribute of ``conf`` it is the value, converted by ``kind`` and kept on the
    instance until the settings change (like ``cached_property``). ``nullable``: ``None`` is a
    value of its own, taken as it is or as ``if_none`` derives it from the other settings,
    and never checked. ``rule`` is its check on its own (run by ``checks.values``); ``checks``
    the ids of the checks that compare it with other settings, ``DATABASES`` or the server.
    """

    name: str

    def __init__(
        self,
        default: Any,
        kind: Callable[[Any], T],
        doc: str,
        group: str,
        *,
        rule: Rule | None = None,
        checks: tuple[str, ...] = (),
        nullable: bool = False,
        if_none: Callable[[IdempotencySettings], T] | None = None,
        example: Any = None,
    ) -> None:
        self.default, self.kind, self.doc, self.group = default, kind, doc, group
        self.rule, self.nullable, self.if_none = rule, nullable or default is None, if_none
        self.checks = (rule.id, *checks) if rule else checks
        if example is None and isinstance(default, tuple):
            example = list(default)[:2]
        self.example = example

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    def read(self, conf: IdempotencySettings) -> T:
        """The value of the current settings, converted (not cached)."""
        value = conf.user_settings.get(self.name, self.default)
        if value is None and self.nullable:
            return self.if_none(conf) if self.if_none else value  # type: ignore[return-value]
        return self.kind(value)

    @overload
    def __get__(self, conf: None, owner: type[Any]) -> Setting[T]: ...
    @overload
    def __get__(self, conf: IdempotencySettings, owner: type[Any]) -> T: ...
    def __get__(self, conf: IdempotencySettings | None, owner: type[Any]) -> T | Setting[T]:
        if conf is None:
            return self
        value = conf.__dict__[self.name] = self.read(conf)  # read once, until a reload
        return value


def _text(value: Any) -> str:
    return str(value)


def _upper_set(values: Iterable[Any]) -> frozenset[str]:
    return frozenset(str(v).upper() for v in values)


def _lower_set(values: Iterable[Any]) -> frozenset[str]:
    return frozenset(str(v).lower() for v in values)


def _text_tuple(values: Iterable[Any]) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


def _aliases(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):  # check E035; one alias, not its letters
        return (value,)
    return tuple(dict.fromkeys(str(alias) for alias in value))


def _alias_set(value: Any) -> frozenset[str]:
    if isinstance(value, str):  # check E031; one alias, not its letters
        return frozenset({value})
    return frozenset(str(alias) for alias in value or ())


class IdempotencySettings:
    """Typed, lazy access to ``settings.IDEMPOTENCY``: every setting, declared once; each
    value is cached on the instance until :meth:`reload` (on any ``setting_changed``)."""

    # -- the settings most projects set ----------------------------------------------------
    STRATEGY = Setting(
        "db",
        _text,
        'Which strategy claims keys: "db", "advisory_lock", "redis", "hybrid", or the '
        "dotted path of a Strategy subclass.",
        COMMON,
        checks=("E006", "E007", "E008", "E011", "E012"),
    )
    DATABASE = Setting(
        "default",
        _text,
        "The database alias that holds the keys (and the protected views' writes).",
        COMMON,
        checks=("E005", "E030"),
    )
    METHODS = Setting(
        ("POST", "PATCH"),
        _upper_set,
        "The HTTP methods that honour the header.",
        COMMON,
        rule=METHOD_LIST,
    )
    REQUIRED = Setting(
        False, bool, "Whether a missing key is a 400 on those methods.", COMMON, rule=BOOLEAN
    )
    TTL = Setting(
        24 * 60 * 60,
        float,
        "Seconds a completed key is kept and replayed.",
        COMMON,
        rule=POSITIVE,
        checks=("W002", "E061"),
    )
    LOCK_TIMEOUT = Setting(
        60,
        float,
        "Seconds after which a lease not renewed was left by a crashed worker and may be "
        "taken over.",
        COMMON,
        rule=POSITIVE,
        checks=("E003", "W002"),
    )
    WAIT = Setting(
        0,
        float,
        "Seconds a duplicate waits for the first request's answer instead of a 409; 0: no wait.",
        COMMON,
        rule=WAIT_SECONDS,
        checks=("W014",),
    )
    SCOPE_FUNCTION = Setting[str | None](
        None,
        _text,
        "Dotted path of a callable (request) -> str giving whose key a request's is; None: "
        "per user.",
        COMMON,
        rule=CALLABLE,
    )

    # -- databases -------------------------------------------------------------------------
    KEY_DATABASES = Setting(
        None,
        _aliases,
        "Every alias that holds keys when the data is sharded over several databases; None: "
        "DATABASE alone.",
        DATABASES,
        checks=("E035", "E036", "W032"),
        if_none=lambda conf: (conf.DATABASE,),
    )
    DATABASE_ROUTING = Setting[str | None](
        None,
        _text,
        'How a request\'s key database is chosen: None (DATABASE), "router", or the dotted '
        "path of a callable (request) -> alias.",
        DATABASES,
        checks=("E037", "W033"),
    )
    UNPROTECTED_DATABASES = Setting(
        (),
        _alias_set,
        "Other aliases a protected view may write to outside the protection.",
        DATABASES,
        checks=("E031", "E032", "W031"),
    )
    ATOMIC = Setting(
        True,
        bool,
        "Run the view and the key's completion in one database transaction.",
        DATABASES,
        rule=BOOLEAN,
    )
    DATABASE_TIMEOUT = Setting[float | None](
        30,
        float,
        "PostgreSQL: seconds a statement of the library's may wait for the server; None: no bound.",
        DATABASES,
        rule=POSITIVE,
        checks=("W015",),
        nullable=True,
    )
    HEARTBEAT_INTERVAL = Setting(
        None,
        float,
        "Seconds between the renewals of a running view's lease; None: LOCK_TIMEOUT / 3.",
        DATABASES,
        checks=("E003",),
        if_none=lambda conf: conf.LOCK_TIMEOUT / 3,
    )

    # -- where the key is read -------------------------------------------------------------
    HEADER = Setting(
        "Idempotency-Key",
        _text,
        "The request header that carries the key.",
        KEYS,
        rule=Rule(
            "E014",
            _header_name,
            "{label} is {value!r}, which is not an HTTP header name.",
            "Use a name of letters, digits and dashes; the default is 'Idempotency-Key'.",
        ),
    )
    KEY_BODY_FIELD = Setting[str | None](
        None,
        _text,
        "A top-level field of a JSON request body that carries the key too; None: the header only.",
        KEYS,
        rule=Rule(
            "E022",
            _field_name,
            "{label} is {value!r}, which is not the name of a JSON field.",
            "Name a top-level field of the JSON request body, such as 'idempotency_key' "
            f"(1 to {MAX_FIELD_NAME} printable characters), or set None to read the key "
            "from the header only.",
        ),
    )

    # -- duplicates that wait --------------------------------------------------------------
    WAIT_MAX_WAITERS = Setting(
        16,
        int,
        "Duplicates that may wait at the same time in one process; the next one gets the 409.",
        WAITING,
        rule=WAITERS,
    )
    WAIT_POLL_INTERVAL = Setting(
        0.5,
        float,
        "Seconds between a waiter's claims when no notification came (the fallback poll).",
        WAITING,
        rule=WAIT_INTERVAL,
    )
    WAIT_LISTEN_DATABASE = Setting[str | None](
        None,
        _text,
        "Where the waiters LISTEN: an alias or a libpq DSN of a direct connection; None: the "
        "keys' database, if proven direct.",
        WAITING,
        checks=("E050", "W033"),
    )
    RETRY_AFTER = Setting[int | None](
        None,
        int,
        "Retry-After (seconds) of a 409 for a key in progress and of a 503; None: the "
        "strategy's (1 s).",
        WAITING,
        rule=Rule(
            "E016",
            _whole(0),
            "{label} is {value!r}.",
            "Use None (the strategy chooses) or a whole number of seconds, such as 1.",
        ),
    )

    # -- what is stored --------------------------------------------------------------------
    STORE_SERVER_ERRORS = Setting(
        False,
        bool,
        "Store and replay 5xx responses instead of releasing the key.",
        STORED,
        rule=BOOLEAN,
    )
    STORED_HEADERS = Setting(
        (
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
        _lower_set,
        "Response headers that are stored and replayed (case-insensitive).",
        STORED,
        rule=NAMES,
        checks=("W003",),
    )
    NEVER_STORED_HEADERS = Setting(
        (
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
        _lower_set,
        "Headers never stored, even when STORED_HEADERS lists them.",
        STORED,
        rule=NAMES,
        checks=("W003",),
    )
    MAX_STORED_BODY_SIZE = Setting(
        1024 * 1024,
        int,
        "Largest response body (bytes) that is stored; a larger one completes the key without it.",
        STORED,
        rule=POSITIVE,
    )

    # -- scopes and downstream keys --------------------------------------------------------
    CREDENTIAL_HEADERS = Setting(
        ("Authorization",),
        _text_tuple,
        "Request headers that carry credentials: with one, an anonymous user at the claim is "
        "a 400.",
        SCOPES,
        rule=NAMES,
    )
    CREDENTIAL_COOKIES = Setting(
        None,
        _text_tuple,
        "Cookies that identify an anonymous caller, scoped by a keyed hash of the cookie; "
        "None: SESSION_COOKIE_NAME.",
        SCOPES,
        rule=NAMES,
        if_none=lambda conf: (str(settings.SESSION_COOKIE_NAME),),
        example=["sessionid"],
    )
    DOWNSTREAM_KEY_SECRET = Setting(
        None,
        _text,
        "Secret of the derived downstream keys; None: SECRET_KEY.",
        SCOPES,
        if_none=lambda conf: str(settings.SECRET_KEY),
    )
    DOWNSTREAM_KEY_LIFETIME = Setting[float | None](
        24 * 3600,
        float,
        "Seconds another service keeps a downstream key (Stripe: 24 h); a remote step an "
        "earlier attempt called is not called again past it. None: not checked.",
        SCOPES,
        nullable=True,
        rule=Rule(
            "E095",
            _positive,
            "{label} is {value!r}.",
            "Use the seconds your payment provider keeps its idempotency keys (the default, "
            "{default!r}, is Stripe's 24 hours), or None. See docs/steps.md, 'A provider "
            "that forgets its keys'.",
        ),
    )

    # -- errors ----------------------------------------------------------------------------
    PROBLEM_BASE_URI = Setting(
        "https://django-idempotency.readthedocs.io/en/latest/problems/",
        _text,
        "The base of a problem document's type URI, followed by the slug.",
        ERRORS,
    )
    PROBLEM_RENDERER = Setting[str | None](
        None,
        _text,
        "Dotted path of a callable (error, request) -> HttpResponse; None: RFC 9457 "
        "application/problem+json.",
        ERRORS,
        rule=CALLABLE,
    )

    # -- redis and hybrid ------------------------------------------------------------------
    REDIS_CACHE_ALIAS = Setting[str | None](
        None,
        _text,
        "A Redis cache of CACHES whose connection the redis and hybrid strategies use.",
        REDIS,
        checks=("E011", "E012", "E080", "E081", "E082", "E083", "W080"),
    )
    REDIS_URL = Setting[str | None](
        None, _text, "A Redis URL, used when no cache alias is given.", REDIS, checks=("E011",)
    )
    REDIS_CLUSTER = Setting(
        False, bool, "REDIS_URL names a node of a Redis Cluster.", REDIS, rule=BOOLEAN
    )
    REDIS_KEY_PREFIX = Setting(
        "idem", _text, "The prefix of every Redis key this app writes.", REDIS
    )
    REDIS_SOCKET_TIMEOUT = Setting(
        0.25, float, "Seconds to wait for Redis before treating it as failed.", REDIS, rule=POSITIVE
    )
    REDIS_FAILURE_MODE = Setting(
        "db",
        _text,
        'When Redis fails: "db" (the db strategy instead) or "fail_closed" (503).',
        REDIS,
        rule=Rule(
            "E009",
            _one_of("db", "fail_closed"),
            "{label} must be 'db' or 'fail_closed'.",
            "'db' falls back to the database strategy; 'fail_closed' answers 503.",
        ),
    )
    HYBRID_DB_CHECK = Setting(
        "after_loss",
        _text,
        'hybrid: look a key new in Redis up in the database "always" or "after_loss".',
        REDIS,
        rule=Rule(
            "E010",
            _one_of("always", "after_loss"),
            "{label} must be 'always' or 'after_loss'.",
            "'always' never double-charges after a Redis data loss.",
        ),
    )
    HYBRID_REDIS_TTL = Setting[float | None](
        None,
        float,
        "hybrid: seconds a completed record stays in Redis (at most TTL); None: TTL.",
        REDIS,
        rule=Rule(
            "E060",
            _positive,
            "{label} is {value!r}, which is neither None nor a positive number of seconds.",
            "None keeps completed records in Redis for TTL seconds.",
        ),
        checks=("E061",),
    )
    OUTBOX_BATCH_SIZE = Setting(
        1000,
        int,
        "hybrid: rows drained per outbox transaction.",
        REDIS,
        rule=Rule(
            "E019",
            _whole(1),
            "{label} is {value!r}.",
            "Use a whole number of at least 1; the default is {default!r}.",
        ),
        checks=("W077",),
    )

    # -- time partitions -------------------------------------------------------------------
    PARTITION_INTERVAL = Setting[int | None](
        None,
        int,
        "PostgreSQL: the key table is partitioned by expiry, one partition per this many "
        "seconds; None: a plain table.",
        PARTITIONS,
        rule=Rule(
            "E071",
            _whole(1),
            "{label} is {value!r}.",
            "Use None (a plain table) or a whole number of seconds of at least 1, for instance "
            "6 * 3600. " + PARTITIONS_HINT,
        ),
        checks=("E070", "W073", "W074", "E075"),
    )
    PARTITION_AHEAD = Setting(
        24 * 60 * 60,
        float,
        "Seconds past the longest of TTL and LOCK_TIMEOUT that the purge creates partitions ahead.",
        PARTITIONS,
        rule=Rule(
            "E076",
            _positive,
            "{label} is {value!r}.",
            "Use a positive number of seconds, longer than the time between two runs of the "
            "purge; the default is a day. " + PARTITIONS_HINT,
        ),
        checks=("W073",),
    )

    # -- the middleware --------------------------------------------------------------------
    MIDDLEWARE_DEFAULT = Setting(
        "opt_in",
        _text,
        'IdempotencyMiddleware protects the views marked @idempotency_opt_in ("opt_in"), or '
        'every view not exempt ("all").',
        MIDDLEWARE,
        checks=("E101",),
    )

    # -- the completer ---------------------------------------------------------------------
    COMPLETER_AFTER = Setting(
        60,
        float,
        "Seconds past a lapsed lease (the view's LOCK_TIMEOUT) that the completer leaves a "
        "request with completer=True to its client's retry before it finishes it itself.",
        COMPLETER,
        rule=Rule(
            "E093",
            _at_least_zero,
            "{label} is {value!r}.",
            "Use a number of seconds, 0 or more; the default is {default!r}. See "
            "docs/steps.md, 'The completer'.",
        ),
    )
    COMPLETER_ATTEMPTS = Setting(
        5,
        int,
        "How many times the completer runs a request before it leaves it dead-lettered.",
        COMPLETER,
        rule=Rule(
            "E094",
            _whole(1),
            "{label} is {value!r}.",
            "Use a whole number of at least 1; the default is {default!r}. See "
            "docs/steps.md, 'The completer'.",
        ),
    )

    # -- admin, metrics and tests ----------------------------------------------------------
    ADMIN_ENABLED = Setting(
        True, bool, "Register IdempotencyKey in the Django admin.", EXTRAS, rule=BOOLEAN
    )
    METRICS = Setting(
        False,
        bool,
        "Export Prometheus metrics (the [prometheus] extra).",
        EXTRAS,
        rule=BOOLEAN,
        checks=("W004",),
    )
    TEST_ISOLATION = Setting(
        True,
        bool,
        "Under a test runner, each test's Redis records under a prefix of its own.",
        EXTRAS,
        rule=BOOLEAN,
    )

    def reload(self) -> None:
        """Forget every cached value (they are computed again on next use), and whether
        the settings were validated."""
        self.__dict__.clear()

    @cached_property
    def generation(self) -> object:
        """A token of the current settings: the same object until the next :meth:`reload`
        (what a value derived from the settings elsewhere is kept against)."""
        return object()

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
        if "_valid" in self.__dict__:  # the request path's case: one lookup
            return
        enforce = _VALIDATORS.get("settings")
        if enforce is not None:
            enforce()
            self.mark_validated()

    def validate_view(self, view: Any, **options: Any) -> None:
        """Raise ``InvalidConfiguration`` where ``view`` (a function or a class)
        declares an option the checks call an error (at decoration, class creation,
        ``as_view()``)."""
        validate = _VALIDATORS.get("view")
        if validate is not None:
            validate(view, **options)

    @property
    def user_settings(self) -> Mapping[str, Any]:
        value = getattr(settings, "IDEMPOTENCY", None)
        return value if isinstance(value, Mapping) else {}

    def raw(self, name: str) -> Any:
        """Setting ``name`` as given (not converted), or its default."""
        return self.user_settings.get(name, SETTINGS[name].default)


#: Every setting, by name, in the order of the settings page.
SETTINGS: Mapping[str, Setting[Any]] = {
    setting.name: setting
    for group in GROUPS
    for setting in vars(IdempotencySettings).values()
    if isinstance(setting, Setting) and setting.group == group
}

#: Every key of the ``IDEMPOTENCY`` dict, with its default.
DEFAULTS: Mapping[str, Any] = {name: setting.default for name, setting in SETTINGS.items()}


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
