"""PostgreSQL administration and one-value queries on a database URL (PostgreSQL, MariaDB
or SQLite)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any
from urllib.parse import urlsplit

from .services import POSTGRES_URL


def pg_admin(sql: str, url: str = POSTGRES_URL) -> None:
    """One statement in autocommit (``CREATE DATABASE``, ``DROP DATABASE``...)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def with_database(url: str, name: str) -> str:
    """``url`` pointing at the database ``name`` instead."""
    return urlsplit(url)._replace(path="/" + name).geturl()


def query_scalar(database_url: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """One value from the database (placeholders: %s)."""
    parts = urlsplit(database_url)
    if parts.scheme == "sqlite":
        with closing(sqlite3.connect(parts.path)) as conn:
            row = conn.execute(sql.replace("%s", "?"), params).fetchone()
    elif parts.scheme in {"mysql", "mariadb"}:
        from .mariadb import mysql_connect

        with closing(mysql_connect(database_url)) as conn:
            cursor = conn.cursor()
            cursor.execute(sql, params)
            row = cursor.fetchone()
    else:
        import psycopg

        with psycopg.connect(database_url) as conn:
            row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def count_rows(database_url: str, table: str, where: str = "1=1") -> int:
    return int(query_scalar(database_url, f"SELECT COUNT(*) FROM {table} WHERE {where}"))
