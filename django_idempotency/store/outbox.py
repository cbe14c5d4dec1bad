"""``IdempotencyOutbox.objects``: the ``hybrid`` strategy's outbox (see docs/hybrid.md).

Add a completed response in the view's transaction, look a key up in the outbox and in
IdempotencyKey with one statement, and drain rows into IdempotencyKey in batches. The
methods are listed in docs/api.md ("The model and its manager").
"""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import NotSupportedError, OperationalError, connections, models, transaction

from .clock import database_now, database_time
from .errors import is_transient
from .records import DrainResult, KeyRecord
from .sql.completed import STORE_COLUMNS
from .sql.outbox import OUTBOX_ADD_COLUMNS
from .sql.statement import Statement
from .sql.statements import database, statements
from .status import COMPLETED

if TYPE_CHECKING:
    from ..values.response import StoredResponse

#: How many times a drain transaction is taken again after a deadlock or a lock timeout.
DRAIN_ATTEMPTS = 5


#: The manager's model: IdempotencyOutbox (named by the models module, not imported here).
_Outbox = TypeVar("_Outbox", bound=models.Model)


class IdempotencyOutboxManager(models.Manager[_Outbox]):
    """The outbox of the ``hybrid`` strategy: add a row, look a key up, drain in batches.

    Each method runs on the database of ``using=`` when given, else of the manager
    (``db_manager()``), else on ``"default"``.
    """

    def _keys(self) -> Any:
        """IdempotencyKey, where the outbox drains to: the model of the same app as
        ``self.model``, from the app registry (the store does not import the models)."""
        return self.model._meta.apps.get_model(self.model._meta.app_label, "IdempotencyKey")

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
        fence_lock_timeout: float | None = None,
        commit: bool = False,
        using: str | None = None,
    ) -> bool:
        """Insert the completed response; False when a live row for (scope, key) exists.

        One ``INSERT … ON CONFLICT (scope, key) DO UPDATE … WHERE expired RETURNING``:
        when another transaction inserted the key and has not committed yet, this one
        waits for it, and then returns False if it committed. Run it in the view's
        transaction, so that the row commits together with the view's writes.

        With ``fence_lock_timeout`` (the ``hybrid`` strategy's commit guard), also False
        when IdempotencyKey has a live row for the key: a live claim or completed row
        refuses the insert, and a ``db`` claim whose lease is older than
        ``fence_lock_timeout`` (on the database's clock) is deleted, which fences its
        owner out (its ``complete`` finds no row). One statement on PostgreSQL (the fence
        in a ``DELETE`` CTE of an ``INSERT … SELECT``);
        ``IdempotencyKey.objects.fence_stale_claim`` first, elsewhere.

        ``commit`` (with ``fence_lock_timeout``, on PostgreSQL): the statement also
        commits the current transaction in the same round trip, as
        ``IdempotencyKey.objects.complete(commit=True)`` does; False: nothing committed,
        the transaction is aborted.
        """
        connection = connections[database(using, self._db)]
        sql = statements(connection)
        statement = sql.outbox_add
        if statement is None:
            raise NotSupportedError(
                f"the outbox needs INSERT … ON CONFLICT … DO UPDATE … WHERE, which "
                f"{connection.vendor} does not have (the hybrid strategy's: PostgreSQL, SQLite)"
            )
        if commit:
            if fence_lock_timeout is None or sql.outbox_add_fenced_and_commit is None:
                raise ValueError("commit=True needs fence_lock_timeout and PostgreSQL")
            statement = sql.outbox_add_fenced_and_commit
        elif fence_lock_timeout is not None:
            if sql.outbox_add_fenced is None:
                if not self._keys().objects.fence_stale_claim(
                    scope, key, fence_lock_timeout, using=connection.alias
                ):
                    return False
            else:
                statement = sql.outbox_add_fenced
        values: dict[str, Any] = {
            "scope": scope,
            "key": key,
            "fingerprint": fingerprint,
            "request_method": method,
            "request_path": path,
            "response_status": response.status,
            "response_headers": response.headers,
            "response_body": response.body,
        }
        for field in sql.outbox_add_fields:
            values[field.name] = field.get_db_prep_save(values[field.name], connection)
        values["ttl"] = float(ttl)  # from the database's now, as every expiry
        if fence_lock_timeout is not None:
            values["stale"] = -float(fence_lock_timeout)
        if commit:
            return statement.store_and_commit(connection, values)
        row, _count = statement.execute(connection, values)
        return row is not None

    def lookup(
        self, scope: str, key: str, *, using: str | None = None, outbox_only: bool = False
    ) -> KeyRecord | None:
        """The live record of (scope, key): an undrained outbox row first (it is the newer
        one), else the IdempotencyKey row, in progress or completed. Expired rows count
        as absent, judged on the database's clock, which also says when the record was
        read (``KeyRecord.read_at``). One statement (the outbox alone with
        ``outbox_only``); no write.
        """
        connection = connections[database(using, self._db)]
        sql = statements(connection)
        statement = sql.outbox_lookup if outbox_only else sql.read_live
        found, _count = statement.execute(connection, {"scope": scope, "key": key})
        if found is None:
            return None
        # The last column is the database's now (the app's on SQLite, which is the same).
        read_at = database_time(found[-1]) if sql.dialect.clock_in_sql else None
        return KeyRecord.from_row(sql.key_row(connection, found), read_at)

    def drain(
        self,
        batch_size: int = 1000,
        *,
        using: str | None = None,
        hold_partial: timedelta | None = None,
    ) -> DrainResult:
        """Move up to ``batch_size`` rows into IdempotencyKey, in one transaction.

        On PostgreSQL the batch is one statement
        (:func:`~django_idempotency.store.sql.drain.drain_batch`): the same steps as
        below in data-modifying CTEs, no row passing through the client, expiry judged on
        the database's clock. Elsewhere, through the ORM: ``SELECT … ORDER BY id LIMIT n
        FOR UPDATE SKIP LOCKED`` (on MariaDB 10.6+ and MySQL; MariaDB 10.5 waits for the
        rows another drainer holds instead; SQLite has one writer at a time and a plain
        SELECT) picks rows no other drainer holds; one ``INSERT … ON CONFLICT (scope,
        key) DO UPDATE`` (``ON DUPLICATE KEY UPDATE`` on MySQL and MariaDB) writes them as
        completed keys with fresh claim tokens (which also fences out a ``db`` claim of the
        same key that is still running); one ``DELETE`` removes them. Expired rows are
        only deleted; expiry and ``hold_partial`` are judged on the database's clock (read
        once per transaction there: ``UTC_TIMESTAMP(6)``), never the app server's. A crash
        before the commit rolls all of it back, and running it again writes the same rows
        again: several drainers at once, or one run after a crash, neither lose nor
        duplicate a row.

        ``hold_partial``: a batch shorter than ``batch_size`` whose oldest row is younger
        than this is left alone (``held``), so that under load every transaction carries
        a full batch; a later drain takes it once it is old enough.

        A deadlock or a lock wait timeout (InnoDB's gap locks between two drainers) rolls
        the transaction back whole, and it is taken again, up to :data:`DRAIN_ATTEMPTS`
        times.
        """
        alias = database(using, self._db)
        for attempt in range(DRAIN_ATTEMPTS):
            try:
                return self._drain_once(alias, batch_size, hold_partial)
            except OperationalError as exc:
                # InnoDB's gap locks can deadlock two drainers whose batches' keys are
                # neighbours in the unique index: the batch rolled back whole, take it again.
                if attempt == DRAIN_ATTEMPTS - 1 or not is_transient(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _drain_once(
        self, alias: str, batch_size: int, hold_partial: timedelta | None
    ) -> DrainResult:
        """One transaction of :meth:`drain`: one statement where the dialect has it
        (:mod:`~django_idempotency.store.sql.drain`, PostgreSQL), else the ORM's three."""
        connection = connections[alias]
        sql = statements(connection)
        statement = sql.drain_batch if hold_partial is None else sql.drain_batch_hold
        if statement is None:
            return self._drain_orm(alias, batch_size, hold_partial)
        values: dict[str, Any] = {"limit": int(batch_size)}
        if hold_partial is not None:
            values["hold"] = -hold_partial.total_seconds()
        # In autocommit the statement is its own transaction; in the caller's, a savepoint
        # of its own, so that a retry after a deadlock starts from there.
        inside: Any = (
            transaction.atomic(using=alias) if connection.in_atomic_block else nullcontext()
        )
        with inside:
            if sql.drain_move is not None:
                return self._drain_locked(connection, statement, sql.drain_move, values)
            (taken, moved, stored), _count = statement.execute(connection, values, bound=False)
        if moved < taken:
            return DrainResult(held=taken)
        return DrainResult(drained=stored, discarded=moved - stored)

    @staticmethod
    def _drain_locked(
        connection: Any, lock: Statement, move: Statement, values: dict[str, Any]
    ) -> DrainResult:
        """One batch on a key table partitioned by expiry: the batch and its keys' locks,
        then the move (:func:`~django_idempotency.store.sql.drain.move_locked`), in one
        transaction."""
        with transaction.atomic(using=connection.alias, savepoint=False):
            (taken, ids), _count = lock.execute(connection, values, bound=False)
            if not ids:
                return DrainResult(held=taken)
            (moved, stored), _count = move.execute(connection, {"ids": list(ids)}, bound=False)
        return DrainResult(drained=stored, discarded=moved - stored)

    def _drain_orm(
        self, alias: str, batch_size: int, hold_partial: timedelta | None
    ) -> DrainResult:
        """One transaction of :meth:`drain` through the ORM: the batch read, its live rows
        written as keys (``bulk_create``), the batch deleted."""
        features = connections[alias].features
        with transaction.atomic(using=alias):
            now = database_now(connections[alias])  # the statements' clock, not the app's
            rows: list[Any] = list(
                self.using(alias)
                .select_for_update(skip_locked=features.has_select_for_update_skip_locked)
                .order_by("pk")
                .only("pk", *OUTBOX_ADD_COLUMNS)[:batch_size]
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
                self._store_completed(alias, live, batch_size)
            self.using(alias).filter(pk__in=[row.pk for row in rows]).delete()
        return DrainResult(drained=len(live), discarded=len(rows) - len(live))

    def _store_completed(self, alias: str, live: list[Any], batch_size: int) -> None:
        """The outbox rows ``live`` written as completed keys, over any row of their keys:
        ``INSERT … ON CONFLICT (scope, key) DO UPDATE`` (MySQL's ``ON DUPLICATE KEY
        UPDATE`` names no target: the unique (scope, key) is the one it can meet)."""
        keys = self._keys()
        features = connections[alias].features
        keys.objects.using(alias).bulk_create(
            [
                keys(
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
            unique_fields=(
                ["scope", "key"] if features.supports_update_conflicts_with_target else None
            ),
            # The columns of a stored key, less the conflict target (scope, key).
            update_fields=list(STORE_COLUMNS[2:]),
        )

    def pending(self, *, using: str | None = None) -> int:
        """Rows waiting to be drained."""
        return self.using(database(using, self._db)).count()
