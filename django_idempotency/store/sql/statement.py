"""One compiled statement: its text for one vendor, the order of its parameters, and running it.

Private to the store. A :class:`Statement` is made once per connection from a builder's
parts (:mod:`~django_idempotency.store.sql.parts`) and cached with the others in
:class:`~django_idempotency.store.sql.statements.Statements`; on the request path only
:meth:`Statement.params` and :meth:`Statement.execute` run.
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import timedelta
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, models
from django.utils import timezone

from .deadline import bounded
from .parts import Param, Part

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .base import BaseDialect


#: Raised (as ``invalid_text_representation``) by a statement that commits its transaction
#: in the same round trip (``postgresql.and_commit``) when it stored nothing: the fenced write found
#: no row of its own, so the transaction must not commit. The marker names the cause in the
#: database server's log too.
NOT_STORED_MARKER = "django_idempotency: not stored, transaction not committed"


def not_stored(error: BaseException) -> bool:
    """Whether ``error`` is the refusal of an ``postgresql.and_commit`` statement that stored
    nothing (its transaction is aborted: roll it back)."""
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) == "22P02" and NOT_STORED_MARKER in str(cause)


class Statement:
    """One statement's text and the order of its named parameters, composed once per backend.

    A :class:`~django_idempotency.store.sql.parts.Now` is the database's clock in the SQL
    where the dialect has one (``statement_timestamp()`` on PostgreSQL) and a parameter
    from ``timezone.now()`` elsewhere (SQLite), so that the same builder serves both.
    """

    __slots__ = ("_names", "_slots", "_take", "_time_field", "app_clock", "returns_rows", "sql")

    def __init__(
        self, dialect: type[BaseDialect], time_field: models.Field[Any, Any], *parts: Part
    ) -> None:
        text: list[str] = []
        # (parameter name, is a time from the app); a time's name is its offset's, or "".
        slots: list[tuple[str, bool]] = []
        for part in parts:
            if isinstance(part, str):
                text.append(part)
            elif isinstance(part, Param):
                text.append("%s")
                slots.append((part.name, False))
            elif not dialect.clock_in_sql:
                text.append("%s")
                slots.append((part.offset or "", True))
            elif part.offset is None:
                text.append(dialect.now_sql)
            else:
                text.append(dialect.now_plus_sql)
                slots.append((part.offset, False))
        self.sql = "".join(text)
        self._slots = tuple(slots)
        self._time_field = time_field
        self.app_clock = any(is_time for _name, is_time in slots)
        #: The parameters' names, when every one is taken from ``values`` as it is.
        self._names = None if self.app_clock else tuple(name for name, _is_time in slots)
        # ... and taken in one call (itemgetter of two names or more gives a tuple).
        self._take = itemgetter(*self._names) if self._names and len(self._names) > 1 else None
        #: A SELECT, or a write with RETURNING: known here, so that ``execute`` does not
        #: ask the cursor (psycopg builds a column description for that on every call).
        self.returns_rows = self.sql.lstrip().upper().startswith(("SELECT", "WITH")) or (
            " RETURNING " in self.sql.upper()
        )

    @property
    def param_slots(self) -> tuple[tuple[str, bool], ...]:
        """The parameters in the order of the SQL's ``%s``: ``(name, is_time)`` pairs, as
        :meth:`params` fills them. ``name`` is a key of ``values``; with ``is_time`` the
        parameter is the app's time (SQLite) plus the seconds in ``values[name]``, or the
        time itself when ``name`` is ``""``."""
        return self._slots

    def params(self, connection: BaseDatabaseWrapper, values: dict[str, Any]) -> list[Any]:
        """The parameter list: ``values`` by name (already adapted for the backend; the
        offsets of :class:`~django_idempotency.store.sql.parts.Now` in seconds), and the
        app's time where the SQL needs it."""
        if self._take is not None:  # no time from the app: ``values`` by name, in order
            return list(self._take(values))
        names = self._names
        if names is not None:
            return [values[name] for name in names]
        now = timezone.now()
        params: list[Any] = []
        for name, is_time in self._slots:
            if not is_time:
                params.append(values[name])
                continue
            at = now + timedelta(seconds=values[name]) if name else now
            params.append(self._time_field.get_db_prep_value(at, connection, prepared=True))
        return params

    def execute(
        self, connection: BaseDatabaseWrapper, values: dict[str, Any], *, bound: bool = True
    ) -> Any:
        """Run the statement; returns its first row (None when it has none) and its row
        count. ``bound``: cut after ``DATABASE_TIMEOUT`` (see
        :mod:`~django_idempotency.store.sql.deadline`); the purge and the drain, whose batches
        may take long, are not."""
        with bounded(connection) if bound else nullcontext(), connection.cursor() as cursor:
            cursor.execute(self.sql, self.params(connection, values))
            return cursor.fetchone() if self.returns_rows else None, cursor.rowcount

    def store_and_commit(self, connection: BaseDatabaseWrapper, values: dict[str, Any]) -> bool:
        """Run a statement made with :func:`~django_idempotency.store.sql.postgresql.and_commit`:
        True when it stored and committed, False when it stored nothing (its transaction is
        then aborted, not committed)."""
        try:
            with bounded(connection), connection.cursor() as cursor:
                cursor.execute(self.sql, self.params(connection, values))
        except DatabaseError as exc:
            if not_stored(exc):
                return False
            raise
        return True
