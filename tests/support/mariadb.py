"""MariaDB in the tests: the ``mariadb`` alias as a parameter, the ``databases`` lists that
include it where the settings have it, and connections of the tests' own to the server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings

from .services import MARIADB_URL

#: The ``alias`` parameter of MariaDB (tests/settings.py defines the alias when the server
#: answers, and always with CI set; the marker skips or fails the test without it).
MARIADB = pytest.param("mariadb", marks=pytest.mark.mariadb, id="mariadb")
#: MariaDB through MySQL's dialect (:func:`mysql_statements`), named for the fixture to see.
MYSQL_PATH = pytest.param("mariadb-as-mysql", marks=pytest.mark.mariadb, id="mariadb-as-mysql")


@contextmanager
def mysql_statements(alias: str = "mariadb") -> Iterator[None]:
    """While it lasts, ``alias`` (a MariaDB) runs the statements of MySQL's dialect: the
    claim without ``RETURNING``, as on MySQL 8, whose server these tests do not have."""
    from django.db import connections

    from django_idempotency.store.sql.mysql import MySQLDialect
    from django_idempotency.store.sql.statements import Statements, _statements
    from django_idempotency.store.sql.statements import statements as statements_module

    connection = connections[alias]
    cache_key = (alias, connection.vendor, False)
    before = _statements.get(cache_key)
    _statements[cache_key] = Statements(connection, MySQLDialect)
    assert statements_module(connection).dialect is MySQLDialect
    try:
        yield
    finally:
        if before is None:
            _statements.pop(cache_key, None)
        else:
            _statements[cache_key] = before


def with_mariadb(*aliases: str) -> list[str]:
    """``aliases``, and ``mariadb`` when the settings define it: the ``databases`` of a
    ``django_db`` mark whose tests run on MariaDB too."""
    return [*aliases, *(["mariadb"] if "mariadb" in settings.DATABASES else [])]


def mysql_connect(url: str = MARIADB_URL, **kwargs: Any) -> Any:
    """A mysqlclient connection of its own to the server (and database) of ``url``, in
    autocommit."""
    import MySQLdb

    parts = urlsplit(url)
    database = parts.path.lstrip("/")
    return MySQLdb.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        autocommit=True,
        **({"database": database} if database else {}),
        **kwargs,
    )


def mysql_admin(sql: str, url: str = MARIADB_URL) -> None:
    """One statement on the MariaDB server of ``url``, outside any database (``CREATE
    DATABASE``, ``DROP DATABASE``...)."""
    with closing(mysql_connect(urlsplit(url)._replace(path="").geturl())) as conn:
        conn.cursor().execute(sql)


def database_url_of(alias: str = "mariadb") -> str:
    """The URL of the test database of ``alias`` (for a subprocess or a connection of a
    test's own)."""
    db = settings.DATABASES[alias]
    auth = str(db["USER"]) + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"mysql://{auth}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
