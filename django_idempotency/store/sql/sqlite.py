"""SQLite's dialect: the time from the app's clock, which is the database's.

The database is a file on the app server's own host, so ``timezone.now()`` *is* the
database's clock, and it is stored exactly as Django stores datetimes there.
"""

from __future__ import annotations

from .base import BaseDialect


class SQLiteDialect(BaseDialect):
    vendor = "sqlite"
    display_name = "SQLite"
    strategies = frozenset({"db", "hybrid"})
    purges_in_statement = True
    clock_in_sql = False
