"""The one clock of the store, for the ORM and for the code that compares in Python.

The statements take the time from the database server's clock
(:attr:`~django_idempotency.store.sql.base.BaseDialect.clock_in_sql`); what goes through
the ORM (the purge on MariaDB and MySQL, the admin's filters and actions) and what compares
in Python (the drain through the ORM) takes it from the same clock here, never from the
app server's, and never in the session's time zone: Django's ``Now()`` is MariaDB's
``CURRENT_TIMESTAMP(6)``, the session's local time, while Django keeps datetimes there in
UTC, so a session set to another zone (``init_command``) would move every comparison by
the zone's offset. See docs/how-it-works.md ("One clock").
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now
from django.utils import timezone

from .sql.mysql import MySQLDialect
from .sql.statements import dialect_for

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


class DatabaseNow(Now):
    """The database's now in a query: ``statement_timestamp()`` on PostgreSQL (as Django's
    ``Now``), ``UTC_TIMESTAMP(6)`` on MariaDB and MySQL (not the session's
    ``CURRENT_TIMESTAMP(6)``), and on SQLite, whose database is a file on the app server's
    host, the app's ``timezone.now()`` as the statements take it."""

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template=MySQLDialect.now_sql, **extra)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return "%s", [connection.ops.adapt_datetimefield_value(timezone.now())]


def database_ago(delta: timedelta) -> ExpressionWrapper[Any]:
    """The database's now (:class:`DatabaseNow`) less ``delta``, for an ORM filter or
    update."""
    return ExpressionWrapper(DatabaseNow() - Value(delta), output_field=DateTimeField())


def database_now(connection: BaseDatabaseWrapper) -> datetime:
    """The database's now, read with one ``SELECT`` (aware, in UTC); the app's
    ``timezone.now()`` where the statements take it from there (SQLite)."""
    dialect = dialect_for(connection)
    if not dialect.clock_in_sql:
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {dialect.now_sql}")
        return database_time(cursor.fetchone()[0])


def database_time(value: datetime) -> datetime:
    """A time the database's clock gave (``now_sql`` in a statement's columns), aware and
    in UTC: MariaDB's and MySQL's ``UTC_TIMESTAMP(6)`` is a naive ``DATETIME`` in UTC."""
    if timezone.is_naive(value):
        return timezone.make_aware(value, UTC)
    return value.astimezone(UTC)
