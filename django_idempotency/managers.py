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
from django.utils import timezone

from .conf import conf

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .models import (
        IdempotencyKey,  # noqa: F401 - named in a string annotation
        IdempotencyOutbox,  # noqa: F401 - named in a string annotation
    )
    from .responses import StoredResponse

IN_PROGRESS = "in_progress"
COMPLETED = "completed"


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


#: The columns of the claim's INSERT, in the order of :meth:`_Statements.claim_params`.
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

#: The columns of :attr:`_Statements.store`, in the order of :meth:`_Statements.store_params`.
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
    """One IdempotencyKey row as :meth:`IdempotencyKeyManager.read` returns it."""

    pk: int
    fingerprint: str
    status: str
    claim_token: uuid.UUID
    locked_at: datetime | None
    expires_at: datetime
    response_status: int | None
    response_headers: dict[str, str] | None
    response_body: bytes | None


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
        # What SQLCompiler.get_converters() gives the ORM for each column: the backend's
        # converters, then the field's from_db_value.
        self.converters: list[tuple[list[Any], Any]] = []
        for name in columns:
            col = fields[name].get_col(opts.db_table)
            converters = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            self.converters.append((converters, col))

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
        values = []
        for value, (converters, col) in zip(row, self.converters, strict=True):
            for converter in converters:
                value = converter(value, col, connection)
            values.append(value)
        return values


class _Statements:
    """SQL for one table on one backend, built once, and the parameters that go with it.

    The parameters are adapted with the model's own fields, through
    ``get_db_prep_value(prepared=True)``: every value here is made by this module
    and already has the field's Python type (an aware datetime from
    ``timezone.now()``, a ``uuid.UUID``, a dict, bytes, str), so the generic
    ``get_prep_value`` step of ``get_db_prep_save`` would only repeat checks; the
    backend's adaptation (``connection.ops``) is still applied.
    """

    def __init__(self, model: type[models.Model], connection: BaseDatabaseWrapper) -> None:
        q = connection.ops.quote_name
        opts = model._meta
        table = q(opts.db_table)
        self.fields: dict[str, models.Field[Any, Any]] = {}
        for field in opts.concrete_fields:
            self.fields[field.name] = field
        columns = ", ".join(q(str(self.fields[name].column)) for name in CLAIM_COLUMNS)
        marks = ", ".join(["%s"] * len(CLAIM_COLUMNS))
        self.claim = (
            f"INSERT INTO {table} ({columns}) VALUES ({marks}) "
            f"ON CONFLICT ({q('scope')}, {q('key')}) DO NOTHING RETURNING {q('id')}"
        )
        self.complete = (
            f"UPDATE {table} SET {q('status')} = %s, {q('response_status')} = %s, "
            f"{q('response_headers')} = %s, {q('response_body')} = %s, "
            f"{q('completed_at')} = %s, {q('locked_at')} = NULL, {q('expires_at')} = %s "
            f"WHERE {q('id')} = %s AND {q('claim_token')} = %s AND {q('status')} = %s"
        )
        self.renew = (
            f"UPDATE {table} SET {q('locked_at')} = %s "
            f"WHERE {q('id')} = %s AND {q('claim_token')} = %s AND {q('status')} = %s"
        )
        self.release = (
            f"DELETE FROM {table} "
            f"WHERE {q('id')} = %s AND {q('claim_token')} = %s AND {q('status')} = %s"
        )

        store_columns = ", ".join(q(str(self.fields[name].column)) for name in STORE_COLUMNS)
        updates = ", ".join(
            f"{q(str(self.fields[name].column))} = EXCLUDED.{q(str(self.fields[name].column))}"
            for name in STORE_COLUMNS[2:]
        )
        self.store = (
            f"INSERT INTO {table} ({store_columns}) "
            f"VALUES ({', '.join(['%s'] * len(STORE_COLUMNS))}) "
            f"ON CONFLICT ({q('scope')}, {q('key')}) DO UPDATE SET {updates} "
            # Only over an expired record: never over one another execution completed.
            f"WHERE {table}.{q('expires_at')} <= EXCLUDED.{q('created_at')} "
            f"RETURNING {q('id')}"
        )

        self.reader = _RowReader(model, connection, READ_COLUMNS)

    def prep(self, name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
        """``value`` (already of field ``name``'s Python type) as the backend takes it."""
        return self.fields[name].get_db_prep_value(value, connection, prepared=True)

    def claim_params(
        self,
        connection: BaseDatabaseWrapper,
        *,
        scope: str,
        key: str,
        fingerprint: str,
        token: uuid.UUID,
        now: datetime,
        expires_at: datetime,
        method: str,
        path: str,
    ) -> list[Any]:
        """The parameters of :attr:`claim`, in :data:`CLAIM_COLUMNS` order."""
        at = self.prep("created_at", now, connection)  # locked_at and created_at alike
        return [
            scope,
            key,
            fingerprint,
            IN_PROGRESS,
            self.prep("claim_token", token, connection),
            at,
            method,
            path,
            self.prep("response_headers", {}, connection),
            at,
            self.prep("expires_at", expires_at, connection),
        ]

    def store_params(
        self,
        connection: BaseDatabaseWrapper,
        *,
        scope: str,
        key: str,
        fingerprint: str,
        response: StoredResponse,
        now: datetime,
        expires_at: datetime,
        method: str,
        path: str,
    ) -> list[Any]:
        """The parameters of :attr:`store`, in :data:`STORE_COLUMNS` order."""
        at = self.prep("created_at", now, connection)  # created_at and completed_at alike
        return [
            scope,
            key,
            fingerprint,
            COMPLETED,
            self.prep("claim_token", uuid.uuid4(), connection),
            None,
            method,
            path,
            response.status,
            self.prep("response_headers", response.headers, connection),
            self.prep("response_body", response.body, connection),
            at,
            at,
            self.prep("expires_at", expires_at, connection),
        ]

    def owner_params(self, connection: BaseDatabaseWrapper, pk: int, token: uuid.UUID) -> list[Any]:
        """The WHERE parameters shared by renew, complete and release."""
        return [pk, self.prep("claim_token", token, connection), IN_PROGRESS]


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
        may pass while a heartbeat keeps the lease alive.
        """
        connection = connections[using]
        sql = self._sql(connection)
        for _attempt in range(5):
            now = timezone.now()
            token = uuid.uuid4()
            params = sql.claim_params(
                connection,
                scope=scope,
                key=key,
                fingerprint=fingerprint,
                token=token,
                now=now,
                expires_at=now + timedelta(seconds=ttl),
                method=method,
                path=path,
            )
            with connection.cursor() as cursor:
                cursor.execute(sql.claim, params)
                row = cursor.fetchone()
            if row is not None:
                return ClaimResult(ClaimState.CLAIMED, pk=int(row[0]), token=token)

            existing = self.read(scope, key, using=using)
            if existing is None:
                continue  # released or purged between the two statements: claim again
            pk, stored_print, status, old_token, locked_at, expires_at = existing[:6]
            now = timezone.now()
            stale = status == IN_PROGRESS and (
                locked_at is None or locked_at <= now - timedelta(seconds=lock_timeout)
            )
            expired = status == COMPLETED and expires_at <= now
            if expired or stale:
                if self._take_over(
                    pk,
                    old_token,
                    token,
                    fingerprint,
                    now,
                    ttl=ttl,
                    lock_timeout=lock_timeout,
                    method=method,
                    path=path,
                    using=using,
                ):
                    return ClaimResult(ClaimState.CLAIMED, pk=pk, token=token, taken_over=True)
                continue  # someone else moved first: read again
            if stored_print != fingerprint:
                return ClaimResult(ClaimState.MISMATCH, pk=pk)
            if status == IN_PROGRESS:
                return ClaimResult(ClaimState.IN_PROGRESS, pk=pk)
            from .responses import StoredResponse

            response_status, headers, body = existing[6:]
            return ClaimResult(
                ClaimState.COMPLETED,
                pk=pk,
                response=StoredResponse(
                    status=int(response_status or 0),
                    headers=dict(headers or {}),
                    body=bytes(body or b""),
                ),
            )
        # The row kept changing under us (released, purged or taken over each time):
        # the key is busy, and the client is told to retry.
        return ClaimResult(ClaimState.IN_PROGRESS)

    def read(self, scope: str, key: str, *, using: str = "default") -> KeyRow | None:
        """The row of ``(scope, key)``, or None: one SELECT whose text is built once, no ORM query
        to compile per call (the values are converted as the ORM converts them)."""
        connection = connections[using]
        row = self._sql(connection).reader.fetch(connection, scope, key)
        return None if row is None else KeyRow(*row)

    def _take_over(
        self,
        pk: int,
        old_token: uuid.UUID,
        token: uuid.UUID,
        fingerprint: str,
        now: datetime,
        *,
        ttl: float,
        lock_timeout: float,
        method: str,
        path: str,
        using: str,
    ) -> bool:
        """Replace a stale or expired claim, only if its token is still ``old_token``
        and it is *still* stale or expired.

        The token alone is not enough: it does not change when the owner renews or
        completes, so an owner that was slow rather than dead could otherwise lose a
        renewed lease, or a stored response, to a claimant that read the row just before.
        """
        stale_before = now - timedelta(seconds=lock_timeout)
        updated = (
            self.using(using)
            .filter(pk=pk, claim_token=old_token)
            .filter(
                models.Q(status=COMPLETED, expires_at__lte=now)
                | models.Q(status=IN_PROGRESS, locked_at__isnull=True)
                | models.Q(status=IN_PROGRESS, locked_at__lte=stale_before)
            )
            .update(
                claim_token=token,
                fingerprint=fingerprint,
                status=IN_PROGRESS,
                locked_at=now,
                request_method=method,
                request_path=path,
                response_status=None,
                response_headers={},
                response_body=None,
                created_at=now,
                completed_at=None,
                expires_at=now + timedelta(seconds=ttl),
            )
        )
        return updated == 1

    # -- the owner's statements ------------------------------------------------------------

    def _owner_update(
        self, connection: BaseDatabaseWrapper, statement: str, params: list[Any]
    ) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return bool(cursor.rowcount == 1)

    def renew(self, pk: int, token: uuid.UUID, *, using: str = "default") -> bool:
        """Extend the lease; False when the claim was taken over or is gone."""
        connection = connections[using]
        sql = self._sql(connection)
        return self._owner_update(
            connection,
            sql.renew,
            [
                sql.prep("locked_at", timezone.now(), connection),
                *sql.owner_params(connection, pk, token),
            ],
        )

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
        now = timezone.now()
        return self._owner_update(
            connection,
            sql.complete,
            [
                COMPLETED,
                response.status,
                sql.prep("response_headers", response.headers, connection),
                sql.prep("response_body", response.body, connection),
                sql.prep("completed_at", now, connection),
                sql.prep("expires_at", now + timedelta(seconds=ttl), connection),
                *sql.owner_params(connection, pk, token),
            ],
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
        now = timezone.now()
        params = sql.store_params(
            connection,
            scope=scope,
            key=key,
            fingerprint=fingerprint,
            response=response,
            now=now,
            expires_at=now + timedelta(seconds=ttl),
            method=method,
            path=path,
        )
        with connection.cursor() as cursor:
            cursor.execute(sql.store, params)
            return cursor.fetchone() is not None

    def release(self, pk: int, token: uuid.UUID, *, using: str = "default") -> bool:
        """Delete an in-progress claim so the client may retry; only for its own token."""
        connection = connections[using]
        sql = self._sql(connection)
        return self._owner_update(connection, sql.release, sql.owner_params(connection, pk, token))

    # -- operations ------------------------------------------------------------------------

    def release_stuck(self, pks: list[int] | None = None, *, using: str = "default") -> int:
        """Release in-progress keys by hand (the admin action); returns how many."""
        queryset = self.using(using).filter(status=IN_PROGRESS)
        if pks is not None:
            queryset = queryset.filter(pk__in=pks)
        deleted, _ = queryset.delete()
        return deleted

    def expired(self, *, now: datetime | None = None, using: str = "default") -> Any:
        return self.using(using).filter(expires_at__lte=now or timezone.now())

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

        ``older_than`` keeps keys that expired less than that long ago. Returns the
        number of rows deleted.
        """
        cutoff = now or timezone.now()
        if older_than is not None:
            cutoff -= older_than
        total = 0
        for _count in self.iter_delete_expired(
            batch_size=batch_size, cutoff=cutoff, using=using, max_batches=max_batches
        ):
            total += _count
        return total

    def iter_delete_expired(
        self,
        *,
        batch_size: int,
        cutoff: datetime,
        using: str = "default",
        max_batches: int | None = None,
        lease_cutoff: datetime | None = None,
    ) -> Any:
        """Yield the number of rows deleted by each batch (for progress reporting).

        A key still in progress under a live lease (renewed after ``lease_cutoff``,
        by default ``LOCK_TIMEOUT`` ago) is never deleted, however old it is: its
        request is running and will complete it.

        On PostgreSQL and SQLite each batch is one statement in its own short
        transaction, ``DELETE … WHERE expires_at <= cutoff AND id IN (SELECT id …
        WHERE expires_at <= cutoff ORDER BY expires_at LIMIT n)``: one round trip, and
        faster than reading the ids first and deleting them in a second statement
        (``benchmarks/purge.py`` measures both). No ``pre_delete``/``post_delete``
        signals are sent for the purged rows.
        """
        connection = connections[using]
        lease_cutoff = lease_cutoff or self._lease_cutoff()
        if connection.vendor not in {"postgresql", "sqlite"}:
            yield from self._iter_delete_expired_orm(
                batch_size, cutoff, using, max_batches, lease_cutoff
            )
            return
        q = connection.ops.quote_name
        table = q(self.model._meta.db_table)
        pk, expires, status, locked = q("id"), q("expires_at"), q("status"), q("locked_at")
        purgeable = f"{expires} <= %s AND ({status} <> %s OR {locked} IS NULL OR {locked} <= %s)"
        # The outer condition is checked again on the row version the DELETE locks: a key
        # that a request took over (renewed) after the subquery read it is not deleted.
        statement = (
            f"DELETE FROM {table} WHERE {purgeable} AND {pk} IN (SELECT {pk} FROM {table} "
            f"WHERE {purgeable} ORDER BY {expires} LIMIT %s)"
        )
        condition = [
            self._sql(connection).prep("expires_at", cutoff, connection),
            IN_PROGRESS,
            self._sql(connection).prep("locked_at", lease_cutoff, connection),
        ]
        params = [*condition, *condition, int(batch_size)]
        batches = 0
        while max_batches is None or batches < max_batches:
            with transaction.atomic(using=using), connection.cursor() as cursor:
                cursor.execute(statement, params)
                deleted = cursor.rowcount
            if deleted <= 0:
                return
            batches += 1
            yield deleted
            if deleted < batch_size:
                return

    @staticmethod
    def _lease_cutoff() -> datetime:
        return timezone.now() - timedelta(seconds=conf.LOCK_TIMEOUT)

    def _purgeable(self, cutoff: datetime, lease_cutoff: datetime, using: str) -> Any:
        """Expired keys, less those in progress under a live lease."""
        return (
            self.using(using)
            .filter(expires_at__lte=cutoff)
            .exclude(status=IN_PROGRESS, locked_at__gt=lease_cutoff)
        )

    def _iter_delete_expired_orm(
        self,
        batch_size: int,
        cutoff: datetime,
        using: str,
        max_batches: int | None,
        lease_cutoff: datetime | None = None,
    ) -> Any:
        """The same through the ORM, for other databases."""
        lease_cutoff = lease_cutoff or self._lease_cutoff()
        batches = 0
        while max_batches is None or batches < max_batches:
            with transaction.atomic(using=using):
                pks = list(
                    self._purgeable(cutoff, lease_cutoff, using)
                    .order_by("expires_at")
                    .values_list("pk", flat=True)[:batch_size]
                )
                if not pks:
                    return
                deleted, _ = (
                    self._purgeable(cutoff, lease_cutoff, using).filter(pk__in=pks).delete()
                )
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
        alone. Runs one short transaction per ``batch_size`` keys; returns how many
        rows were deleted.
        """
        cutoff = now or timezone.now()
        lease_cutoff = self._lease_cutoff()
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
        """Seconds this record is still replayed."""
        return max((self.expires_at - (now or timezone.now())).total_seconds(), 0.0)

    def is_stale(self, lock_timeout: float, now: datetime | None = None) -> bool:
        """An in-progress claim whose lease was not renewed for ``lock_timeout`` seconds."""
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
