"""The PostgreSQL a measure uses: scratch databases made through the admin URL, dropped after.

``BENCH_DATABASE_URL`` names the server and an admin database (default: user ``postgres`` on
127.0.0.1:5432, database ``postgres``); a measure never touches a database it did not make.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def admin(sql: str) -> None:
    """One statement in autocommit on the admin database (``CREATE DATABASE``...)."""
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql)


def url_of(name: str) -> str:
    """The URL of the database ``name`` on the admin URL's server."""
    return urlsplit(ADMIN_URL)._replace(path="/" + name).geturl()


@contextmanager
def scratch_database(prefix: str = "idem_bench_") -> Iterator[str]:
    """A new, empty database (``prefix`` + a random suffix); its URL; dropped afterwards,
    with whatever is still connected to it."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    admin(f'CREATE DATABASE "{name}"')
    try:
        yield url_of(name)
    finally:
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django_database(url: str) -> dict[str, Any]:
    """Django's ``DATABASES`` entry for the PostgreSQL database at ``url``, with persistent
    connections (``CONN_MAX_AGE = None``)."""
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 5432),
        "CONN_MAX_AGE": None,
    }


def scalar(url: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """One value from the database at ``url``."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]
