"""Django configured in the measuring process, for the measures that call the library directly
rather than through a project (the claim loops, the purge, the polls, the async views)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def configure(
    databases: Mapping[str, dict[str, Any]],
    *,
    apps: Sequence[str] = (),
    idempotency: Mapping[str, Any] | None = None,
    migrate: bool = True,
    **extra: Any,
) -> None:
    """``settings.configure()`` with the library installed (and ``apps``), ``databases``
    and ``IDEMPOTENCY`` (default: the admin off), then ``django.setup()`` and, with
    ``migrate``, every database migrated."""
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        TIME_ZONE="UTC",
        SECRET_KEY="benchmark",
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django_idempotency",
            *apps,
        ],
        DATABASES=dict(databases),
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        IDEMPOTENCY=dict(idempotency or {"ADMIN_ENABLED": False}),
        **extra,
    )
    django.setup()
    if migrate:
        from django.core.management import call_command

        for alias in databases:
            call_command("migrate", database=alias, verbosity=0)


def close_connections() -> None:
    """Close this process's database connections (before a scratch database is dropped)."""
    from django.conf import settings

    if settings.configured:
        from django.db import connections

        connections.close_all()
