"""Which database errors a retry gets past: a conflict with a concurrent transaction, a lost
connection. Everything else a view raises is its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, OperationalError

from ..conf import conf
from ..errors import DatabaseUnavailable, IdempotencyError, StoreUnavailable, TransientConflict

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django_stubs_ext import StrOrPromise

#: PostgreSQL SQLSTATEs a retry gets past: serialization failure, deadlock, lock timeout.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
#: SQLite's messages for a lock or snapshot conflict.
TRANSIENT_SQLITE_MESSAGES = ("database is locked", "database table is locked")
#: PostgreSQL SQLSTATEs of a lost connection besides class 08 (connection exception):
#: admin_shutdown, crash_shutdown, cannot_connect_now.
CONNECTION_LOST_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
#: MySQL's and MariaDB's error codes a retry gets past: a lock wait timeout, a deadlock,
#: and a row changed since a REPEATABLE READ snapshot read it (MariaDB 11.6+).
TRANSIENT_MYSQL_CODES = frozenset({1205, 1213, 1020})
#: MySQL's and MariaDB's codes of a lost connection: the server's shutdown, the connection
#: killed (MariaDB) or closed for inactivity (MySQL 8), and the client's: cannot connect,
#: the server has gone away, lost during a query, the connection broken.
CONNECTION_LOST_MYSQL_CODES = frozenset({1053, 1927, 4031, 2002, 2003, 2006, 2013, 2055})
#: What drivers say about a closed or broken connection when there is no SQLSTATE.
CONNECTION_LOST_MESSAGES = (
    "server closed the connection unexpectedly",
    "terminating connection",
    "connection already closed",
    "the connection is closed",
    "the connection is lost",
    "could not receive data from server",
    "could not send data to server",
    "connection to server",
    "ssl syscall error",
)


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of the driver error under a Django database error (psycopg 3:
    ``sqlstate``, psycopg2: ``pgcode``), None when the server sent none."""
    cause = exc.__cause__
    code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return str(code) if code else None


def _from_psycopg(exc: BaseException) -> bool:
    return type(exc.__cause__).__module__.split(".")[0] in ("psycopg", "psycopg2")


def _mysql_code(exc: BaseException) -> int | None:
    """The MySQL or MariaDB error code under a Django database error (mysqlclient's
    ``args[0]``), None for another driver's error. A mysqlclient ``InterfaceError`` on a
    connection it has closed carries code 0."""
    cause = exc.__cause__
    if type(cause).__module__.split(".")[0] != "MySQLdb":
        return None
    args = getattr(cause, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def is_transient(exc: BaseException) -> bool:
    """Whether a database error is a conflict with a concurrent transaction."""
    if not isinstance(exc, OperationalError):
        return False
    code = _mysql_code(exc)
    if code is not None:
        return code in TRANSIENT_MYSQL_CODES
    sqlstate = _sqlstate(exc)
    if sqlstate is not None:
        return sqlstate in TRANSIENT_SQLSTATES
    message = str(exc).lower()
    return any(text in message for text in TRANSIENT_SQLITE_MESSAGES)


def no_partition(exc: BaseException) -> bool:
    """Whether a database error is PostgreSQL's refusal of a row whose ``expires_at`` no
    partition of the key table holds (``PARTITION_INTERVAL``: the partitions ahead ran out)."""
    return _sqlstate(exc) == "23514" and "no partition" in str(exc)


def retry_after() -> int:
    """``RETRY_AFTER``, or 1 second when it is not set: the ``Retry-After`` of a 503."""
    value = conf.RETRY_AFTER
    return 1 if value is None else value


def store_unavailable(exc: BaseException, detail: StrOrPromise | None = None) -> StoreUnavailable:
    """The ``StoreUnavailable`` for a statement of the key store that failed with ``exc``
    (chained to it). With ``Retry-After`` when no partition holds the row's expiry (as
    docs/operations.md, "Time partitions", promises): the next run of the purge, which
    creates partitions ahead, gets the retry past it."""
    error = StoreUnavailable(detail, retry_after=retry_after() if no_partition(exc) else None)
    error.__cause__ = exc
    return error


#: What ``classify_database_error`` looks at: Django's ``InterfaceError`` (psycopg2's
#: "connection already closed") is not a ``DatabaseError``.
DATABASE_ERRORS = (DatabaseError, InterfaceError)


def is_connection_lost(exc: BaseException, connection: BaseDatabaseWrapper | None = None) -> bool:
    """Whether a database error means the connection is gone: a SQLSTATE of class 08 or
    57P01-57P03, a MySQL code of :data:`CONNECTION_LOST_MYSQL_CODES` (or mysqlclient's
    code 0, its own closed connection), a psycopg ``OperationalError`` without one (the
    server never answered: psycopg reports a closed or broken connection so), a message
    saying so (also on an
    ``InterfaceError``), or ``connection`` no longer answering. A closed *cursor* is a
    bug in the view, not a lost connection."""
    if not isinstance(exc, DATABASE_ERRORS):
        return False
    code = _mysql_code(exc)
    if code is not None and (code in CONNECTION_LOST_MYSQL_CODES or code == 0):
        return True
    sqlstate = _sqlstate(exc)
    if sqlstate is not None:
        return sqlstate.startswith("08") or sqlstate in CONNECTION_LOST_SQLSTATES
    if isinstance(exc, OperationalError) and _from_psycopg(exc):
        return True
    message = str(exc).lower()
    if any(text in message for text in CONNECTION_LOST_MESSAGES):
        return True
    if connection is None or connection.connection is None or connection.in_atomic_block:
        # Closed already (nothing to ask), or in a transaction that an ordinary error
        # has aborted, where any statement fails whatever the state of the connection.
        return False
    return not connection.is_usable()


def classify_database_error(
    exc: BaseException,
    connection: BaseDatabaseWrapper | None = None,
    *,
    retry_after: int = 1,
) -> IdempotencyError | None:
    """The answer for a database error that left an idempotent view: ``TransientConflict``
    for a conflict with a concurrent transaction, ``DatabaseUnavailable`` for a lost
    connection (both with ``retry_after``), or None for any other error, which is the
    view's own and is re-raised. ``connection`` (the keys' database) is asked whether
    it still works when the error itself does not tell."""
    if is_transient(exc):
        return TransientConflict(retry_after=retry_after)
    if is_connection_lost(exc, connection):
        return DatabaseUnavailable(retry_after=retry_after)
    return None
