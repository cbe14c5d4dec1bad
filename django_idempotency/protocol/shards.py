"""Which database holds a request's key, when the data is sharded over several databases.

A project that shards its data (by tenant, say) over several databases lists every one
that holds keys in ``IDEMPOTENCY["KEY_DATABASES"]`` and says how a request's one is chosen
in ``IDEMPOTENCY["DATABASE_ROUTING"]``:

* ``None`` (the default): always ``IDEMPOTENCY["DATABASE"]``, read as one attribute;
* ``"router"``: ``DATABASE_ROUTERS``' ``db_for_write(IdempotencyKey)``, asked at the claim
  (a tenant router answers from its own context, which a tenant middleware set earlier);
* the dotted path of a callable ``(request) -> alias``.

The key then lives in the database its view writes to: the view's transaction, which
stores the key's response, is opened there, and the write guard refuses the view's
writes to every other alias (``protocol/writeguard.py``). An alias that is not one of
the key databases is refused with a ``503 database-misconfigured``, logged, before any
claim: the request changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from django.db import transaction
from django.http import HttpRequest
from django.utils.module_loading import import_string

from ..conf import conf
from ..errors import DatabaseMisconfigured

logger = logging.getLogger("django_idempotency")

#: ``DATABASE_ROUTING``'s value that asks ``DATABASE_ROUTERS``.
ROUTER = "router"


def key_database(request: HttpRequest) -> str:
    """The alias that holds ``request``'s key: ``DATABASE`` without routing, else the
    router's or the callable's answer, which must be one of ``KEY_DATABASES`` (raises
    ``DatabaseMisconfigured`` otherwise)."""
    routing = conf.DATABASE_ROUTING
    if routing is None:
        return conf.DATABASE
    alias = _routed(routing, request)
    if alias not in conf.KEY_DATABASES:
        _refuse(routing, alias)
    return str(alias)


def _routed(routing: str, request: HttpRequest) -> object:
    if routing == ROUTER:
        from django.db import router

        from ..models import IdempotencyKey

        return router.db_for_write(IdempotencyKey)
    choose: Callable[[HttpRequest], object] = import_string(routing)
    return choose(request)


def _refuse(routing: str, alias: object) -> NoReturn:
    source = "DATABASE_ROUTERS" if routing == ROUTER else routing
    logger.error(
        "the key database chosen for this request (%s) is %r, which is not one of "
        "IDEMPOTENCY['KEY_DATABASES'] %r: the request is refused (503) before its key is "
        "claimed, and nothing is changed. List the alias there, or fix the routing.",
        source,
        alias,
        list(conf.KEY_DATABASES),
        extra={"idempotency_outcome": "database_misconfigured", "idempotency_database": alias},
    )
    raise DatabaseMisconfigured()


V = TypeVar("V", bound=Callable[..., Any])


def non_atomic(view: V) -> V:
    """``view`` exempt from ``ATOMIC_REQUESTS`` on every key database: the lifecycle runs
    it in a transaction of its own on the request's one (which also stores the response)."""
    for alias in conf.KEY_DATABASES:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view
