"""The checks of the database router against the key databases: a protected view's
writes routed elsewhere (E030), ``UNPROTECTED_DATABASES`` (E031, E032, W030, W031), and
the key databases of sharded data, ``KEY_DATABASES`` and ``DATABASE_ROUTING`` (E035-E037,
W032, W033)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from ..conf import DEFAULTS, conf
from ..protocol.shards import ROUTER
from . import ID
from .values import _raw, importable_callable


def _check_unprotected() -> list[CheckMessage]:
    """E031: UNPROTECTED_DATABASES is a list of aliases of DATABASES; E032: not the keys'."""
    raw = conf.user_settings.get("UNPROTECTED_DATABASES", DEFAULTS["UNPROTECTED_DATABASES"])
    hint = (
        "List the database aliases a protected view may write to outside the protection, "
        "e.g. ['analytics']; the default is () (every write to another database than "
        "IDEMPOTENCY['DATABASE'] is refused)."
    )
    if not isinstance(raw, list | tuple | set | frozenset) or not all(
        isinstance(alias, str) for alias in raw
    ):
        return [
            Error(
                "IDEMPOTENCY['UNPROTECTED_DATABASES'] must be a list of database aliases.",
                hint=hint,
                id=ID + "E031",
            )
        ]
    messages: list[CheckMessage] = [
        Error(
            f"IDEMPOTENCY['UNPROTECTED_DATABASES'] names {alias!r}, which is not in DATABASES.",
            hint=hint,
            id=ID + "E031",
        )
        for alias in sorted(raw)
        if alias not in settings.DATABASES
    ]
    for alias in conf.KEY_DATABASES:
        if alias in raw:
            messages.append(
                Error(
                    f"IDEMPOTENCY['UNPROTECTED_DATABASES'] names {alias!r}, a database that "
                    "holds the keys (IDEMPOTENCY['DATABASE'] or KEY_DATABASES), whose writes "
                    "are the ones the protocol protects.",
                    hint=f"Remove {alias!r} from it.",
                    id=ID + "E032",
                )
            )
    return messages


KEY_DATABASES_HINT = (
    "List every alias of DATABASES that holds keys, IDEMPOTENCY['DATABASE'] among them, "
    "e.g. ['tenant_a', 'tenant_b']; the default is None (IDEMPOTENCY['DATABASE'] alone)."
)


def _check_key_databases() -> list[CheckMessage]:
    """E035: KEY_DATABASES is None or a list of aliases of DATABASES; E036: it lists
    DATABASE; W032: several of them, but no DATABASE_ROUTING to choose among them."""
    raw = _raw("KEY_DATABASES")
    if raw is None:
        return []
    if not isinstance(raw, list | tuple) or not raw or not all(isinstance(a, str) for a in raw):
        message = "IDEMPOTENCY['KEY_DATABASES'] must be a non-empty list of database aliases."
        return [Error(message, hint=KEY_DATABASES_HINT, id=ID + "E035")]
    messages: list[CheckMessage] = [
        Error(
            f"IDEMPOTENCY['KEY_DATABASES'] names {alias!r}, which is not in DATABASES.",
            hint=KEY_DATABASES_HINT,
            id=ID + "E035",
        )
        for alias in raw
        if alias not in settings.DATABASES
    ]
    if conf.DATABASE not in raw:
        messages.append(
            Error(
                f"IDEMPOTENCY['KEY_DATABASES'] does not list {conf.DATABASE!r}, "
                "IDEMPOTENCY['DATABASE'] (the key database of requests without routing, "
                "and the default of the commands and the admin).",
                hint=f"Add {conf.DATABASE!r} to KEY_DATABASES, or set DATABASE to one of them.",
                id=ID + "E036",
            )
        )
    if len(set(raw)) > 1 and conf.DATABASE_ROUTING is None:
        messages.append(
            Warning(
                "IDEMPOTENCY['KEY_DATABASES'] lists several databases, but DATABASE_ROUTING "
                f"is None: every key is kept on {conf.DATABASE!r}, and a view writing to "
                "another of them is refused (503 database-misconfigured).",
                hint="Set IDEMPOTENCY['DATABASE_ROUTING'] to 'router' (DATABASE_ROUTERS "
                "chooses) or to the dotted path of a callable (request) -> alias.",
                id=ID + "W032",
            )
        )
    return messages


def _check_database_routing() -> list[CheckMessage]:
    """E037: DATABASE_ROUTING is None, "router", or the dotted path of a callable; W033:
    WAIT_LISTEN_DATABASE with several key databases (NOTIFY is per database)."""
    raw = _raw("DATABASE_ROUTING")
    messages: list[CheckMessage] = []
    if raw is not None and raw != ROUTER and not importable_callable(raw):
        messages.append(
            Error(
                f"IDEMPOTENCY['DATABASE_ROUTING'] is {raw!r}: neither None, 'router', nor "
                "the dotted path of a callable that can be imported.",
                hint="Set 'router' (DATABASE_ROUTERS' db_for_write of IdempotencyKey "
                "chooses each request's key database), the dotted path of a function "
                "(request) -> alias, or None (every key on IDEMPOTENCY['DATABASE']).",
                id=ID + "E037",
            )
        )
    if conf.WAIT_LISTEN_DATABASE is not None and len(conf.KEY_DATABASES) > 1:
        messages.append(
            Warning(
                "IDEMPOTENCY['WAIT_LISTEN_DATABASE'] is set while KEY_DATABASES lists several "
                "databases: PostgreSQL's notifications do not cross databases, so the "
                "waiters of keys kept elsewhere than that database are not woken; they poll "
                "every WAIT_POLL_INTERVAL.",
                hint="Leave WAIT_LISTEN_DATABASE unset (each key database is listened to on "
                "a connection of its own, when it is direct), or accept the polling.",
                id=ID + "W033",
            )
        )
    return messages


#: Django's models that views do not write: ``migrate`` writes the content types and the
#: permissions, the admin its log (the admin's views are not idempotent views).
NOT_WRITTEN_BY_VIEWS = frozenset({"contenttypes.contenttype", "auth.permission", "admin.logentry"})


#: The labels of django.contrib's apps that have models.
DJANGO_APPS = frozenset(
    {"admin", "auth", "contenttypes", "sessions", "sites", "redirects", "flatpages"}
)


#: Models named in a message, at most: the project's first, Django's own last.
SHOWN_MODELS = 6


def _models(labels: list[str]) -> str:
    labels = sorted(labels, key=lambda label: (label.split(".")[0] in DJANGO_APPS, label))
    shown = ", ".join(labels[:SHOWN_MODELS])
    more = len(labels) - SHOWN_MODELS
    return f"{shown} and {more} more" if more > 0 else shown


def _routed_writes() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Where the router sends each installed model's writes (``db_for_write`` without an
    instance): ``({alias: labels})`` of the models views write, and of this app's own."""
    from django.apps import apps
    from django.db import router

    views: dict[str, list[str]] = {}
    own: dict[str, list[str]] = {}
    for model in apps.get_models(include_auto_created=True):
        meta = model._meta
        if meta.label_lower in NOT_WRITTEN_BY_VIEWS:
            continue
        try:
            alias = router.db_for_write(model)
        except Exception:  # a router that cannot answer without an instance
            continue
        found = own if meta.app_config is not None and meta.app_config.name == PACKAGE else views
        found.setdefault(alias, []).append(meta.label)
    return views, own


PACKAGE = "django_idempotency"


@register(Tags.compatibility)
def check_database_routing(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E030: the router sends writes of installed models to a database other than the
    keys' one, not declared in UNPROTECTED_DATABASES (a protected view's writes there are
    refused at run time); W030: it sends this app's own models elsewhere; W031:
    ATOMIC_REQUESTS on a declared one. Nothing here connects to a database."""

    keys = conf.DATABASE
    databases = settings.DATABASES
    if keys not in databases:
        return []  # E005
    shards = set(conf.KEY_DATABASES)
    unprotected = {alias for alias in conf.UNPROTECTED_DATABASES if alias in databases}
    views, own = _routed_writes()
    messages: list[CheckMessage] = []
    for alias in sorted(set(views) - shards - unprotected):
        messages.append(
            Error(
                f"The database router sends the writes of {_models(views[alias])} to "
                f"{alias!r}, but the keys are on {_where_keys_are()}: a "
                "protected view's writes there would commit outside the transaction that "
                "stores its key's response (a failed request would leave them for its retry "
                "to repeat, and a response could be stored for writes that never commit), "
                "so they are refused with a 503 database-misconfigured.",
                hint=f"Route these models to {keys!r}, or keep the keys on {alias!r} "
                f"(IDEMPOTENCY['DATABASE'], or KEY_DATABASES with DATABASE_ROUTING when the "
                f"data is sharded). If writes to {alias!r} are meant to be outside "
                f"the protection, list it in IDEMPOTENCY['UNPROTECTED_DATABASES'].",
                id=ID + "E030",
            )
        )
    for alias in sorted(set(own) - shards):
        messages.append(
            Warning(
                f"The database router sends the writes of {_models(own[alias])} to "
                f"{alias!r}, but the keys are on {_where_keys_are()}: the "
                f"protocol reads and writes them on {keys!r}, while the admin and code using "
                f"the models without using= act on {alias!r}.",
                hint=f"Route the {PACKAGE} app's models to {keys!r}.",
                id=ID + "W030",
            )
        )
    messages.extend(_atomic_unprotected(sorted(unprotected), keys))
    return messages


def _where_keys_are() -> str:
    """The key databases, as the messages name them."""
    shards = conf.KEY_DATABASES
    if len(shards) == 1:
        return f"{shards[0]!r} (IDEMPOTENCY['DATABASE'])"
    return ", ".join(repr(alias) for alias in shards) + " (IDEMPOTENCY['KEY_DATABASES'])"


def _atomic_unprotected(aliases: list[str], keys: str) -> list[CheckMessage]:
    """W031: ATOMIC_REQUESTS on an alias of UNPROTECTED_DATABASES."""
    from django.db import connections

    messages: list[CheckMessage] = []
    for alias in aliases:
        if connections[alias].settings_dict.get("ATOMIC_REQUESTS"):
            messages.append(
                Warning(
                    f"ATOMIC_REQUESTS is on for {alias!r}, which is listed in "
                    "IDEMPOTENCY['UNPROTECTED_DATABASES']: a protected view's writes there "
                    "commit after its key's response is stored, so a COMMIT that fails "
                    f"there (a deferred constraint) leaves a stored response that every "
                    "retry replays, for writes that do not exist.",
                    hint=f"Turn ATOMIC_REQUESTS off for {alias!r}, or route the models the "
                    f"views write to {keys!r}.",
                    id=ID + "W031",
                )
            )
    return messages


#: This module's validators of the settings (see ``settings.SETTINGS_VALIDATORS``).
VALIDATORS: list[Callable[[], list[CheckMessage]]] = [
    _check_unprotected,
    _check_key_databases,
    _check_database_routing,
]
