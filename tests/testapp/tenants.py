"""A project that shards its data by tenant: tenant ``a`` on ``default``, tenant ``b`` on
``keys`` (two databases of the same PostgreSQL server), for tests/protocol/test_shards.py.

The tenant is the request's ``X-Tenant`` header. :class:`TenantMiddleware` puts it in a
context variable for the request; :class:`TenantRouter` sends the reads and writes of the
test app's and django_idempotency's models to that tenant's database, as a tenant router
of a real project does; :func:`tenant_database` is the same choice as a
``DATABASE_ROUTING`` callable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.http import HttpRequest, HttpResponse

#: Each tenant's database.
TENANTS = {"a": "default", "b": "keys"}
#: The apps whose models live on the tenant's database.
SHARDED_APPS = frozenset({"testapp", "django_idempotency"})

_current: ContextVar[str | None] = ContextVar("tenant", default=None)


def tenant_of(request: HttpRequest) -> str:
    return str(request.headers.get("X-Tenant", ""))


@contextmanager
def tenant(name: str | None) -> Iterator[None]:
    """Run the block as ``name``'s (the middleware's context, outside a request)."""
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)


class TenantMiddleware:
    """The request's tenant, from ``X-Tenant``, for the router."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with tenant(tenant_of(request) or None):
            return self.get_response(request)


class TenantRouter:
    """The sharded apps' models on the current tenant's database; no say without one (or
    for other models)."""

    def _route(self, model: Any) -> str | None:
        name = _current.get()
        if name is None or model._meta.app_label not in SHARDED_APPS:
            return None
        return TENANTS.get(name)

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._route(model)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._route(model)


def tenant_database(request: HttpRequest) -> str:
    """``DATABASE_ROUTING``'s callable form: the tenant's database, or ``"sqlite"`` (not a
    key database) for an unknown tenant."""
    return TENANTS.get(tenant_of(request), "sqlite")


def tenant_scope(request: HttpRequest) -> str:
    """Keys are per tenant."""
    return "tenant:" + tenant_of(request)
