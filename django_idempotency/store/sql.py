"""The compiled SQL behind the managers: every statement's text, built once per database.

Private. Composes the statements of IdempotencyKey and of the outbox from the models'
columns, takes times from the database's clock where it can (:func:`clock_in_sql`),
converts rows as the ORM does, and keeps one cache per connection (:func:`statements`).
What the statements do is told in docs/how-it-works.md and docs/hybrid.md.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, models
from django.utils import timezone

from .records import READ_COLUMNS, KeyRow
from .status import COMPLETED, IN_PROGRESS

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


def database(using: str | None, bound: str | None) -> str:
    """The alias a manager method runs on: ``using=``, else the one its manager or queryset
    is bound to (``.using()``, ``db_manager()``), else ``"default"``."""
    return using or bound or DEFAULT_DB_ALIAS


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

#: The columns of :attr:`Statements.store`.
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

#: The columns of :attr:`Statements.outbox_add`.
OUTBOX_ADD_COLUMNS = (
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


#: On PostgreSQL, the one-row subquery that the claim and the takeover join, so that the
#: transaction of their autocommit statement commits without waiting for its WAL flush
#: (``synchronous_commit = off`` for that transaction only, ``set_config(…, true)``): no
#: round trip of its own. The view's transaction, which commits after it, flushes the WAL up
#: to its own commit record, the claim's included; see docs/how-it-works.md.
ASYNC_COMMIT = " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"


def async_commit(connection: BaseDatabaseWrapper) -> str:
    """:data:`ASYNC_COMMIT` on PostgreSQL, nothing elsewhere (SQLite's statements are the
    same either way)."""
    return ASYNC_COMMIT if connection.vendor == "postgresql" else ""


#: Raised (as ``invalid_text_representation``) by a statement that commits its transaction
#: in the same round trip (:func:`and_commit`) when it stored nothing: the fenced write found
#: no row of its own, so the transaction must not commit. The marker names the cause in the
#: database server's log too.
NOT_STORED_MARKER = "django_idempotency: not stored, transaction not committed"


def and_commit(write: list[_Part], cte: list[_Part] | None = None) -> list[_Part]:
    """``write`` (a data-modifying statement with ``RETURNING``), then ``COMMIT``, as one
    simple-protocol query: one round trip where the store and Django's COMMIT took two.

    The write runs as a CTE whose rows are counted; when it returned none, the outer
    ``SELECT`` fails with :data:`NOT_STORED_MARKER` (the ``CASE`` evaluates the failing
    branch only then: it depends on the count, so the planner cannot fold it), which
    aborts the transaction and skips the ``COMMIT``. ``cte``: CTEs of ``write`` that must
    come first (a ``WITH`` cannot nest inside a data-modifying CTE).
    """
    return [
        "WITH ",
        *(cte or []),
        ", stored AS (" if cte else "stored AS (",
        *write,
        ") SELECT CASE WHEN count(*) > 0 THEN 1 ELSE "
        f"CAST('{NOT_STORED_MARKER}' || count(*) AS integer) END FROM stored; COMMIT",
    ]


def commits_in_statement(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` can send a statement and ``COMMIT`` as one query: PostgreSQL
    through psycopg 3 with client-side binding (Django's default), which sends a query
    over the simple protocol. Server-side binding (``OPTIONS["server_side_binding"]``)
    prepares it, and one prepared statement holds one command only; psycopg2 fetches the
    last result (the COMMIT's), not the write's."""
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    factory = getattr(connection.connection, "cursor_factory", None)
    client_cursor = _client_cursor()
    return (
        client_cursor is not None
        and isinstance(factory, type)
        and issubclass(factory, client_cursor)
    )


@functools.cache
def _client_cursor() -> type | None:
    """psycopg 3's ClientCursor, None without psycopg 3 (imported on first use only)."""
    try:
        from psycopg import ClientCursor
    except ImportError:  # psycopg2 only
        return None
    return ClientCursor


def not_stored(error: BaseException) -> bool:
    """Whether ``error`` is the refusal of an :func:`and_commit` statement that stored
    nothing (its transaction is aborted: roll it back)."""
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) == "22P02" and NOT_STORED_MARKER in str(cause)


class _Param:
    """A named parameter of a :class:`Statement`."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Now:
    """The current time in a :class:`Statement` (see :func:`clock_in_sql`), plus the
    number of seconds in parameter ``offset`` when given (negative for the past)."""

    __slots__ = ("offset",)

    def __init__(self, offset: str | None = None) -> None:
        self.offset = offset


_Part = str | _Param | _Now


def lapsed(locked: str, at: _Part) -> list[_Part]:
    """The lease rule in SQL: the lease in column ``locked`` was last renewed at or before
    ``at``, or never (:func:`~django_idempotency.store.records.lease_lapsed` in Python)."""
    return [f"({locked} IS NULL OR {locked} <= ", at, ")"]


class Statement:
    """One statement's text and the order of its named parameters, composed once per backend.

    A :class:`_Now` is ``statement_timestamp()`` in the SQL on PostgreSQL and a parameter
    from ``timezone.now()`` on SQLite, so that the same statement serves both.
    """

    __slots__ = ("_slots", "_time_field", "app_clock", "returns_rows", "sql")

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

    def execute(self, connection: BaseDatabaseWrapper, values: dict[str, Any]) -> Any:
        """Run the statement; returns its first row (None when it has none) and its row
        count."""
        with connection.cursor() as cursor:
            cursor.execute(self.sql, self.params(connection, values))
            return cursor.fetchone() if self.returns_rows else None, cursor.rowcount

    def store_and_commit(self, connection: BaseDatabaseWrapper, values: dict[str, Any]) -> bool:
        """Run a statement made with :func:`and_commit`: True when it stored and committed,
        False when it stored nothing (its transaction is then aborted, not committed)."""
        try:
            with connection.cursor() as cursor:
                cursor.execute(self.sql, self.params(connection, values))
        except DatabaseError as exc:
            if not_stored(exc):
                return False
            raise
        return True


def _joined(parts: list[_Part], separator: str = ", ") -> list[_Part]:
    joined: list[_Part] = []
    for index, part in enumerate(parts):
        if index:
            joined.append(separator)
        joined.append(part)
    return joined


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


class Statements:
    """The SQL of IdempotencyKey and of its outbox on one backend, built once.

    Parameters are adapted with the model's own fields, through
    ``get_db_prep_value(prepared=True)``: every value here is made by the managers and
    already has the field's Python type (a ``uuid.UUID``, a dict, bytes, str), so the
    generic ``get_prep_value`` step of ``get_db_prep_save`` would only repeat checks; the
    backend's adaptation (``connection.ops``) is still applied. Times come from the
    database's clock (:func:`clock_in_sql`).
    """

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        from ..models import IdempotencyKey, IdempotencyOutbox

        q = connection.ops.quote_name
        opts = IdempotencyKey._meta
        self.table = opts.db_table
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

        def statement(*parts: _Part) -> Statement:
            return Statement(connection, self.fields["expires_at"], *parts)

        status, locked, expires = col("status"), col("locked_at"), col("expires_at")
        self._purge: dict[tuple[bool, bool], Statement] = {}
        #: In progress under a lease older than ``lock_timeout`` (``stale`` = -lock_timeout).
        stale: list[_Part] = [f"{status} = '{IN_PROGRESS}' AND ", *lapsed(locked, _Now("stale"))]
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

        def outbox_live(now: _Part) -> list[_Part]:
            """The key's live outbox row: a response the hybrid strategy committed that is
            not drained yet. It settles the key whatever strategy is in use now."""
            return [
                f" FROM {outbox} WHERE {outbox_col('scope')} = ",
                _Param("scope"),
                f" AND {outbox_col('key')} = ",
                _Param("key"),
                f" AND {outbox_col('expires_at')} > ",
                now,
            ]

        fast = async_commit(connection)

        def claim(commit_mode: str) -> Statement:
            # One statement: a key settled in the outbox inserts nothing (on SQLite, INSERT
            # … SELECT … ON CONFLICT needs the SELECT's WHERE clause, which it has).
            return statement(
                f"INSERT INTO {table} ({', '.join(col(name) for name in CLAIM_COLUMNS)}) SELECT ",
                *_joined([stamped.get(name, _Param(name)) for name in CLAIM_COLUMNS]),
                commit_mode,
                " WHERE NOT EXISTS (SELECT 1",
                *outbox_live(_Now()),
                f") ON CONFLICT ({q('scope')}, {q('key')}) DO NOTHING RETURNING {q('id')}",
            )

        #: The claim in autocommit, the request path's: a transaction of its own, committed
        #: asynchronously on PostgreSQL (:data:`ASYNC_COMMIT`).
        self.claim = claim(fast)
        #: The claim inside a transaction (the lifecycle nested in an outer ``atomic``): the
        #: commit is the caller's, and keeps the caller's ``synchronous_commit``.
        self.claim_in_transaction = claim("") if fast else self.claim
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

        def key_row(*live: _Part) -> list[_Part]:
            return [
                f" FROM {table} WHERE {q('scope')} = ",
                _Param("scope"),
                f" AND {q('key')} = ",
                _Param("key"),
                *live,
                " ORDER BY 1 LIMIT 1",
            ]

        def outbox_then_key(*key_live: _Part) -> Statement:
            """The key's live outbox row, else its IdempotencyKey row: one statement."""
            return statement(
                f"SELECT 0, {from_outbox}",
                *outbox_live(_Now()),
                f" UNION ALL SELECT 1, {from_keys}",
                *key_row(*key_live),
            )

        self.read = outbox_then_key()
        #: The same, live rows only: an expired key row counts as absent (database clock).
        #: The hybrid strategy's lookup, and advisory_lock's read.
        self.read_live = outbox_then_key(f" AND {expires} > ", _Now())
        #: The loser's read, the same with whether the row may be taken over (decided in
        #: SQL, on the database's clock; never an outbox row).
        self.claim_read = statement(
            f"SELECT 0, {from_outbox}, FALSE",
            *outbox_live(_Now()),
            f" UNION ALL SELECT 1, {from_keys}, ",
            *takeover,
            *key_row(),
        )
        self.outbox_lookup = statement(f"SELECT 0, {from_outbox}", *outbox_live(_Now()))

        def take_over(commit_mode: str) -> Statement:
            return statement(
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
                commit_mode,
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

        #: The takeover of a stale or expired claim, committed on its own like the claim
        #: (asynchronously on PostgreSQL), and its form inside a transaction.
        self.take_over = take_over(fast)
        self.take_over_in_transaction = take_over("") if fast else self.take_over
        owner: list[_Part] = [
            f" WHERE {q('id')} = ",
            _Param("pk"),
            f" AND {col('claim_token')} = ",
            _Param("token"),
            f" AND {status} = '{IN_PROGRESS}'",
        ]
        complete: list[_Part] = [
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
        ]
        self.complete = statement(*complete)
        #: The completion and the COMMIT of the view's transaction in one round trip
        #: (PostgreSQL, :func:`commits_in_statement`); fails when the fence matched no row.
        self.complete_and_commit = statement(*and_commit([*complete, " RETURNING 1"]))
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
        store: list[_Part] = [
            f"INSERT INTO {table} ({', '.join(col(name) for name in STORE_COLUMNS)}) VALUES (",
            *_joined([stored.get(name, _Param(name)) for name in STORE_COLUMNS]),
            f") ON CONFLICT ({q('scope')}, {q('key')}) DO UPDATE SET {updates} "
            # Only over an expired record: never over one another execution completed.
            f"WHERE {table}.{expires} <= EXCLUDED.{q('created_at')} RETURNING {q('id')}",
        ]
        self.store = statement(*store)
        #: The same and the COMMIT (advisory_lock's completion, :func:`and_commit`).
        self.store_and_commit = statement(*and_commit(store))

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

        #: The hybrid strategy's outbox row, in the view's transaction. A live row for the
        #: key wins (the conflict leaves it and returns nothing); an expired one that was
        #: never drained is replaced. Its values are adapted with ``get_db_prep_save``.
        self.outbox_add_fields = [outbox_fields[name] for name in OUTBOX_ADD_COLUMNS]
        outbox_columns = [q(str(f.column)) for f in self.outbox_add_fields]
        outbox_updates = ", ".join(f"{column} = EXCLUDED.{column}" for column in outbox_columns[2:])
        self.outbox_add = statement(
            f"INSERT INTO {outbox} ({', '.join(outbox_columns)}) VALUES (",
            *_joined([_Param(name) for name in OUTBOX_ADD_COLUMNS]),
            f") ON CONFLICT ({q('scope')}, {q('key')}) DO UPDATE SET {outbox_updates} "
            f"WHERE {outbox}.{q('expires_at')} <= EXCLUDED.{q('created_at')} "
            f"RETURNING {q('id')}",
        )

        #: The hybrid strategy's commit guard folded into its outbox insert, on PostgreSQL:
        #: one statement that deletes a stale ``db`` claim of the key (fencing its owner
        #: out) and inserts the row only when IdempotencyKey has no live row for the key
        #: and any in-progress row it had was that stale claim, deleted here. The DELETE
        #: re-checks staleness on the row's newest version (a renewal or a takeover in
        #: between keeps it), which the ``fenced`` test then sees. None elsewhere, where
        #: ``outbox_add`` and ``fence_read``/``fence_delete`` run one after the other.
        self.outbox_add_fenced: Statement | None = None
        self.outbox_add_fenced_and_commit: Statement | None = None
        if connection.vendor == "postgresql":
            key_where: list[_Part] = [
                f" WHERE {q('scope')} = ",
                _Param("scope"),
                f" AND {q('key')} = ",
                _Param("key"),
            ]
            fence: list[_Part] = [
                f"fenced AS (DELETE FROM {table}",
                *key_where,
                " AND ",
                *stale,
                f" RETURNING 1), key_row AS (SELECT {status} AS status, ",
                *takeover,
                f" AS free FROM {table}",
                *key_where,
                ")",
            ]
            add_fenced: list[_Part] = [
                f"INSERT INTO {outbox} ({', '.join(outbox_columns)}) SELECT ",
                *_joined([_Param(name) for name in OUTBOX_ADD_COLUMNS]),
                " WHERE NOT EXISTS (SELECT 1 FROM key_row WHERE NOT key_row.free)",
                f" AND (NOT EXISTS (SELECT 1 FROM key_row WHERE key_row.status = '{IN_PROGRESS}')",
                " OR EXISTS (SELECT 1 FROM fenced))",
                f" ON CONFLICT ({q('scope')}, {q('key')}) DO UPDATE SET {outbox_updates} "
                f"WHERE {outbox}.{q('expires_at')} <= EXCLUDED.{q('created_at')} "
                f"RETURNING {q('id')}",
            ]
            self.outbox_add_fenced = statement("WITH ", *fence, " ", *add_fenced)
            #: The same and the COMMIT of the view's transaction (:func:`and_commit`).
            self.outbox_add_fenced_and_commit = statement(*and_commit(add_fenced, cte=fence))

        self.read_converters = _converters(IdempotencyKey, connection, READ_COLUMNS)

    def prep(self, name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
        """``value`` (already of field ``name``'s Python type) as the backend takes it."""
        return self.fields[name].get_db_prep_value(value, connection, prepared=True)

    def key_row(self, connection: BaseDatabaseWrapper, found: Any) -> KeyRow:
        """The :class:`KeyRow` of a row of :attr:`read` (or ``claim_read``, ``lookup``,
        ``outbox_lookup``), converted as the ORM converts IdempotencyKey's columns."""
        values = []
        for value, (functions, col) in zip(found[1:], self.read_converters, strict=False):
            for function in functions:
                value = function(value, col, connection)
            values.append(value)
        values.append(int(found[0]) == 0)  # from_outbox
        return KeyRow(*values)

    def purge_batch(
        self, connection: BaseDatabaseWrapper, *, cutoff: bool, lease_cutoff: bool
    ) -> Statement:
        """One batch of the purge: ``DELETE … WHERE <purgeable> AND id IN (SELECT id …
        WHERE <purgeable> ORDER BY expires_at LIMIT n)``.

        Purgeable: expired at ``cutoff`` (a parameter, when given; else the database's now
        plus ``older``) and not in progress under a live lease (renewed after parameter
        ``lease_cutoff`` when given; else after the database's now plus ``lease``).
        """
        built = self._purge.get((cutoff, lease_cutoff))
        if built is not None:
            return built
        q = connection.ops.quote_name
        table = q(self.table)
        pk, expires, status, locked = q("id"), q("expires_at"), q("status"), q("locked_at")
        expired_at: _Part = _Param("cutoff") if cutoff else _Now("older")
        lease_at: _Part = _Param("lease_cutoff") if lease_cutoff else _Now("lease")
        purgeable: list[_Part] = [
            f"{expires} <= ",
            expired_at,
            f" AND ({status} <> '{IN_PROGRESS}' OR ",
            *lapsed(locked, lease_at),
            ")",
        ]
        # The outer condition is checked again on the row version the DELETE locks: a key
        # that a request took over (renewed) after the subquery read it is not deleted.
        built = self._purge[(cutoff, lease_cutoff)] = Statement(
            connection,
            self.fields["expires_at"],
            f"DELETE FROM {table} WHERE ",
            *purgeable,
            f" AND {pk} IN (SELECT {pk} FROM {table} WHERE ",
            *purgeable,
            f" ORDER BY {expires} LIMIT ",
            _Param("limit"),
            ")",
        )
        return built


_statements: dict[tuple[str, str], Statements] = {}


def statements(connection: BaseDatabaseWrapper) -> Statements:
    """The :class:`Statements` of ``connection``'s database, built on first use."""
    cache_key = (connection.alias, connection.vendor)
    built = _statements.get(cache_key)
    if built is None:
        built = _statements[cache_key] = Statements(connection)
    return built
