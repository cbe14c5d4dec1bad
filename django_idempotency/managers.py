"""The atomic and batched SQL behind IdempotencyKey.

Shared by the strategies, the admin, the management command and the Celery
tasks. Every method is one short statement or one short transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import connections, models, transaction
from django.db.models.functions import Now
from django.utils import timezone

from .conf import conf
from .status import COMPLETED, IN_PROGRESS

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .models import (
        IdempotencyKey,  # noqa: F401 - named in a string annotation
        IdempotencyOutbox,  # noqa: F401 - named in a string annotation
    )
    from .responses import StoredResponse


class ClaimState(Enum):
    CLAIMED = "claimed"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    MISMATCH = "mismatch"


@dataclass(frozen=True)
class ClaimResult:
    state: ClaimState
    pk: int | None = None
    token: uuid.UUID | None = None
    taken_over: bool = False
    response: StoredResponse | None = None


#: The columns of the claim's INSERT.
CLAIM_COLUMNS = (
    "scope",
    "key",
    "fingerprint",
    "status",
    "claim_token",
    "locked_at",
    "request_method",
    "request_path",
    "response_headers",
    "created_at",
    "expires_at",
)

#: The columns of :attr:`_Statements.store`.
STORE_COLUMNS = (
    "scope",
    "key",
    "fingerprint",
    "status",
    "claim_token",
    "locked_at",
    "request_method",
    "request_path",
    "response_status",
    "response_headers",
    "response_body",
    "created_at",
    "completed_at",
    "expires_at",
)

#: The columns of :attr:`_Statements.read`, the fields of :class:`KeyRow`.
READ_COLUMNS = (
    "id",
    "fingerprint",
    "status",
    "claim_token",
    "locked_at",
    "expires_at",
    "response_status",
    "response_headers",
    "response_body",
)


class KeyRow(NamedTuple):
    """One IdempotencyKey row as :meth:`IdempotencyKeyManager.read` returns it, or a live
    row of the hybrid strategy's outbox, as a completed key (``from_outbox``: its ``pk`` is
    the outbox row's, and it has no claim token)."""

    pk: int
    fingerprint: str
    status: str
    claim_token: uuid.UUID | None
    locked_at: datetime | None
    expires_at: datetime
    response_status: int | None
    response_headers: dict[str, str] | None
    response_body: bytes | None
    from_outbox: bool = False


class _RowReader:
    """``SELECT <columns> FROM <table> WHERE scope = %s AND key = %s [AND expires_at > %s]``,
    built once per backend, with the rows converted as the ORM converts them.

    Compiling the equivalent ``values_list(...).first()`` costs several times the
    statement's own round trip, and these reads are on every request's path.
    """

    def __init__(
        self,
        model: type[models.Model],
        connection: BaseDatabaseWrapper,
        columns: tuple[str, ...],
        *,
        live_only: bool = False,
    ) -> None:
        q = connection.ops.quote_name
        opts = model._meta
        fields = {f.name: f for f in opts.concrete_fields}
        self.expires_field = fields["expires_at"]
        selected = ", ".join(q(str(fields[name].column)) for name in columns)
        self.sql = (
            f"SELECT {selected} FROM {q(opts.db_table)} WHERE {q('scope')} = %s AND {q('key')} = %s"
        )
        self.live_only = live_only
        if live_only:
            self.sql += f" AND {q(str(self.expires_field.column))} > %s"
        self.converters = _converters(model, connection, columns)

    def fetch(
        self, connection: BaseDatabaseWrapper, scope: str, key: str, now: datetime | None = None
    ) -> list[Any] | None:
        """The converted row of (scope, key) (live at ``now`` when ``live_only``), or None."""
        params: list[Any] = [scope, key]
        if self.live_only:
            assert now is not None
            params.append(self.expires_field.get_db_prep_value(now, connection, prepared=True))
        with connection.cursor() as cursor:
            cursor.execute(self.sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        return _convert(connection, row, self.converters)


def _converters(
    model: type[models.Model], connection: BaseDatabaseWrapper, columns: tuple[str, ...]
) -> list[tuple[list[Any], Any]]:
    """What SQLCompiler.get_converters() gives the ORM for each column: the backend's
    converters, then the field's from_db_value."""
    fields = {f.name: f for f in model._meta.concrete_fields}
    converters = []
    for name in columns:
        col = fields[name].get_col(model._meta.db_table)
        converters.append(
            (connection.ops.get_db_converters(col) + col.get_db_converters(connection), col)
        )
    return converters


def _convert(
    connection: BaseDatabaseWrapper, row: Any, converters: list[tuple[list[Any], Any]]
) -> list[Any]:
    """The first ``len(converters)`` values of ``row``, converted as the ORM converts them."""
    values = []
    for value, (functions, col) in zip(row, converters, strict=False):
        for function in functions:
            value = function(value, col, connection)
        values.append(value)
    return values


# -- the clock -------------------------------------------------------------------------------


def clock_in_sql(connection: BaseDatabaseWrapper) -> bool:
    """Whether the statements take the time from the database server's clock.

    On PostgreSQL they do: every lease, expiry and purge decision is made on the one
    clock of the database server, with ``statement_timestamp()`` (the start of the
    statement; not ``now()``, the start of the transaction, which for ``complete`` is
    the start of the view's transaction). App servers whose clocks disagree then still
    agree on whether a lease is stale. On SQLite the time is ``timezone.now()``: the
    database is a file on the app server's own host, so that clock *is* the database's
    (and it is stored exactly as Django stores datetimes there).
    """
    return connection.vendor == "postgresql"


class _Param:
    """A named parameter of a :class:`_Statement`."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Now:
    """The current time in a :class:`_Statement` (see :func:`clock_in_sql`), plus the
    number of seconds in parameter ``offset`` when given (negative for the past)."""

    __slots__ = ("offset",)

    def __init__(self, offset: str | None = None) -> None:
        self.offset = offset


_Part = str | _Param | _Now


class _Statement:
    """One statement's text and the order of its named parameters, composed once per backend.

    A :class:`_Now` is ``statement_timestamp()`` in the SQL on PostgreSQL and a parameter
    from ``timezone.now()`` on SQLite, so that the same statement serves both.
    """

    __slots__ = ("_slots", "_time_field", "app_clock", "sql")

    def __init__(
        self,
        connection: BaseDatabaseWrapper,
        time_field: models.Field[Any, Any],
        *parts: _Part,
    ) -> None:
        in_sql = clock_in_sql(connection)
        text: list[str] = []
        # (parameter name, is a time from the app); a time's name is its offset's, or "".
        slots: list[tuple[str, bool]] = []
        for part in parts:
            if isinstance(part, str):
                text.append(part)
            elif isinstance(part, _Param):
                text.append("%s")
                slots.append((part.name, False))
            elif not in_sql:
                text.append("%s")
                slots.append((part.offset or "", True))
            elif part.offset is None:
                text.append("statement_timestamp()")
            else:
                text.append("(statement_timestamp() + make_interval(secs => %s))")
                slots.append((part.offset, False))
        self.sql = "".join(text)
        self._slots = tuple(slots)
        self._time_field = time_field
        self.app_clock = any(is_time for _name, is_time in slots)

    def params(self, connection: BaseDatabaseWrapper, values: dict[str, Any]) -> list[Any]:
        """The parameter list: ``values`` by name (already adapted for the backend; the
        offsets of :class:`_Now` in seconds), and the app's time where the SQL needs it."""
        now = timezone.now() if self.app_clock else None
        params: list[Any] = []
        for name, is_time in self._slots:
            if not is_time:
                params.append(values[name])
                continue
            assert now is not None
            at = now + timedelta(seconds=values[name]) if name else now
            params.append(self._time_field.get_db_prep_value(at, connection, prepared=True))
        return params


def _joined(parts: list[_Part], separator: str = ", ") -> list[_Part]:
    joined: list[_Part] = []
    for index, part in enumerate(parts):
        if index:
            joined.append(separator)
        joined.append(part)
    return joined


class _Statements:
    """SQL for one table on one backend, built once.

    Parameters are adapted with the model's own fields, through
    ``get_db_prep_value(prepared=True)``: every value here is made by this module and
    already has the field's Python type (a ``uuid.UUID``, a dict, bytes, str), so the
    generic ``get_prep_value`` step of ``get_db_prep_save`` would only repeat checks; the
    backend's adaptation (``connection.ops``) is still applied. Times come from the
    database's clock (:func:`clock_in_sql`).
    """

    def __init__(self, model: type[models.Model], connection: BaseDatabaseWrapper) -> None:
        from .models import IdempotencyOutbox

        q = connection.ops.quote_name
        opts = model._meta
        table = q(opts.db_table)
        self.fields: dict[str, models.Field[Any, Any]] = {}
        for field in opts.concrete_fields:
            self.fields[field.name] = field
        outbox = q(IdempotencyOutbox._meta.db_table)
        outbox_fields = {f.name: f for f in IdempotencyOutbox._meta.concrete_fields}

        def col(name: str) -> str:
            return q(str(self.fields[name].column))

        def outbox_col(name: str) -> str:
            return f"{outbox}.{q(str(outbox_fields[name].column))}"

        def statement(*parts: _Part) -> _Statement:
            return _Statement(connection, self.fields["expires_at"], *parts)

        status, locked, expires = col("status"), col("locked_at"), col("expires_at")
        #: In progress under a lease older than ``lock_timeout`` (``stale`` = -lock_timeout).
        stale: list[_Part] = [
            f"{status} = '{IN_PROGRESS}' AND ({locked} IS NULL OR {locked} <= ",
            _Now("stale"),
            ")",
        ]
        #: A stale lease, or a completed key whose TTL is over: free for a takeover.
        takeover: list[_Part] = [
            f"(({status} = '{COMPLETED}' AND {expires} <= ",
            _Now(),
            ") OR (",
            *stale,
            "))",
        ]
        stamped: dict[str, _Part] = {
            "locked_at": _Now(),
            "created_at": _Now(),
            "expires_at": _Now("ttl"),
        }
        #: The key's live outbox row: a response the hybrid strategy committed that is not
        #: drained yet. It settles the key whatever strategy is in use now.
        outbox_live: list[_Part] = [
            f" FROM {outbox} WHERE {outbox_col('scope')} = ",
            _Param("scope"),
            f" AND {outbox_col('key')} = ",
            _Param("key"),
            f" AND {outbox_col('expires_at')} > ",
            _Now(),
        ]
        # One statement: a key settled in the outbox inserts nothing (on SQLite, INSERT …
        # SELECT … ON CONFLICT needs the SELECT's WHERE clause, which it has).
        self.claim = statement(
            f"INSERT INTO {table} ({', '.join(col(name) for name in CLAIM_COLUMNS)}) SELECT ",
            *_joined([stamped.get(name, _Param(name)) for name in CLAIM_COLUMNS]),
            " WHERE NOT EXISTS (SELECT 1",
            *outbox_live,
            f") ON CONFLICT ({q('scope')}, {q('key')}) DO NOTHING RETURNING {q('id')}",
        )
        # The outbox row read as a completed key in READ_COLUMNS order, first, else the
        # IdempotencyKey row: one statement.
        as_key = {
            "id": outbox_col("id"),
            "fingerprint": outbox_col("fingerprint"),
            "status": f"'{COMPLETED}'",
            "claim_token": "NULL",
            "locked_at": "NULL",
            "expires_at": outbox_col("expires_at"),
            "response_status": outbox_col("response_status"),
            "response_headers": outbox_col("response_headers"),
            "response_body": outbox_col("response_body"),
        }
        from_outbox = ", ".join(as_key[name] for name in READ_COLUMNS)
        from_keys = ", ".join(col(name) for name in READ_COLUMNS)
        key_row: list[_Part] = [
            f" FROM {table} WHERE {q('scope')} = ",
            _Param("scope"),
            f" AND {q('key')} = ",
            _Param("key"),
            " ORDER BY 1 LIMIT 1",
        ]
        self.read = statement(
            f"SELECT 0, {from_outbox}",
            *outbox_live,
            f" UNION ALL SELECT 1, {from_keys}",
            *key_row,
        )
        #: The loser's read, the same with whether the row may be taken over (decided in
        #: SQL, on the database's clock; never an outbox row).
        self.claim_read = statement(
            f"SELECT 0, {from_outbox}, FALSE",
            *outbox_live,
            f" UNION ALL SELECT 1, {from_keys}, ",
            *takeover,
            *key_row,
        )
        self.take_over = statement(
            f"UPDATE {table} SET {col('claim_token')} = ",
            _Param("token"),
            f", {col('fingerprint')} = ",
            _Param("fingerprint"),
            f", {status} = '{IN_PROGRESS}', {locked} = ",
            _Now(),
            f", {col('request_method')} = ",
            _Param("method"),
            f", {col('request_path')} = ",
            _Param("path"),
            f", {col('response_status')} = NULL, {col('response_headers')} = ",
            _Param("response_headers"),
            f", {col('response_body')} = NULL, {col('created_at')} = ",
            _Now(),
            f", {col('completed_at')} = NULL, {expires} = ",
            _Now("ttl"),
            f" WHERE {q('id')} = ",
            _Param("pk"),
            f" AND {col('claim_token')} = ",
            _Param("old_token"),
            " AND ",
            *takeover,
            f" AND NOT EXISTS (SELECT 1 FROM {outbox} WHERE {outbox_col('scope')} = ",
            f"{table}.{q('scope')} AND {outbox_col('key')} = {table}.{q('key')} ",
            f"AND {outbox_col('expires_at')} > ",
            _Now(),
            ")",
        )
        owner: list[_Part] = [
            f" WHERE {q('id')} = ",
            _Param("pk"),
            f" AND {col('claim_token')} = ",
            _Param("token"),
            f" AND {status} = '{IN_PROGRESS}'",
        ]
        self.complete = statement(
            f"UPDATE {table} SET {status} = '{COMPLETED}', {col('response_status')} = ",
            _Param("response_status"),
            f", {col('response_headers')} = ",
            _Param("response_headers"),
            f", {col('response_body')} = ",
            _Param("response_body"),
            f", {col('completed_at')} = ",
            _Now(),
            f", {locked} = NULL, {expires} = ",
            _Now("ttl"),
            *owner,
        )
        self.renew = statement(f"UPDATE {table} SET {locked} = ", _Now(), *owner)
        self.release = statement(f"DELETE FROM {table}", *owner)

        stored: dict[str, _Part] = {
            "created_at": _Now(),
            "completed_at": _Now(),
            "expires_at": _Now("ttl"),
            "status": f"'{COMPLETED}'",
            "locked_at": "NULL",
        }
        updates = ", ".join(f"{col(name)} = EXCLUDED.{col(name)}" for name in STORE_COLUMNS[2:])
        self.store = statement(
            f"INSERT INTO {table} ({', '.join(col(name) for name in STORE_COLUMNS)}) VALUES (",
            *_joined([stored.get(name, _Param(name)) for name in STORE_COLUMNS]),
            f") ON CONFLICT ({q('scope')}, {q('key')}) DO UPDATE SET {updates} "
            # Only over an expired record: never over one another execution completed.
            f"WHERE {table}.{expires} <= EXCLUDED.{q('created_at')} RETURNING {q('id')}",
        )

        #: The hybrid strategy's check of a key before its commit (fence_stale_claim).
        self.fence_read = statement(
            f"SELECT {q('id')}, {status}, {col('claim_token')}, ",
            *takeover,
            f" FROM {table} WHERE {q('scope')} = ",
            _Param("scope"),
            f" AND {q('key')} = ",
            _Param("key"),
        )
        self.fence_delete = statement(
            f"DELETE FROM {table} WHERE {q('id')} = ",
            _Param("pk"),
            f" AND {col('claim_token')} = ",
            _Param("token"),
            " AND ",
            *stale,
        )

        self.read_converters = _converters(model, connection, READ_COLUMNS)

    def prep(self, name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
        """``value`` (already of field ``name``'s Python type) as the backend takes it."""
        return self.fields[name].get_db_prep_value(value, connection, prepared=True)


class IdempotencyKeyManager(models.Manager["IdempotencyKey"]):
    _statements: dict[tuple[str, str], _Statements]

    def __init__(self) -> None:
        super().__init__()
        self._statements = {}

    # -- helpers -------------------------------------------------------------------------

    def _sql(self, connection: BaseDatabaseWrapper) -> _Statements:
        cache_key = (connection.alias, connection.vendor)
        statements = self._statements.get(cache_key)
        if statements is None:
            statements = self._statements[cache_key] = _Statements(self.model, connection)
        return statements

    @staticmethod
    def _execute(
        connection: BaseDatabaseWrapper, statement: _Statement, values: dict[str, Any]
    ) -> Any:
        """Run ``statement``; returns its first row and its row count."""
        with connection.cursor() as cursor:
            cursor.execute(statement.sql, statement.params(connection, values))
            return cursor.fetchone() if cursor.description else None, cursor.rowcount

    # -- claim -----------------------------------------------------------------------------

    def claim(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        *,
        ttl: float,
        lock_timeout: float,
        method: str = "",
        path: str = "",
        using: str = "default",
    ) -> ClaimResult:
        """Claim ``(scope, key)`` with one ``INSERT … ON CONFLICT DO NOTHING RETURNING``.

        The loser reads the row in a second statement (a CTE would not see a
        concurrent winner under READ COMMITTED) and learns whether the key is in
        progress, completed (with its stored response) or used for another request.
        A lease older than ``lock_timeout`` and an expired *completed* record are
        taken over by a conditional UPDATE on the old claim token that re-checks
        staleness. An in-progress record is governed by its lease alone: its TTL
        may pass while a heartbeat keeps the lease alive. Staleness and expiry are
        judged on the database's clock (:func:`clock_in_sql`), in the SQL itself.
        """
        connection = connections[using]
        sql = self._sql(connection)
        values = {
            "scope": scope,
            "key": key,
            "fingerprint": fingerprint,
            "status": IN_PROGRESS,
            "request_method": method,
            "request_path": path,
            "response_headers": sql.prep("response_headers", {}, connection),
            "ttl": float(ttl),
            "stale": -float(lock_timeout),
        }
        for _attempt in range(5):
            token = uuid.uuid4()
            values["claim_token"] = sql.prep("claim_token", token, connection)
            row, _count = self._execute(connection, sql.claim, values)
            if row is not None:
                return ClaimResult(ClaimState.CLAIMED, pk=int(row[0]), token=token)

            # Nothing inserted: the key has a row, or a live outbox row (which comes first).
            found, _count = self._execute(connection, sql.claim_read, values)
            if found is None:
                continue  # released, purged or drained between the two statements: again
            existing = self._key_row(connection, sql, found)
            if found[-1]:  # a stale lease or an expired completed key (never in the outbox)
                assert existing.claim_token is not None
                if self._take_over(
                    existing.pk,
                    existing.claim_token,
                    token,
                    fingerprint,
                    ttl=ttl,
                    lock_timeout=lock_timeout,
                    method=method,
                    path=path,
                    using=using,
                ):
                    return ClaimResult(
                        ClaimState.CLAIMED, pk=existing.pk, token=token, taken_over=True
                    )
                continue  # someone else moved first: read again
            return self._settled(existing, fingerprint)
        # The row kept changing under us (released, purged or taken over each time):
        # the key is busy, and the client is told to retry.
        return ClaimResult(ClaimState.IN_PROGRESS)

    @staticmethod
    def _key_row(connection: BaseDatabaseWrapper, sql: _Statements, found: Any) -> KeyRow:
        """The :class:`KeyRow` of a row of :attr:`_Statements.read` (or ``claim_read``)."""
        values = _convert(connection, found[1:], sql.read_converters)
        values.append(int(found[0]) == 0)  # from_outbox
        return KeyRow(*values)

    @staticmethod
    def _settled(existing: KeyRow, fingerprint: str) -> ClaimResult:
        """What a live row that cannot be taken over answers (an outbox row's ``pk`` is not
        an IdempotencyKey's, and is not returned)."""
        pk = None if existing.from_outbox else existing.pk
        if existing.fingerprint != fingerprint:
            return ClaimResult(ClaimState.MISMATCH, pk=pk)
        if existing.status == IN_PROGRESS:
            return ClaimResult(ClaimState.IN_PROGRESS, pk=pk)
        from .responses import StoredResponse

        return ClaimResult(
            ClaimState.COMPLETED,
            pk=pk,
            response=StoredResponse(
                status=int(existing.response_status or 0),
                headers=dict(existing.response_headers or {}),
                body=bytes(existing.response_body or b""),
            ),
        )

    def read(self, scope: str, key: str, *, using: str = "default") -> KeyRow | None:
        """The row of ``(scope, key)``, or None: one SELECT whose text is built once, no ORM query
        to compile per call (the values are converted as the ORM converts them).

        A live row of the hybrid strategy's outbox (a completion not drained yet) comes
        first, as a completed row with ``from_outbox`` set: whatever strategy reads the
        key now, it is settled.
        """
        connection = connections[using]
        sql = self._sql(connection)
        found, _count = self._execute(connection, sql.read, {"scope": scope, "key": key})
        return None if found is None else self._key_row(connection, sql, found)

    def _take_over(
        self,
        pk: int,
        old_token: uuid.UUID,
        token: uuid.UUID,
        fingerprint: str,
        *,
        ttl: float,
        lock_timeout: float,
        method: str,
        path: str,
        using: str,
    ) -> bool:
        """Replace a stale or expired claim, only if its token is still ``old_token``,
        it is *still* stale or expired (on the database's clock), and the outbox holds no
        live completion of the key.

        The token alone is not enough: it does not change when the owner renews or
        completes, so an owner that was slow rather than dead could otherwise lose a
        renewed lease, or a stored response, to a claimant that read the row just before.
        """
        connection = connections[using]
        sql = self._sql(connection)
        _row, taken = self._execute(
            connection,
            sql.take_over,
            {
                "pk": pk,
                "old_token": sql.prep("claim_token", old_token, connection),
                "token": sql.prep("claim_token", token, connection),
                "fingerprint": fingerprint,
                "method": method,
                "path": path,
                "response_headers": sql.prep("response_headers", {}, connection),
                "ttl": float(ttl),
                "stale": -float(lock_timeout),
            },
        )
        return bool(taken == 1)

    def fence_stale_claim(
        self, scope: str, key: str, lock_timeout: float, *, using: str = "default"
    ) -> bool:
        """Whether a commit of ``(scope, key)`` made elsewhere (the ``hybrid`` strategy's
        outbox row) may go ahead: True when IdempotencyKey has no live row for it.

        A completed row whose TTL is over does not count. An in-progress claim does as
        long as its lease is live (on the database's clock), whatever its TTL; a stale
        one is deleted (a conditional DELETE on its token that re-checks staleness), which
        fences its owner out: its ``complete`` will find no row. Run it in the
        transaction of the commit it guards. One statement when the key has no row.
        """
        connection = connections[using]
        sql = self._sql(connection)
        values: dict[str, Any] = {"scope": scope, "key": key, "stale": -float(lock_timeout)}
        found, _count = self._execute(connection, sql.fence_read, values)
        if found is None:
            return True
        pk, status, token, free = found
        if not free:
            return False
        if status != IN_PROGRESS:
            return True  # completed and expired: the commit replaces it
        values["pk"] = pk
        values["token"] = token  # as the database gave it
        _row, deleted = self._execute(connection, sql.fence_delete, values)
        return bool(deleted == 1)

    # -- the owner's statements ------------------------------------------------------------

    def _owner_update(
        self,
        connection: BaseDatabaseWrapper,
        statement: _Statement,
        pk: int,
        token: uuid.UUID,
        **values: Any,
    ) -> bool:
        sql = self._sql(connection)
        values["pk"] = pk
        values["token"] = sql.prep("claim_token", token, connection)
        _row, count = self._execute(connection, statement, values)
        return bool(count == 1)

    def renew(self, pk: int, token: uuid.UUID, *, using: str = "default") -> bool:
        """Extend the lease (to the database's now); False when the claim was taken over
        or is gone."""
        connection = connections[using]
        return self._owner_update(connection, self._sql(connection).renew, pk, token)

    def complete(
        self,
        pk: int,
        token: uuid.UUID,
        response: StoredResponse,
        *,
        ttl: float,
        using: str = "default",
    ) -> bool:
        """Store the response; False when ``token`` is no longer the claim's (fencing)."""
        connection = connections[using]
        sql = self._sql(connection)
        return self._owner_update(
            connection,
            sql.complete,
            pk,
            token,
            response_status=response.status,
            response_headers=sql.prep("response_headers", response.headers, connection),
            response_body=sql.prep("response_body", response.body, connection),
            ttl=float(ttl),
        )

    def store_completed(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        response: StoredResponse,
        *,
        ttl: float,
        method: str = "",
        path: str = "",
        using: str = "default",
    ) -> bool:
        """Write the completed record of ``(scope, key)`` in one
        ``INSERT … ON CONFLICT (scope, key) DO UPDATE … WHERE expired RETURNING``;
        False when a live record of the key exists (it is left as it is).

        For a caller that already serialises ``(scope, key)`` by other means (the
        ``advisory_lock`` strategy holds a transaction-level advisory lock on it):
        there is no claim token to check, and the row gets a fresh one.
        """
        connection = connections[using]
        sql = self._sql(connection)
        row, _count = self._execute(
            connection,
            sql.store,
            {
                "scope": scope,
                "key": key,
                "fingerprint": fingerprint,
                "claim_token": sql.prep("claim_token", uuid.uuid4(), connection),
                "request_method": method,
                "request_path": path,
                "response_status": response.status,
                "response_headers": sql.prep("response_headers", response.headers, connection),
                "response_body": sql.prep("response_body", response.body, connection),
                "ttl": float(ttl),
            },
        )
        return row is not None

    def release(self, pk: int, token: uuid.UUID, *, using: str = "default") -> bool:
        """Delete an in-progress claim so the client may retry; only for its own token."""
        connection = connections[using]
        return self._owner_update(connection, self._sql(connection).release, pk, token)

    # -- operations ------------------------------------------------------------------------

    def release_stuck(self, pks: list[int] | None = None, *, using: str = "default") -> int:
        """Release in-progress keys by hand (the admin action); returns how many."""
        queryset = self.using(using).filter(status=IN_PROGRESS)
        if pks is not None:
            queryset = queryset.filter(pk__in=pks)
        deleted, _ = queryset.delete()
        return deleted

    def _time(
        self, using: str, at: datetime | None, before: timedelta | float | None = None
    ) -> Any:
        """``at``, else the database's now (see :func:`clock_in_sql`), less ``before``
        (seconds or a timedelta), for an ORM filter."""
        if isinstance(before, (int, float)):
            before = timedelta(seconds=before)
        if at is not None:
            return at - before if before else at
        if clock_in_sql(connections[using]):
            return Now() - before if before else Now()
        return timezone.now() - before if before else timezone.now()

    def expired(
        self,
        *,
        now: datetime | None = None,
        older_than: timedelta | None = None,
        using: str = "default",
    ) -> Any:
        """The keys whose ``expires_at`` has passed (``older_than`` ago, when given) at
        ``now``, by default on the database's clock."""
        return self.using(using).filter(expires_at__lte=self._time(using, now, older_than))

    def delete_expired(
        self,
        *,
        batch_size: int = 1000,
        older_than: timedelta | None = None,
        now: datetime | None = None,
        using: str = "default",
        max_batches: int | None = None,
    ) -> int:
        """Delete expired keys in batches of ``batch_size``, one short transaction each.

        ``older_than`` keeps keys that expired less than that long ago. Expiry is
        judged at ``now``, by default on the database's clock. Returns the number of
        rows deleted.
        """
        cutoff = None
        if now is not None:
            cutoff = now - older_than if older_than else now
        total = 0
        for _count in self.iter_delete_expired(
            batch_size=batch_size,
            cutoff=cutoff,
            older_than=older_than,
            using=using,
            max_batches=max_batches,
        ):
            total += _count
        return total

    def iter_delete_expired(
        self,
        *,
        batch_size: int,
        cutoff: datetime | None = None,
        using: str = "default",
        max_batches: int | None = None,
        lease_cutoff: datetime | None = None,
        older_than: timedelta | None = None,
    ) -> Any:
        """Yield the number of rows deleted by each batch (for progress reporting).

        Deletes the keys that expired before ``cutoff``; by default, before the
        database's now (:func:`clock_in_sql`, taken again by each batch) less
        ``older_than``. A key still in progress under a live lease (renewed after
        ``lease_cutoff``, by default ``LOCK_TIMEOUT`` before the database's now) is never
        deleted, however old it is: its request is running and will complete it.

        On PostgreSQL and SQLite each batch is one statement in its own short
        transaction, ``DELETE … WHERE expires_at <= cutoff AND id IN (SELECT id …
        WHERE expires_at <= cutoff ORDER BY expires_at LIMIT n)``: one round trip, and
        faster than reading the ids first and deleting them in a second statement
        (``benchmarks/purge.py`` measures both). No ``pre_delete``/``post_delete``
        signals are sent for the purged rows.
        """
        connection = connections[using]
        if connection.vendor not in {"postgresql", "sqlite"}:
            yield from self._iter_delete_expired_orm(
                batch_size,
                cutoff if cutoff is not None else self._time(using, None, older_than),
                using,
                max_batches,
                lease_cutoff,
            )
            return
        sql = self._sql(connection)
        q = connection.ops.quote_name
        table = q(self.model._meta.db_table)
        pk, expires, status, locked = q("id"), q("expires_at"), q("status"), q("locked_at")
        expired_at: _Part = _Now("older") if cutoff is None else _Param("cutoff")
        lease_at: _Part = _Now("lease") if lease_cutoff is None else _Param("lease_cutoff")
        purgeable: list[_Part] = [
            f"{expires} <= ",
            expired_at,
            f" AND ({status} <> '{IN_PROGRESS}' OR {locked} IS NULL OR {locked} <= ",
            lease_at,
            ")",
        ]
        # The outer condition is checked again on the row version the DELETE locks: a key
        # that a request took over (renewed) after the subquery read it is not deleted.
        statement = _Statement(
            connection,
            sql.fields["expires_at"],
            f"DELETE FROM {table} WHERE ",
            *purgeable,
            f" AND {pk} IN (SELECT {pk} FROM {table} WHERE ",
            *purgeable,
            f" ORDER BY {expires} LIMIT ",
            _Param("limit"),
            ")",
        )
        values = {
            "cutoff": None if cutoff is None else sql.prep("expires_at", cutoff, connection),
            "older": -older_than.total_seconds() if older_than else 0.0,
            "lease_cutoff": (
                None if lease_cutoff is None else sql.prep("locked_at", lease_cutoff, connection)
            ),
            "lease": -float(conf.LOCK_TIMEOUT),
            "limit": int(batch_size),
        }
        batches = 0
        while max_batches is None or batches < max_batches:
            with transaction.atomic(using=using), connection.cursor() as cursor:
                cursor.execute(statement.sql, statement.params(connection, values))
                deleted = cursor.rowcount
            if deleted <= 0:
                return
            batches += 1
            yield deleted
            if deleted < batch_size:
                return

    def _purgeable(self, cutoff: Any, lease_cutoff: Any, using: str) -> Any:
        """Expired keys, less those in progress under a live lease (``cutoff`` and
        ``lease_cutoff``: datetimes or expressions)."""
        return (
            self.using(using)
            .filter(expires_at__lte=cutoff)
            .exclude(status=IN_PROGRESS, locked_at__gt=lease_cutoff)
        )

    def _iter_delete_expired_orm(
        self,
        batch_size: int,
        cutoff: Any,
        using: str,
        max_batches: int | None,
        lease_cutoff: datetime | None = None,
    ) -> Any:
        """The same through the ORM, for other databases."""
        lease = self._time(using, lease_cutoff, None if lease_cutoff else conf.LOCK_TIMEOUT)
        batches = 0
        while max_batches is None or batches < max_batches:
            with transaction.atomic(using=using):
                pks = list(
                    self._purgeable(cutoff, lease, using)
                    .order_by("expires_at")
                    .values_list("pk", flat=True)[:batch_size]
                )
                if not pks:
                    return
                deleted, _ = self._purgeable(cutoff, lease, using).filter(pk__in=pks).delete()
            batches += 1
            yield deleted
            if len(pks) < batch_size:
                return

    def delete_expired_pks(
        self,
        pks: list[int],
        *,
        now: datetime | None = None,
        using: str = "default",
        batch_size: int = 1000,
    ) -> int:
        """Delete those of ``pks`` that have expired (the admin's purge action).

        A key that is not expired (any more: a retry may have renewed it) is left
        alone, and so is one in progress under a live lease. Expiry is judged at
        ``now``, by default on the database's clock, and leases always are. Runs one
        short transaction per ``batch_size`` keys; returns how many rows were deleted.
        """
        cutoff = self._time(using, now)
        lease_cutoff = self._time(using, None, conf.LOCK_TIMEOUT)
        total = 0
        for start in range(0, len(pks), batch_size):
            chunk = pks[start : start + batch_size]
            with transaction.atomic(using=using):
                deleted, _ = (
                    self._purgeable(cutoff, lease_cutoff, using).filter(pk__in=chunk).delete()
                )
            total += deleted
        return total


# -- the hybrid strategy's outbox ----------------------------------------------------------


@dataclass(frozen=True)
class KeyRecord:
    """What the database knows about one (scope, key): a row of IdempotencyKey or of the
    outbox, read by :meth:`IdempotencyOutboxManager.lookup`."""

    source: str  # "outbox" or "key"
    pk: int
    status: str
    fingerprint: str
    expires_at: datetime
    response: StoredResponse | None = None
    claim_token: uuid.UUID | None = None
    locked_at: datetime | None = None

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED

    def ttl_seconds(self, now: datetime | None = None) -> float:
        """Seconds this record is still replayed, by this process's clock (the TTL of a
        Redis refill: a clock that is off shortens or lengthens that copy's life by as
        much, and the database record stays the authority)."""
        return max((self.expires_at - (now or timezone.now())).total_seconds(), 0.0)

    def is_stale(self, lock_timeout: float, now: datetime | None = None) -> bool:
        """An in-progress claim whose lease was not renewed for ``lock_timeout`` seconds,
        by this process's clock: for display only. Whether a lease may be taken over is
        decided on the database's clock (:meth:`IdempotencyKeyManager.claim`,
        :meth:`IdempotencyKeyManager.fence_stale_claim`)."""
        if self.status != IN_PROGRESS:
            return False
        cutoff = (now or timezone.now()) - timedelta(seconds=lock_timeout)
        return self.locked_at is None or self.locked_at <= cutoff


@dataclass(frozen=True)
class DrainResult:
    """One drain transaction: rows moved into IdempotencyKey, and expired rows dropped."""

    drained: int = 0
    discarded: int = 0
    #: Rows left for later: a short batch whose oldest row was younger than ``hold_partial``.
    held: int = 0

    @property
    def rows(self) -> int:
        return self.drained + self.discarded


#: What :meth:`IdempotencyOutboxManager.lookup` reads of an outbox row and of a key row.
OUTBOX_LOOKUP_COLUMNS = (
    "id",
    "fingerprint",
    "expires_at",
    "response_status",
    "response_headers",
    "response_body",
)
KEY_LOOKUP_COLUMNS = (
    "id",
    "status",
    "fingerprint",
    "expires_at",
    "claim_token",
    "locked_at",
    "response_status",
    "response_headers",
    "response_body",
)


class _EitherReader:
    """One statement for :meth:`IdempotencyOutboxManager.lookup`: the live outbox row of
    (scope, key), else its live IdempotencyKey row (``UNION ALL … ORDER BY 1 LIMIT 1``),
    converted as the ORM converts IdempotencyKey's columns."""

    def __init__(
        self,
        outbox: type[models.Model],
        keys: type[models.Model],
        connection: BaseDatabaseWrapper,
    ) -> None:
        q = connection.ops.quote_name
        key_fields = {f.name: f for f in keys._meta.concrete_fields}
        outbox_fields = {f.name: f for f in outbox._meta.concrete_fields}

        def column(fields: dict[str, Any], name: str) -> str:
            return q(str(fields[name].column))

        from_outbox = [
            column(outbox_fields, "id"),
            f"'{COMPLETED}'",
            column(outbox_fields, "fingerprint"),
            column(outbox_fields, "expires_at"),
            "NULL",
            "NULL",
            column(outbox_fields, "response_status"),
            column(outbox_fields, "response_headers"),
            column(outbox_fields, "response_body"),
        ]
        from_keys = [column(key_fields, name) for name in KEY_LOOKUP_COLUMNS]
        where = f"WHERE {q('scope')} = %s AND {q('key')} = %s AND {q('expires_at')} > %s"
        self.sql = (
            f"SELECT 0, {', '.join(from_outbox)} FROM {q(outbox._meta.db_table)} {where} "
            f"UNION ALL SELECT 1, {', '.join(from_keys)} FROM {q(keys._meta.db_table)} {where} "
            "ORDER BY 1 LIMIT 1"
        )
        self.expires_field = key_fields["expires_at"]
        self.converters: list[tuple[list[Any], Any]] = []
        for name in KEY_LOOKUP_COLUMNS:
            col = key_fields[name].get_col(keys._meta.db_table)
            self.converters.append(
                (connection.ops.get_db_converters(col) + col.get_db_converters(connection), col)
            )

    def fetch(
        self, connection: BaseDatabaseWrapper, scope: str, key: str, now: datetime
    ) -> tuple[bool, list[Any]] | None:
        """``(from_outbox, converted row in KEY_LOOKUP_COLUMNS order)`` or None."""
        at = self.expires_field.get_db_prep_value(now, connection, prepared=True)
        with connection.cursor() as cursor:
            cursor.execute(self.sql, [scope, key, at, scope, key, at])
            row = cursor.fetchone()
        if row is None:
            return None
        values = []
        for value, (converters, col) in zip(row[1:], self.converters, strict=True):
            for converter in converters:
                value = converter(value, col, connection)
            values.append(value)
        return int(row[0]) == 0, values


class IdempotencyOutboxManager(models.Manager["IdempotencyOutbox"]):
    """The outbox of the ``hybrid`` strategy: add a row, look a key up, drain in batches."""

    _add_sql: dict[tuple[str, str], tuple[str, list[models.Field[Any, Any]]]]
    _readers: dict[tuple[str, str], tuple[_RowReader, _RowReader]]

    def __init__(self) -> None:
        super().__init__()
        self._add_sql = {}
        self._readers = {}
        self._either: dict[tuple[str, str], _EitherReader] = {}

    def _lookup_readers(self, connection: BaseDatabaseWrapper) -> tuple[_RowReader, _RowReader]:
        """The outbox read and the IdempotencyKey read of :meth:`lookup`, built once."""
        cache_key = (connection.alias, connection.vendor)
        readers = self._readers.get(cache_key)
        if readers is None:
            from .models import IdempotencyKey

            readers = self._readers[cache_key] = (
                _RowReader(self.model, connection, OUTBOX_LOOKUP_COLUMNS, live_only=True),
                _RowReader(IdempotencyKey, connection, KEY_LOOKUP_COLUMNS, live_only=True),
            )
        return readers

    def _either_reader(self, connection: BaseDatabaseWrapper) -> _EitherReader:
        """The one-statement read of :meth:`lookup`, built once per backend."""
        cache_key = (connection.alias, connection.vendor)
        reader = self._either.get(cache_key)
        if reader is None:
            from .models import IdempotencyKey

            reader = self._either[cache_key] = _EitherReader(self.model, IdempotencyKey, connection)
        return reader

    def _add_statement(
        self, connection: BaseDatabaseWrapper
    ) -> tuple[str, list[models.Field[Any, Any]]]:
        cache_key = (connection.alias, connection.vendor)
        cached = self._add_sql.get(cache_key)
        if cached is not None:
            return cached
        q = connection.ops.quote_name
        opts = self.model._meta
        table = q(opts.db_table)
        fields: list[models.Field[Any, Any]] = [
            opts.get_field(name)  # type: ignore[misc]
            for name in (
                "scope",
                "key",
                "fingerprint",
                "request_method",
                "request_path",
                "response_status",
                "response_headers",
                "response_body",
                "created_at",
                "expires_at",
            )
        ]
        columns = [q(str(f.column)) for f in fields]
        updates = ", ".join(
            f"{column} = EXCLUDED.{column}"
            for column, f in zip(columns, fields, strict=True)
            if f.name not in {"scope", "key"}
        )
        # A live row for the key wins (the conflict leaves it and returns nothing); an
        # expired one that was never drained is replaced.
        statement = (
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))}) "
            f"ON CONFLICT ({q('scope')}, {q('key')}) DO UPDATE SET {updates} "
            f"WHERE {table}.{q('expires_at')} <= EXCLUDED.{q('created_at')} "
            f"RETURNING {q('id')}"
        )
        self._add_sql[cache_key] = (statement, fields)
        return statement, fields

    def add(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        response: StoredResponse,
        *,
        ttl: float,
        method: str = "",
        path: str = "",
        using: str = "default",
    ) -> bool:
        """Insert the completed response; False when a live row for (scope, key) exists.

        One ``INSERT … ON CONFLICT (scope, key) DO UPDATE … WHERE expired RETURNING``:
        when another transaction inserted the key and has not committed yet, this one
        waits for it, and then returns False if it committed. Run it in the view's
        transaction, so that the row commits together with the view's writes.
        """
        connection = connections[using]
        statement, fields = self._add_statement(connection)
        now = timezone.now()
        values = {
            "scope": scope,
            "key": key,
            "fingerprint": fingerprint,
            "request_method": method,
            "request_path": path,
            "response_status": response.status,
            "response_headers": response.headers,
            "response_body": response.body,
            "created_at": now,
            "expires_at": now + timedelta(seconds=ttl),
        }
        params = [f.get_db_prep_save(values[f.name], connection) for f in fields]
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchone() is not None

    def lookup(
        self, scope: str, key: str, *, using: str = "default", outbox_only: bool = False
    ) -> KeyRecord | None:
        """The live record of (scope, key): an undrained outbox row first (it is the newer
        one), else the IdempotencyKey row, in progress or completed. Expired rows count
        as absent. One statement (the outbox alone with ``outbox_only``); no write.
        """
        from .responses import StoredResponse

        connection = connections[using]
        now = timezone.now()
        if outbox_only:
            outbox_reader, _key_reader = self._lookup_readers(connection)
            row = outbox_reader.fetch(connection, scope, key, now)
            if row is None:
                return None
            pk, fingerprint, expires_at, status, headers, body = row
            return KeyRecord(
                source="outbox",
                pk=pk,
                status=COMPLETED,
                fingerprint=fingerprint,
                expires_at=expires_at,
                response=StoredResponse(
                    status=int(status), headers=dict(headers or {}), body=bytes(body or b"")
                ),
            )
        found = self._either_reader(connection).fetch(connection, scope, key, now)
        if found is None:
            return None
        from_outbox, key_row = found
        key_pk, state, key_print, key_expires, token, locked_at, code, key_headers, key_body = (
            key_row
        )
        response = None
        if state == COMPLETED and code is not None:
            response = StoredResponse(
                status=int(code), headers=dict(key_headers or {}), body=bytes(key_body or b"")
            )
        return KeyRecord(
            source="outbox" if from_outbox else "key",
            pk=key_pk,
            status=state,
            fingerprint=key_print,
            expires_at=key_expires,
            response=response,
            claim_token=token,
            locked_at=locked_at,
        )

    def drain(
        self,
        batch_size: int = 1000,
        *,
        using: str = "default",
        hold_partial: timedelta | None = None,
    ) -> DrainResult:
        """Move up to ``batch_size`` rows into IdempotencyKey, in one transaction.

        ``SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`` (on PostgreSQL; SQLite
        has one writer at a time and a plain SELECT) picks rows no other drainer holds;
        one ``INSERT … ON CONFLICT (scope, key) DO UPDATE`` writes them as completed
        keys with fresh claim tokens (which also fences out a ``db`` claim of the same
        key that is still running); one ``DELETE`` removes them. Expired rows are only
        deleted. A crash before the commit rolls all of it back, and running it again
        writes the same rows again: several drainers at once, or one run after a crash,
        neither lose nor duplicate a row.

        ``hold_partial``: a batch shorter than ``batch_size`` whose oldest row is younger
        than this is left alone (``held``), so that under load every transaction carries
        a full batch; a later drain takes it once it is old enough.
        """
        from .models import IdempotencyKey

        now = timezone.now()
        with transaction.atomic(using=using):
            rows = list(
                self.using(using)
                .select_for_update(skip_locked=True)
                .order_by("pk")
                .only(
                    "pk",
                    "scope",
                    "key",
                    "fingerprint",
                    "request_method",
                    "request_path",
                    "response_status",
                    "response_headers",
                    "response_body",
                    "created_at",
                    "expires_at",
                )[:batch_size]
            )
            if not rows:
                return DrainResult()
            if (
                hold_partial is not None
                and len(rows) < batch_size
                and min(row.created_at for row in rows) > now - hold_partial
            ):
                return DrainResult(held=len(rows))
            live = [row for row in rows if row.expires_at > now]
            if live:
                IdempotencyKey.objects.using(using).bulk_create(
                    [
                        IdempotencyKey(
                            scope=row.scope,
                            key=row.key,
                            fingerprint=row.fingerprint,
                            status=COMPLETED,
                            claim_token=uuid.uuid4(),
                            locked_at=None,
                            request_method=row.request_method,
                            request_path=row.request_path,
                            response_status=row.response_status,
                            response_headers=row.response_headers,
                            response_body=bytes(row.response_body or b""),
                            created_at=row.created_at,
                            completed_at=row.created_at,
                            expires_at=row.expires_at,
                        )
                        for row in live
                    ],
                    batch_size=batch_size,
                    update_conflicts=True,
                    unique_fields=["scope", "key"],
                    update_fields=[
                        "fingerprint",
                        "status",
                        "claim_token",
                        "locked_at",
                        "request_method",
                        "request_path",
                        "response_status",
                        "response_headers",
                        "response_body",
                        "created_at",
                        "completed_at",
                        "expires_at",
                    ],
                )
            self.using(using).filter(pk__in=[row.pk for row in rows]).delete()
        return DrainResult(drained=len(live), discarded=len(rows) - len(live))

    def pending(self, *, using: str = "default") -> int:
        """Rows waiting to be drained."""
        return self.using(using).count()
